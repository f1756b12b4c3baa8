#!/usr/bin/python3
"""`moex-hub serve` against hostile and careless HTTP clients (the round-2
defects; each scenario failed on the tree before them):

- body_then_more: a POST whose body arrives in one write with more bytes
  after it (a CRLF, a pipelined GET) starts one generation, answers it and
  keeps the server up (it used to start one job per repeat of the body's end
  and write to the freed request);
- key_on_headers: a wrong API key is refused on the headers, before the body
  is read, and its connection closed (the server used to buffer the body
  first); 4xx answers are logged at a bounded rate;
- framing: Content-Length with Transfer-Encoding, a JSON value with bytes
  after it: 400; an HTTP/2 upgrade (h2c) on the API, the status and the
  weights paths: a 505 JSON error, no 101;
- json_everywhere: unknown paths, wrong methods, /v1/embeddings: OpenAI's
  error JSON, valid UTF-8 even when the request's model name is not;
- weights_credential: --local serves no expert weights; a distributed serve
  serves them to the workers' token only (not to the API key, not to anyone);
- health: 503 with the reason while waiting for workers and while some
  expert has no live worker under --no-local-fallback, 200 once one has
  joined; SIGTERM during the wait stops the server at once;
- names: a worker whose name is invalid UTF-8 and 255 bytes long keeps
  /status.json and /metrics valid, and its name whole;
- sampled_concurrent: concurrent seeded requests at temperature 0.8 each
  equal the same request alone.

usage: test_api_hostile.py BIN_DIR VOCAB_DIR WORK_DIR [scenario ...]
"""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ["MOEX_LOG"] = "info"   # the log-rate checks count info lines
from apilib import Serve, error_of, parse_prometheus, request  # noqa: E402
from distlib import check, finish_script, free_port, gen_model, scenario, setup, stops_within  # noqa: E402

setup(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
import distlib  # noqa: E402  (setup filled in its BIN and WORK)
import fakepeer as fp  # noqa: E402

KEY = "sk-hostile"
TOKEN = "worker-token"
MODEL = gen_model("qwen3moe", "q8_0", 17, vocab="ggml-vocab-qwen2.gguf")
COMPLETION = json.dumps({"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}).encode()


def raw(port, data, timeout=10, read_all=True):
    """Writes data in one send on a fresh connection; returns what came back until the server closed or
    went quiet (timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        try:
            while True:
                part = s.recv(65536)
                if not part:
                    break
                got += part
                if not read_all:
                    break
        except socket.timeout:
            pass
    return got


def statuses(data):
    return [int(m) for m in re.findall(rb"HTTP/1\.[01] (\d{3})", data)]


def post_head(path, n, key=KEY, extra=""):
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {n}\r\n{extra}\r\n").encode()


def json_body(data):
    """The body of the first response in data, parsed strictly (UTF-8 and JSON), or None."""
    head, _, body = data.partition(b"\r\n\r\n")
    m = re.search(rb"content-length: *(\d+)", head, re.I)
    if m:
        body = body[:int(m.group(1))]
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None


def metric_count(srv, endpoint, code):
    v = 0
    for name, labels, value in srv.metrics().get("moex_requests_total", {}).get("samples", []):
        if labels.get("endpoint") == endpoint and labels.get("code") == str(code):
            v += value
    return v


@scenario
def body_then_more():
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--local", "--parallel", "2"], key=KEY)
    try:
        cases = {"a CRLF after the body": b"\r\n", "a pipelined GET": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
                 "both, twice": b"\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n\r\n"}
        for what, tail in cases.items():
            got = raw(srv.port, post_head("/v1/completions", len(COMPLETION)) + COMPLETION + tail, timeout=2)
            st = statuses(got)
            check(f"POST + body + {what} in one write: answered 200", st[:1] == [200], f"{st} {got[:200]!r}")
            alive = srv.proc.poll() is None
            check(f"  the server is up", alive, srv.text()[-2000:] if not alive else "")
            if not alive:
                return
        status, _, _ = request(srv.port, "GET", "/health")
        check("  /health 200 afterwards", status == 200, f"{status}")
        n200 = metric_count(srv, "completions", 200)
        check("  one generation per request (the metrics count 3 completions)", n200 == len(cases), f"{n200}")
    finally:
        rc = srv.stop()
        with open(srv.log_path, errors="replace") as f:
            log = f.read()
        check("  clean exit", rc == 0 and "AddressSanitizer" not in log, f"rc={rc} {log[-1500:]}")


@scenario
def key_on_headers():
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--local"], key=KEY)
    try:
        # headers announcing a megabyte, then nothing: a wrong key is answered at once
        t0 = time.monotonic()
        got = raw(srv.port, post_head("/v1/chat/completions", 1 << 20, key="wrong"), timeout=5)
        dt = time.monotonic() - t0
        check("wrong key, body not sent: 401 at once", statuses(got)[:1] == [401] and dt < 4,
              f"{statuses(got)} {dt:.1f} s")
        check("  and the connection closed (its body is never read)", dt < 4, f"{dt:.1f} s")
        e = error_of(got.partition(b"\r\n\r\n")[2])
        check("  OpenAI's error JSON", e is not None and e["code"] == "invalid_api_key", f"{got[-300:]!r}")
        # many clients trickling bodies with a wrong key hold no memory
        rss0 = fp.hub_rss_kb(srv.proc.pid)
        socks = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", srv.port), timeout=2)
            try:   # a refused client's body is not read: the send stops when the server closes
                s.sendall(post_head("/v1/completions", 1 << 20, key="wrong") + b"x" * (256 << 10))
            except OSError:
                pass
            socks.append(s)
        time.sleep(1)
        rss1 = fp.hub_rss_kb(srv.proc.pid)
        for s in socks:
            s.close()
        check("  200 wrong-key clients sending 256 KiB bodies: the server grows by < 20 MB", rss1 - rss0 < 20_000,
              f"{rss0} -> {rss1} kB")
        # a flood of 405/411/413/400 with the right key: logged a few times a second
        t0 = time.monotonic()
        lines0 = srv.text().count("api: ")
        for i in range(300):
            if i % 3 == 0:
                head = f"GET /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n"
                raw(srv.port, head.encode(), timeout=2, read_all=False)
            elif i % 3 == 1:
                raw(srv.port, post_head("/v1/completions", 1 << 30), timeout=2, read_all=False)
            else:
                raw(srv.port, post_head("/v1/completions", 3) + b"{x}", timeout=2, read_all=False)
        elapsed = time.monotonic() - t0
        lines = srv.text().count("api: ") - lines0
        check("300 bad requests with the key: logged at a bounded rate", lines <= 5 * (elapsed + 2),
              f"{lines} lines in {elapsed:.1f} s")
    finally:
        srv.stop()


@scenario
def framing():
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--local"], key=KEY)
    try:
        got = raw(srv.port, post_head("/v1/completions", len(COMPLETION), extra="Transfer-Encoding: chunked\r\n")
                  + COMPLETION, timeout=5)
        check("Content-Length with Transfer-Encoding: 400, closed", statuses(got) == [400] and json_body(got),
              f"{got[:300]!r}")
        body = COMPLETION + b" trailing"
        got = raw(srv.port, post_head("/v1/completions", len(body), extra="Connection: close\r\n") + body, timeout=5)
        check("a JSON value with bytes after it: 400", statuses(got)[:1] == [400], f"{got[:300]!r}")
        h2c = ("Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n")
        for method, path, body in (("GET", "/health", b""), ("GET", "/metrics", b""), ("GET", "/v1/model", b""),
                                   ("POST", "/v1/completions", COMPLETION)):
            head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n{h2c}"
                    + (f"Content-Length: {len(body)}\r\n" if body else "") + "\r\n").encode()
            got = raw(srv.port, head + body, timeout=1)
            st = statuses(got)
            check(f"h2c upgrade on {method} {path}: 505 JSON, no 101", st[:1] == [505] and json_body(got) is not None,
                  f"{got[:200]!r}")
        check("  the server is up", srv.proc.poll() is None)
    finally:
        srv.stop()


@scenario
def json_everywhere():
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--local"], key=KEY)
    try:
        for method, path in (("GET", "/nope"), ("GET", "/v1/embeddings"), ("POST", "/v1/embeddings"),
                             ("POST", "/v1/models"), ("DELETE", "/health"), ("GET", "/v1/chat/completions"),
                             ("PUT", "/anything/else")):
            body = b"{}" if method in ("POST", "PUT") else None
            status, hdrs, data = request(srv.port, method, path, body=body, key=KEY)
            e = error_of(data)
            check(f"{method} {path}: {status} with OpenAI's error JSON", status in (404, 405) and e is not None
                  and hdrs.get("content-type", "").startswith("application/json"), f"{status} {data[:200]!r}")
        bad = b'{"model": "\xff\xfe\xc0\xafnot-utf8", "prompt": "hi", "max_tokens": 1}'
        got = raw(srv.port, post_head("/v1/completions", len(bad), extra="Connection: close\r\n") + bad, timeout=5)
        j = json_body(got)
        check("a model name that is not UTF-8: 404 whose JSON is valid UTF-8", statuses(got)[:1] == [404]
              and j is not None and "error" in j, f"{got[:300]!r}")
    finally:
        srv.stop()


def get_status(port, path, token=None):
    return request(port, "GET", path, key=token)[0]


@scenario
def weights_credential():
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--local", "--ctx", "100000"], key=KEY)
    try:
        status, _, data = request(srv.port, "GET", "/status.json", key=KEY)
        ctx = json.loads(data).get("serving", {}).get("ctx_per_slot") if status == 200 else None
        check("--ctx 100000: capped at the model's trained context (said so at start)", ctx == 2048 and
              "above the model's trained context" in srv.text(), f"ctx_per_slot={ctx}")
        for who, token in (("no credential", None), ("the API key", KEY)):
            for path in ("/v1/model", "/v1/expert/0/0"):
                status, _, data = request(srv.port, "GET", path, key=token)
                check(f"--local, {who}: {path} serves no weights (404 JSON)", status == 404 and error_of(data),
                      f"{status} {data[:120]!r}")
    finally:
        srv.stop()
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--token", TOKEN, "--replicas", "1"], key=KEY)
    try:
        for who, token, want in (("no credential", None, 403), ("the API key", KEY, 403), ("the token", TOKEN, 200)):
            for path in ("/v1/model", "/v1/expert/0/0"):
                status = get_status(srv.port, path, token)
                check(f"distributed, {who}: {path} -> {want}", status == want, f"{status}")
    finally:
        srv.stop()


def health(port):
    status, _, data = request(port, "GET", "/health")
    try:
        return status, json.loads(data)
    except ValueError:
        return status, None


def mapped_kb(pid, path):
    """kB of the file at path resident in process pid's mappings of it (/proc/PID/smaps)."""
    real, total, mine = os.path.realpath(path), 0, False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split()
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                mine = len(head) >= 6 and head[-1] == real
            elif mine and head[0] == "Rss:":
                total += int(head[1])
    return total


@scenario
def health():
    # --local: 200 only once the weights are in memory (the first request must not read the file)
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--local"], key=KEY)
    try:
        kb, size_kb = mapped_kb(srv.proc.pid, MODEL), os.path.getsize(MODEL) // 1024
        check("--local, /health 200: the model's weights are resident", kb >= 0.9 * size_kb, f"{kb} of {size_kb} kB")
    finally:
        srv.stop()
    # waiting for a worker: 503 "loading" with the reason; SIGTERM stops the wait at once
    port = free_port()
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, port, ["--token", TOKEN, "--min-workers", "1", "--wait-s", "600"],
                key=KEY, wait_health=False)
    try:
        st, j = None, None
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                st, j = health(port)
                break
            except OSError:
                time.sleep(0.1)
        check("waiting for workers: /health 503 with the reason", st == 503 and j and j.get("status") == "loading"
              and "worker" in j.get("reason", ""), f"{st} {j}")
        t0 = time.monotonic()
        check("  SIGTERM while waiting: stopped within 5 s", stops_within(srv.proc, 5),
              f"still running after {time.monotonic() - t0:.1f} s")
    finally:
        srv.stop()
    # --no-local-fallback without workers: every request would fail, so 503; a worker joins: 200
    port = free_port()
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, port, ["--token", TOKEN, "--no-local-fallback", "--replicas", "1"],
                key=KEY, wait_health=False)
    w = None
    try:
        deadline = time.time() + 30
        st, j = None, None
        while time.time() < deadline:
            try:
                st, j = health(port)
                if j and j.get("status") != "loading":
                    break
            except OSError:
                pass
            time.sleep(0.1)
        check("--no-local-fallback, no worker: /health 503 'unavailable' with the reason", st == 503 and j
              and j.get("status") == "unavailable" and "no-local-fallback" in j.get("reason", ""), f"{st} {j}")
        w = subprocess.Popen([f"{distlib.BIN}/moex-worker", "--hub", f"ws://127.0.0.1:{port}/ws", "--token", TOKEN,
                              "--model", MODEL, "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while time.time() < deadline and health(port)[0] != 200:
            time.sleep(0.1)
        check("  a worker joined: /health 200", health(port)[0] == 200, f"{health(port)}")
    finally:
        if w:
            w.terminate()
            w.wait(10)
        srv.stop()


@scenario
def names():
    port = free_port()
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, port, ["--token", TOKEN, "--replicas", "1"], key=KEY)
    name = b"\xff\xfe broken \xc0\xaf utf-8 \xed\xa0\x80 " + b"n" * 200 + b" end"
    name = name[:255]
    try:
        mh = fp.model_hash(port, TOKEN)

        async def join():
            w = fp.FakeWorker(port, TOKEN, mh, name, lambda d: fp.result_frame(d, d.rows_f32() * 0))
            await w.join()
            t0 = time.monotonic()
            await w.serve(lambda: bool(w.assigns) or time.monotonic() - t0 > 10)
            return w

        t, box = fp.run_in_thread(join)
        t.join(20)
        status, _, data = request(port, "GET", "/status.json", key=KEY)
        try:
            j = json.loads(data.decode("utf-8"))
            shown = [w["name"] for w in j.get("workers", [])]
        except (UnicodeDecodeError, ValueError) as e:
            j, shown = None, [repr(e)]
        check("a worker named with invalid UTF-8: /status.json is valid UTF-8 JSON", j is not None, f"{data[:200]!r}")
        check("  its whole name shown (255 bytes, invalid sequences replaced)", any(s.endswith(" end") for s in shown),
              f"{shown}")
        status, _, data = request(port, "GET", "/metrics", key=KEY)
        try:
            parse_prometheus(data.decode("utf-8"))
            ok, why = True, ""
        except (UnicodeDecodeError, ValueError) as e:
            ok, why = False, str(e)
        check("  /metrics is valid UTF-8 Prometheus text", ok, why)
    finally:
        srv.stop()


@scenario
def sampled_concurrent():
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--local", "--parallel", "4"], key=KEY)
    try:
        reqs = [{"prompt": [1, 15, 27 + i, 300], "max_tokens": 16, "temperature": 0.8, "seed": 100 + i,
                 "ignore_eos": True} for i in range(6)]

        def text_of(r):
            st, _, data = request(srv.port, "POST", "/v1/completions", body=r, key=KEY)
            return json.loads(data)["choices"][0]["text"] if st == 200 else f"status {st}"

        alone = [text_of(r) for r in reqs]
        together = [None] * len(reqs)

        def run(i):
            together[i] = text_of(reqs[i])

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(reqs))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        check("6 concurrent seeded requests at temperature 0.8: each equals itself alone", together == alone,
              f"\n  alone    {alone}\n  together {together}")
        check("  and they differ from each other (sampling is on)", len(set(alone)) > 1, f"{alone}")
    finally:
        srv.stop()


finish_script()
