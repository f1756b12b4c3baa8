#!/usr/bin/python3
"""moex-hub serve end to end: the official openai npm client (tests/hub/api,
installed by tests/hub/api/setup.sh) against a real server on loopback,
--local and with real moex-worker processes. Greedy answers equal what the
CLI prints for the same tokens, concurrent requests equal the same requests
run alone, bad input gets OpenAI's error JSON with the right status, a
client killed mid-stream frees its slot (the metrics show it), /metrics is
strict Prometheus text, and headless Chromium's DOM of the status page lists
the workers and the model.

usage: test_api.py BIN_DIR VOCAB_DIR WORK_DIR [scenario ...]
Exits 77 when node with the openai package or chromium is missing, unless
MOEX_REQUIRE_API_TOOLS=1.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apilib import (Serve, chromium_eval_when, error_of, find_chromium, have_node_client, need,  # noqa: E402
                    parse_prometheus, request, run_node_client, sample)
from distlib import check, finish_script, free_port, gen_model, scenario, setup  # noqa: E402

need(have_node_client(), "node or the openai package is missing (run tests/hub/api/setup.sh)")
need(find_chromium() is not None, "chromium is not installed (run tests/hub/api/setup.sh)")
setup(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
import distlib  # noqa: E402  (setup filled in its BIN and WORK)

KEY = "test-api-key"
CTX = 256
MODEL = gen_model("qwen3moe", "q8_0", 11, vocab="ggml-vocab-qwen2.gguf")   # ChatML template from the vocab
MODEL_ID = os.path.basename(MODEL)[:-len(".gguf")]
PROMPTS = [[1, 15, 27, 300, 4000, 5, 6, 77, 8, 900], [9, 8, 7, 6, 5, 4, 3, 2, 1], [42, 4242, 14, 1414, 100]]


def cli_text(prompt, n):
    """What `moex-hub --local` prints greedily for token ids, decoded as clients decode it."""
    out = subprocess.run([f"{distlib.BIN}/moex-hub", "--local", "-m", MODEL, "--prompt-tokens",
                          ",".join(map(str, prompt)), "-n", str(n), "--temp", "0", "--ignore-eos", "--threads", "1"],
                         check=True, capture_output=True).stdout
    return out[:-1].decode("utf-8", errors="replace")  # the CLI ends with a newline


REFS = [{"prompt": p, "n": 24, "text": cli_text(p, 24)} for p in PROMPTS]


def client_checks(srv, name, only=None, concurrent_tokens=20):
    cfg = {"base": srv.base, "key": KEY, "model": MODEL_ID, "n_ctx": CTX, "refs": REFS, "parallel": 8,
           "concurrent_tokens": concurrent_tokens}
    if only:
        cfg["only"] = only
    rc, lines = run_node_client(distlib.WORK, cfg, name)
    for line in lines:
        if line.startswith("ok"):
            check(f"[{name}] {line[5:]}", True)
        elif line.startswith("FAIL"):
            check(f"[{name}] {line[5:]}", False)
        else:
            print(line)
    check(f"[{name}] the node client ran to the end", rc == 0 or any(l.startswith("FAIL") for l in lines), f"rc={rc}")


def raw_chunked_post(port, path, chunks, key):
    """A POST with a chunked body, written in one go (the server may answer and
    close before a client that sends chunk by chunk is done): (status, body)."""
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\n\r\n"
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + body)
        data = b""
        while True:
            part = sock.recv(65536)
            if not part:
                break
            data += part
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    return status, data.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in data else b""


def raw_bad_input(srv):
    """What the openai client cannot send: broken JSON, an oversized body, no key, other methods."""
    st, _, body = request(srv.port, "POST", "/v1/chat/completions", b'{"messages": [', key=KEY,
                          headers={"Content-Type": "application/json"})
    check("malformed JSON: 400 with OpenAI's error JSON", st == 400 and error_of(body) is not None, f"{st} {body[:200]}")
    big = b'{"prompt": "' + b"a" * (70 * 1024) + b'"}'
    st, _, body = request(srv.port, "POST", "/v1/completions", big, key=KEY, headers={"Content-Type": "application/json"})
    e = error_of(body)
    check("an oversized body: 413", st == 413 and e and e["code"] == "request_too_large", f"{st} {body[:200]}")
    st, body = raw_chunked_post(srv.port, "/v1/completions", [b'{"prompt": [1, 2], ', b'"max_tokens": 1}'], KEY)
    e = error_of(body)
    check("a chunked body: 411 (a length is needed)", st == 411 and e and e["code"] == "length_required",
          f"{st} {body[:200]}")
    st, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
    e = error_of(body)
    check("no API key: 401 invalid_api_key", st == 401 and e and e["code"] == "invalid_api_key", f"{st} {body[:200]}")
    st, _, body = request(srv.port, "GET", "/metrics")
    check("/metrics needs the key", st == 401, str(st))
    st, _, body = request(srv.port, "GET", "/health")
    check("/health needs no key", st == 200 and json.loads(body)["status"] == "ok", f"{st} {body}")
    st, h, body = request(srv.port, "GET", "/")
    check("the status page needs no key, and is HTML without external assets",
          st == 200 and h["content-type"].startswith("text/html") and b"<script" in body and b"src=" not in body
          and b"http://" not in body and b"https://" not in body, f"{st} {h.get('content-type')}")
    st, _, body = request(srv.port, "GET", "/v1/chat/completions", key=KEY)
    check("GET on a POST endpoint: 405", st == 405 and error_of(body) is not None, f"{st} {body[:200]}")
    st, h, _ = request(srv.port, "OPTIONS", "/v1/chat/completions")
    check("CORS preflight: 204", st == 204 and h.get("access-control-allow-origin") == "*", str(st))
    st, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": "yes"},
                          key=KEY)
    e = error_of(body)
    check("a wrong type: 400 naming the field", st == 400 and e and e["param"] == "stream", f"{st} {body[:200]}")
    # no silent ignores: a field the server does not implement is a 400 naming it, unless its value asks for nothing
    for field, value in (("json_schema", {"type": "object"}), ("functions", [{"name": "f"}]),
                         ("mirostat", 2), ("audio", {"voice": "x"})):
        st, _, body = request(srv.port, "POST", "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value}, key=KEY)
        e = error_of(body)
        check(f"'{field}' (not implemented): 400 naming it", st == 400 and e and e["param"] == field,
              f"{st} {body[:200]}")
    st, _, body = request(srv.port, "POST", "/v1/chat/completions", {
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "presence_penalty": 0, "tools": [],
        "tool_choice": "none", "response_format": {"type": "text"}, "logit_bias": {}, "user": "u1", "metadata": {}},
        key=KEY)
    check("the same fields at values that ask for nothing, and user/metadata: 200", st == 200, f"{st} {body[:200]}")
    st, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "suffix": "x"},
                          key=KEY)
    e = error_of(body)
    check("'suffix' on /v1/completions: 400 naming it", st == 400 and e and e["param"] == "suffix", f"{st} {body[:200]}")
    # the tokenizer over HTTP (llama-server's endpoints), and paths the API does not serve
    st, _, body = request(srv.port, "POST", "/tokenize", {"content": "Hello world", "add_special": False}, key=KEY)
    toks = json.loads(body).get("tokens") if st == 200 else None
    st2, _, body2 = request(srv.port, "POST", "/detokenize", {"tokens": toks or []}, key=KEY)
    check("/tokenize then /detokenize: the text back", st == 200 and toks and st2 == 200 and
          json.loads(body2).get("content") == "Hello world", f"{st} {body[:200]} {st2} {body2[:200]}")
    st, _, body = request(srv.port, "POST", "/detokenize", {"tokens": [1, 10 ** 9]}, key=KEY)
    e = error_of(body)
    check("/detokenize of an id outside the vocabulary: 400 naming tokens", st == 400 and e and e["param"] == "tokens",
          f"{st} {body[:200]}")
    for method, path in (("POST", "/v1/embeddings"), ("GET", "/v1/nothing")):
        st, h, body = request(srv.port, method, path, {"input": "x"} if method == "POST" else None, key=KEY)
        e = error_of(body)
        check(f"{method} {path}: a JSON 404", st == 404 and e and e["code"] == "unknown_url" and
              h.get("content-type", "").startswith("application/json"), f"{st} {body[:200]}")
    # keep-alive: two requests on one connection, the second after a whole response
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    hdr = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    ok = True
    for _ in range(3):
        c.request("POST", "/v1/completions", json.dumps({"prompt": [1, 2, 3], "max_tokens": 2}), hdr)
        r = c.getresponse()
        ok = ok and r.status == 200 and json.loads(r.read())["usage"]["completion_tokens"] == 2
    c.close()
    check("three requests on one keep-alive connection", ok)


def killed_mid_stream(srv):
    """A client process SIGKILLed while its answer streams: its slot is free at once (metrics)."""
    before = srv.metrics()
    code = ("import http.client,json,sys\n"
            f"c=http.client.HTTPConnection('127.0.0.1',{srv.port})\n"
            "c.request('POST','/v1/completions',json.dumps({'prompt':[1,2,3],'max_tokens':100000,'ignore_eos':True,"
            f"'stream':True,'temperature':0}}),{{'Authorization':'Bearer {KEY}','Content-Type':'application/json'}})\n"
            "r=c.getresponse()\n"
            "while True:\n  l=r.fp.readline()\n  sys.stdout.write(l.decode()); sys.stdout.flush()\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    got = [p.stdout.readline() for _ in range(6)]
    during = srv.metrics()
    p.send_signal(signal.SIGKILL)
    p.wait()
    after, deadline = None, time.time() + 10
    while time.time() < deadline:
        after = srv.metrics()
        if sample(after, "moex_slots_active") == 0:
            break
        time.sleep(0.05)
    check("the killed client was streaming", sum(l.startswith("data: ") for l in got) >= 2, repr(got[:3]))
    check("  its slot was busy", sample(during, "moex_slots_active") == 1, str(sample(during, "moex_slots_active")))
    check("  and is free after the kill", sample(after, "moex_slots_active") == 0)
    cancelled = lambda f: sample(f, "moex_completions_total", reason="cancelled")  # noqa: E731
    check("  counted as cancelled and as a disconnect", cancelled(after) == cancelled(before) + 1 and
          sample(after, "moex_client_disconnects_total") == sample(before, "moex_client_disconnects_total") + 1,
          f"{cancelled(before)} -> {cancelled(after)}")
    st, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": [1, 2], "max_tokens": 3}, key=KEY)
    check("  the server goes on", st == 200, f"{st} {body[:200]}")


def metrics_text(srv, distributed):
    st, h, body = request(srv.port, "GET", "/metrics", key=KEY)
    try:
        fams = parse_prometheus(body.decode())
        err = ""
    except ValueError as e:
        fams, err = {}, str(e)
    check("/metrics parses as strict Prometheus text", st == 200 and fams and not err and
          h["content-type"].startswith("text/plain; version=0.0.4"), err or h.get("content-type", ""))
    want = ["moex_requests_total", "moex_prompt_tokens_total", "moex_generated_tokens_total",
            "moex_time_to_first_token_seconds", "moex_time_per_output_token_seconds", "moex_slots_active",
            "moex_queue_length", "moex_completions_total"]
    if distributed:
        want += ["moex_hub_dispatches_total", "moex_hub_hedges_sent_total", "moex_hub_timeouts_total",
                 "moex_hub_evictions_total", "moex_worker_state", "moex_worker_dispatches_total",
                 "moex_worker_latency_seconds", "moex_worker_lost_total", "moex_expert_coverage_ratio"]
    missing = [w for w in want if w not in fams]
    check("  it has the serving (and hub) families", not missing, str(missing))
    if fams:
        gen = sample(fams, "moex_generated_tokens_total")
        ttft = sample(fams, "moex_time_to_first_token_seconds", "moex_time_to_first_token_seconds_count")
        check("  tokens and first-token times were counted", gen and gen > 0 and ttft and ttft > 0, f"{gen} {ttft}")
        ok200 = sample(fams, "moex_requests_total", endpoint="chat", code="200")
        check("  chat requests were counted by status", ok200 and ok200 > 0, str(ok200))
    return fams


def logit_rules(srv):
    """logit_bias and the penalties change the tokens as they say (the arithmetic: test_sampler)."""
    prompt = PROMPTS[1]
    def tokens(**kw):
        st, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                                                  "ignore_eos": True, "logprobs": 0, **kw}, key=KEY)
        return json.loads(body)["choices"][0]["logprobs"]["tokens"] if st == 200 else None, st, body
    plain, _, _ = tokens()
    st, _, body = request(srv.port, "POST", "/tokenize", {"content": "zebra"}, key=KEY)
    z = json.loads(body)["tokens"][0]
    forced, _, _ = tokens(logit_bias={str(z): 100})
    check("logit_bias +100 on one id: every greedy token is it", forced and len(set(forced)) == 1 and forced != plain,
          f"{forced} / {plain}")
    first = subprocess.run([f"{distlib.BIN}/moex-hub", "--local", "-m", MODEL, "--prompt-tokens",
                            ",".join(map(str, prompt)), "-n", "1", "--temp", "0", "--threads", "1", "--print-tokens"],
                           capture_output=True, text=True, timeout=120).stdout.split()
    banned, _, _ = tokens(logit_bias={first[0]: -100})
    check("logit_bias -100 on the greedy first token: another first token", banned and banned[0] != plain[0],
          f"{banned} / {plain}")
    rep = [t for i, t in enumerate(plain or []) if t in (plain or [])[:i]]
    pen, _, _ = tokens(presence_penalty=2, frequency_penalty=2)
    check("presence and frequency penalties 2: tokens change where the plain run repeats one",
          pen and (pen != plain if rep else True), f"{pen} / {plain} (repeats {rep})")
    _, st, body = tokens(logit_bias={"99999999": 1})
    e = error_of(body)
    check("logit_bias outside the vocabulary: 400", st == 400 and e and e["param"] == "logit_bias", f"{st} {body[:200]}")


def several_choices(srv):
    """n > 1: n choices of one prompt, whole and streamed, each its own sequence (seeds seed, seed + 1, ...)."""
    msgs = [{"role": "user", "content": "Count to three. " + " ".join(f"Then say item {i}." for i in range(12))}]
    st, _, body = request(srv.port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 6, "temperature": 0,
                                                                   "ignore_eos": True}, key=KEY)
    one = json.loads(body)["choices"][0]["message"]["content"] if st == 200 else None
    before = sample(srv.metrics(), "moex_prompt_cached_tokens_total") or 0
    st, _, body = request(srv.port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 6, "temperature": 0,
                                                                   "ignore_eos": True, "n": 3}, key=KEY)
    d = json.loads(body) if st == 200 else {}
    texts = [c["message"]["content"] for c in d.get("choices", [])]
    check("n 3, greedy: three choices, each the n 1 answer; usage counts every choice's tokens",
          texts == [one] * 3 and [c["index"] for c in d["choices"]] == [0, 1, 2] and
          d["usage"]["completion_tokens"] == 18, f"{st} {body[:300]}")
    shared = (sample(srv.metrics(), "moex_prompt_cached_tokens_total") or 0) - before
    p = d.get("usage", {}).get("prompt_tokens", 0)
    check("  the prompt evaluated once: the other choices' prompt rows copied (cached tokens)",
          shared >= 2 * (p - 1), f"{shared} cached for a {p}-token prompt")
    st, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 12, "temperature": 1.5,
                                                              "seed": 11, "n": 4, "ignore_eos": True}, key=KEY)
    texts = [c["text"] for c in json.loads(body)["choices"]] if st == 200 else []
    check("n 4, sampling: four choices, not all the same (seeds 11..14)", len(texts) == 4 and len(set(texts)) > 1,
          f"{st} {texts}")
    st, _, body = request(srv.port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 6, "temperature": 0,
                                                                   "ignore_eos": True, "n": 2, "stream": True}, key=KEY)
    got, finishes = {0: "", 1: ""}, []
    for line in body.decode().splitlines():
        if line.startswith("data: {"):
            for ch in json.loads(line[6:]).get("choices", []):
                got[ch["index"]] += ch.get("delta", {}).get("content") or ""
                if ch.get("finish_reason"):
                    finishes.append(ch["index"])
    check("n 2 streamed: chunks of both choices, each finished once, the same greedy text",
          got == {0: one, 1: one} and sorted(finishes) == [0, 1], f"{got} {finishes}")


def log_probabilities(srv):
    """logprobs against the CLI's own logits (--dump-logits, log-softmax in float64 here): the completions' legacy
    format, chat's (whole and streamed), and the fields' bounds."""
    import numpy as np
    prompt, n = PROMPTS[0], 6
    dump = os.path.join(distlib.WORK, "logprobs.f32")
    out = subprocess.run([f"{distlib.BIN}/moex-hub", "--local", "-m", MODEL, "--prompt-tokens", ",".join(map(str, prompt)),
                          "-n", str(n), "--temp", "0", "--ignore-eos", "--threads", "1", "--print-tokens",
                          "--dump-logits", dump], capture_output=True, text=True, timeout=120)
    ids = [int(x) for x in out.stdout.split()]
    flat = np.fromfile(dump, dtype=np.float32).astype(np.float64)
    rows = flat.reshape(len(prompt) + n - 1, -1)   # every prompt position, then each decode step's
    ref = []
    for i, tok in enumerate(ids):
        row = rows[len(prompt) - 1 + i]
        lse = row.max() + np.log(np.exp(row - row.max()).sum())
        ref.append(row[tok] - lse)
    st, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                              "ignore_eos": True, "logprobs": 3}, key=KEY)
    lp = json.loads(body)["choices"][0]["logprobs"] if st == 200 else {}
    got = lp.get("token_logprobs", [])
    check("completions logprobs: each token's log probability is the log-softmax of the CLI's logits row",
          len(got) == n and all(abs(a - b) < 1e-4 for a, b in zip(got, ref)), f"{got} / {ref}")
    check("  3 alternatives a token, the chosen one first (greedy); text offsets grow",
          all(len(t) == 3 and abs(max(t.values()) - g) < 1e-6 for t, g in zip(lp.get("top_logprobs", []), got))
          and lp.get("text_offset") == sorted(lp.get("text_offset", [])),
          json.dumps(lp)[:300])
    msgs = [{"role": "user", "content": "Count to three."}]
    st, _, body = request(srv.port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 5, "temperature": 0,
                                                                   "logprobs": True, "top_logprobs": 2}, key=KEY)
    d = json.loads(body) if st == 200 else {}
    content = d.get("choices", [{}])[0].get("logprobs", {}).get("content", [])
    check("chat logprobs: an entry a token, its top 2, the chosen token first with its bytes",
          st == 200 and len(content) == d["usage"]["completion_tokens"] and all(
              len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["token"] == c["token"] and c["logprob"] <= 0
              and isinstance(c["bytes"], list) for c in content), f"{st} {body[:300]}")
    st, _, body = request(srv.port, "POST", "/v1/chat/completions", {"messages": msgs, "max_tokens": 5, "temperature": 0,
                                                                   "logprobs": True, "stream": True}, key=KEY)
    entries = []
    for line in body.decode().splitlines():
        if line.startswith("data: {"):
            ch = json.loads(line[6:]).get("choices") or [{}]
            entries += (ch[0].get("logprobs") or {}).get("content", [])
    check("  streamed: the same entries", [e["logprob"] for e in entries] == [c["logprob"] for c in content],
          f"{len(entries)} entries")
    for body_, param in (({"messages": msgs, "top_logprobs": 2}, "top_logprobs"),
                         ({"messages": msgs, "logprobs": True, "top_logprobs": 21}, "top_logprobs")):
        st, _, b = request(srv.port, "POST", "/v1/chat/completions", body_, key=KEY)
        e = error_of(b)
        check(f"  {json.dumps(body_)[30:]}: 400 naming {param}", st == 400 and e and e["param"] == param, f"{st} {b[:200]}")
    st, _, b = request(srv.port, "POST", "/v1/completions", {"prompt": "x", "logprobs": 6}, key=KEY)
    e = error_of(b)
    check("  completions logprobs 6 (OpenAI's limit is 5): 400", st == 400 and e and e["param"] == "logprobs", f"{st}")


@scenario
def local():
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--local", "--parallel", "8", "--ctx", str(CTX),
                                                                "--max-body", "65536"], key=KEY)
    try:
        client_checks(srv, "local")
        raw_bad_input(srv)
        log_probabilities(srv)
        logit_rules(srv)
        several_choices(srv)
        killed_mid_stream(srv)
        metrics_text(srv, False)
    finally:
        rc = srv.stop()
    check("--local server stops cleanly on SIGTERM", rc == 0, f"rc={rc} {srv.text()[-1500:] if rc else ''}")


@scenario
def fewer_slots_than_requests():
    """8 concurrent requests through 3 slots: the rest queue, all equal their runs alone."""
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--local", "--parallel", "3", "--ctx", str(CTX),
                                                                "--prompt-chunk", "4"], key=KEY)
    try:
        client_checks(srv, "3 slots", only=["concurrent"])
        fams = srv.metrics()
        check("  never more than 3 slots", sample(fams, "moex_slots") == 3)
    finally:
        srv.stop()


def status_page(srv):
    """Headless Chromium's DOM of / (the key in the URL's fragment) lists the model and both workers."""
    expr = ("(() => { const rows = [...document.querySelectorAll('#workers tbody tr')];"
            " const id = document.getElementById('model-id').textContent;"
            " if (rows.length < 2 || id !== %s) return null;"
            " return {id, workers: rows.map(r => [r.dataset.worker, r.children[1].textContent]),"
            " slots: document.getElementById('slots').textContent,"
            " link: document.getElementById('worker-link').getAttribute('href')}; })()" % json.dumps(MODEL_ID))
    try:
        got = chromium_eval_when(f"{srv.base}/#key={KEY}", expr, timeout=30)
    except Exception as e:  # a browser that does not start is a failure here: the tools were found
        got = None
        print(f"     chromium: {e}")
    check("Chromium: the status page's DOM names the model", got and got["id"] == MODEL_ID, str(got))
    check("  and lists both workers as ready", got and sorted(got["workers"]) == [["w0", "ready"], ["w1", "ready"]],
          str(got))
    check("  with the slots and the worker page's link", got and got["slots"].endswith("/ 8") and
          got["link"] == "/worker", str(got))


def start_workers(port, names, options):
    """moex-worker processes joining the server on port, one per name (logs in WORK)."""
    workers = []
    for name in names:
        log = open(os.path.join(distlib.WORK, f"api-worker-{port}-{name}.log"), "w")
        workers.append(subprocess.Popen([f"{distlib.BIN}/moex-worker", "--hub", f"ws://127.0.0.1:{port}/ws",
                                         "--token", distlib.TOKEN, "--model", MODEL, "--name", name, *options],
                                        stdout=log, stderr=subprocess.STDOUT))
    return workers


def stop_all(srv, workers):
    """Stops the server, then its workers; the server's exit status."""
    rc = srv.stop()
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    for w in workers:
        try:
            w.wait(10)
        except subprocess.TimeoutExpired:
            w.kill()
    return rc


def batched(before, after):
    """(tokens, forward steps) between two metrics samples."""
    return (sample(after, "moex_forward_tokens_total") - sample(before, "moex_forward_tokens_total"),
            sample(after, "moex_forward_steps_total") - sample(before, "moex_forward_steps_total"))


@scenario
def distributed():
    port = free_port()
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, port, ["--token", distlib.TOKEN, "--replicas", "2",
                                                         "--min-workers", "2", "--parallel", "8", "--ctx", str(CTX)],
                key=KEY, wait_health=False)
    workers = []
    try:
        time.sleep(0.3)
        workers = start_workers(port, ["w0", "w1"], ["--threads", "1"])
        srv.wait_health(120)
        before = srv.metrics()
        client_checks(srv, "distributed", only=["models", "matchesCli", "chats", "stops", "concurrent"])
        fams = metrics_text(srv, True)
        d0, d1 = sample(before, "moex_hub_dispatches_total"), sample(fams, "moex_hub_dispatches_total")
        check("the workers computed the experts (no fallback)", d1 > d0 and sample(fams, "moex_hub_fallbacks_total") == 0,
              f"dispatches {d0} -> {d1}, fallbacks {sample(fams, 'moex_hub_fallbacks_total')}")
        toks, steps = batched(before, fams)
        check("forwards carried several sequences' tokens (batched)", toks > 1.5 * steps, f"{toks} tokens in {steps}")
        names = sorted(l["worker"] for _, l, _ in fams["moex_worker_state"]["samples"])
        check("the metrics list both workers, ready", names == ["w0", "w1"] and all(
            l["state"] == "ready" for _, l, _ in fams["moex_worker_state"]["samples"]), str(fams["moex_worker_state"]))
        check("every expert has a ready replica", sample(fams, "moex_expert_coverage_ratio") == 1.0)
        status_page(srv)
    finally:
        rc = stop_all(srv, workers)
    check("the distributed server stops cleanly", rc == 0, f"rc={rc} {srv.text()[-1500:] if rc else ''}")


@scenario
def speculative():
    """--draft-model (the test model in q4_0: drafts partly right) through 2 workers: concurrent greedy requests
    equal their CLI runs without speculation. --draft-max 12 against the step's 15 drafts: the first slots to
    decode take the drafts and the rest decode one token, so speculating and plain slots share forwards."""
    twin = gen_model("qwen3moe", "q4_0", 11, vocab="ggml-vocab-qwen2.gguf")
    port = free_port()
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, port, ["--token", distlib.TOKEN, "--min-workers", "2", "--parallel",
                                                         "4", "--ctx", str(CTX), "--draft-model", twin,
                                                         "--draft-max", "12"], key=KEY, wait_health=False)
    workers = []
    try:
        time.sleep(0.3)
        workers = start_workers(port, ["w0", "w1"], ["--threads", "1"])
        srv.wait_health(120)
        client_checks(srv, "speculative", only=["matchesCli", "concurrent"])
        fams = srv.metrics()
        drafted, accepted = sample(fams, "moex_spec_drafted_total"), sample(fams, "moex_spec_accepted_total")
        partial = sum(sample(fams, "moex_spec_verifies_total", accepted=str(a)) or 0 for a in range(1, 12))
        check("drafts were verified, some accepted and some not", drafted and 0 < accepted < drafted and partial > 0,
              f"drafted {drafted} accepted {accepted} partial {partial}")
        st, _, body = request(port, "POST", "/v1/completions", key=KEY, body={
            "model": MODEL_ID, "prompt": [5, 6, 7], "max_tokens": 16, "temperature": 0.8, "seed": 3})
        usage = json.loads(body).get("usage", {}) if st == 200 else {}
        check("a sampling request speculates too: 16 tokens", usage.get("completion_tokens") == 16, f"{st} {body[:300]}")
    finally:
        rc = stop_all(srv, workers)
    check("the speculating server stops cleanly", rc == 0, f"rc={rc} {srv.text()[-1500:] if rc else ''}")


def two_turns(port):
    """A chat's two turns (greedy, a long system prompt): the answers and each turn's usage."""
    system = "You answer briefly. " + " ".join(f"Rule {i}: say what you know about item {i}." for i in range(40))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "What is item 7?"}]
    out = []
    for turn in range(2):
        st, _, body = request(port, "POST", "/v1/chat/completions", key=KEY, body={
            "model": MODEL_ID, "messages": msgs, "max_tokens": 12, "temperature": 0})
        d = json.loads(body) if st == 200 else {}
        answer = d.get("choices", [{}])[0].get("message", {}).get("content")
        out.append((answer, d.get("usage", {})))
        msgs = msgs + [{"role": "assistant", "content": answer or ""}, {"role": "user", "content": "And item 9?"}]
    return out


def has_vulkan():
    p = subprocess.run([f"{distlib.BIN}/moex-hub", "--list-devices"], capture_output=True, text=True)
    return p.returncode == 0 and p.stdout.strip() != ""


def shared_prefix(port):
    """B sent while A (the same long system prompt) decodes: B's answer and usage, read while A still streams."""
    import http.client
    # another system prompt than two_turns': the free slot's kept rows share only its first words, A's busy slot all
    system = "Answer in full sentences. " + " ".join(f"Rule {i}: say what you know about item {i}." for i in range(40))
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/chat/completions", json.dumps({
        "model": MODEL_ID, "messages": [{"role": "system", "content": system}, {"role": "user", "content": "A?"}],
        "max_tokens": 60, "temperature": 0, "ignore_eos": True, "stream": True}),
        {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    r = c.getresponse()
    while not r.readline().startswith(b"data: {"):
        pass
    st, _, body = request(port, "POST", "/v1/chat/completions", key=KEY, body={
        "model": MODEL_ID, "messages": [{"role": "system", "content": system}, {"role": "user", "content": "B?"}],
        "max_tokens": 12, "temperature": 0})
    r.read()
    c.close()
    d = json.loads(body) if st == 200 else {}
    return d.get("choices", [{}])[0].get("message", {}).get("content"), d.get("usage", {})


@scenario
def prompt_cache():
    """A chat's second turn reuses the first turn's prompt rows (the slot's KV), and answers what a server without
    the prompt cache answers: on the CPU, and on Vulkan where a device is (prompt rows there run on the tiled
    kernels both times)."""
    backends = [["--local"]] + ([["--local", "--backend", "vulkan"]] if has_vulkan() else [])
    for backend in backends:
        answers = {}
        for name, extra in (("cache", []), ("no cache", ["--no-prompt-cache"])):
            port = free_port()
            srv = Serve(distlib.BIN, distlib.WORK, MODEL, port, [*backend, "--parallel", "2", "--ctx", "1024", *extra],
                        key=KEY, timeout=300)
            try:
                answers[name] = two_turns(port)
                answers[name].append(sample(srv.metrics(), "moex_prompt_cached_tokens_total"))
                answers[name].append(shared_prefix(port))
            finally:
                srv.stop()
        (a1, u1), (a2, u2), cached_metric, (sa, su) = answers["cache"]
        (b1, v1), (b2, v2), none_metric, (sb, sv) = answers["no cache"]
        p1 = u1.get("prompt_tokens", 0)
        got = u2.get("prompt_tokens_details", {}).get("cached_tokens", -1)
        be = backend[-1]
        check(f"[{be}] the second turn took the first turn's prompt rows from the slot", p1 > 200 and p1 - 8 <= got < p1,
              f"first prompt {p1} tokens, cached {got}")
        check(f"[{be}]   the answers equal a server's without the prompt cache", a1 and a2 and (a1, a2) == (b1, b2),
              f"{a1!r} {a2!r} / {b1!r} {b2!r}")
        check(f"[{be}]   without it nothing is cached; /metrics counts what was", v2.get("prompt_tokens_details", {}).get(
            "cached_tokens") == 0 and none_metric == 0 and cached_metric == got, f"{v2} {none_metric} {cached_metric}")
        shared = su.get("prompt_tokens_details", {}).get("cached_tokens", -1)
        check(f"[{be}] a request sharing a running one's system prompt copies its rows (engine copy_rows)",
              shared > 200 and shared < su.get("prompt_tokens", 0), f"cached {shared} of {su.get('prompt_tokens')}")
        check(f"[{be}]   and answers as without the cache", sa and sa == sb, f"{sa!r} / {sb!r}")


@scenario
def vulkan():
    """--backend vulkan with 4 slots: answers are the Vulkan CLI's, 8 concurrent requests each equal to itself
    alone, and forwards carried several sequences at once."""
    if not has_vulkan():
        print("     (no Vulkan build or device: skipped)")
        return
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, free_port(), ["--local", "--backend", "vulkan", "--parallel", "4",
                                                                "--ctx", str(CTX), "--prompt-chunk", "4"],
                key=KEY, timeout=300)
    try:
        check("vulkan: 4 slots", sample(srv.metrics(), "moex_slots") == 4 and "one sequence at a time" not in srv.text())
        for p in PROMPTS[:2]:
            want = subprocess.run([f"{distlib.BIN}/moex-hub", "--local", "--backend", "vulkan", "-m", MODEL,
                                   "--prompt-tokens", ",".join(map(str, p)), "-n", "12", "--temp", "0", "--ignore-eos"],
                                  check=True, capture_output=True).stdout[:-1].decode("utf-8", errors="replace")
            st, _, body = request(srv.port, "POST", "/v1/completions", {"prompt": p, "max_tokens": 12, "temperature": 0,
                                                                       "ignore_eos": True}, key=KEY)
            got = json.loads(body)["choices"][0]["text"] if st == 200 else body
            check("vulkan: the API's greedy text is the Vulkan CLI's", got == want, f"{got!r} vs {want!r}")
        before = srv.metrics()
        client_checks(srv, "vulkan, 4 slots", only=["concurrent"], concurrent_tokens=8)   # lavapipe: ~20 tok/s
        fams = srv.metrics()
        toks, steps = batched(before, fams)
        check("vulkan: forwards carried several sequences' tokens (batched)", toks > 1.5 * steps,
              f"{toks} tokens in {steps}")
    finally:
        rc = srv.stop()
    check("vulkan: stops cleanly", rc == 0, f"rc={rc}")


@scenario
def vulkan_workers():
    """hub --backend vulkan + 2 Vulkan workers, 4 slots, prompts fed 4 tokens a step (so decodes share steps
    with other prompts' chunks): 8 concurrent greedy requests each equal to itself alone."""
    if not has_vulkan():
        print("     (no Vulkan build or device: skipped)")
        return
    port = free_port()
    srv = Serve(distlib.BIN, distlib.WORK, MODEL, port, ["--backend", "vulkan", "--token", distlib.TOKEN, "--replicas", "1",
                                                         "--min-workers", "2", "--parallel", "4", "--ctx", str(CTX),
                                                         "--prompt-chunk", "4"],
                key=KEY, wait_health=False, timeout=300)
    workers = []
    try:
        time.sleep(0.3)
        workers = start_workers(port, ["vk0", "vk1"], ["--backend", "vulkan"])
        srv.wait_health(300)
        before = srv.metrics()
        client_checks(srv, "Vulkan workers, 4 slots", only=["concurrent"], concurrent_tokens=8)
        fams = srv.metrics()
        d0, d1 = sample(before, "moex_hub_dispatches_total"), sample(fams, "moex_hub_dispatches_total")
        check("vulkan workers: they computed the experts (no fallback)",
              d1 > d0 and sample(fams, "moex_hub_fallbacks_total") == 0, f"dispatches {d0} -> {d1}")
        toks, steps = batched(before, fams)
        check("vulkan workers: forwards carried several sequences' tokens (batched)", toks > 1.5 * steps,
              f"{toks} tokens in {steps}")
    finally:
        rc = stop_all(srv, workers)
    check("vulkan workers: the server stops cleanly", rc == 0, f"rc={rc} {srv.text()[-1500:] if rc else ''}")


@scenario
def templates():
    """The GGUF's Jinja template runs whatever its markers; one the interpreter cannot parse falls back to the
    built-in rendering of its family, else stops the server at start with a way out; --chat-template chooses one."""
    with open(os.path.join(distlib.VOCAB, "ggml-vocab-qwen2.gguf"), "rb") as f:
        data = f.read()

    def vocab_with(name, *swaps):   # same lengths, so the GGUF stays valid
        path = os.path.join(distlib.WORK, f"vocab-{name}.gguf")
        out = data
        for a, b in swaps:
            assert len(a) == len(b)
            out = out.replace(a, b)
        with open(path, "wb") as f:
            f.write(out)
        return os.path.abspath(path)

    odd = gen_model("qwen3moe", "q8_0", 13, vocab=vocab_with("odd", (b"<|im_start|>", b"<|turn_in|>:")))
    srv = Serve(distlib.BIN, distlib.WORK, odd, free_port(), ["--local", "--ctx", "64"], key=KEY)
    try:
        st, _, body = request(srv.port, "POST", "/apply-template", {"messages": [{"role": "user", "content": "hi"}]},
                              key=KEY)
        check("a template of no known family: run as it is (Jinja)", st == 200 and
              json.loads(body)["prompt"].endswith("<|turn_in|>:user\nhi<|im_end|>\n<|turn_in|>:assistant\n"),
              f"{st} {body[:300]}")
    finally:
        srv.stop()
    broken = gen_model("qwen3moe", "q8_0", 14, vocab=vocab_with("broken", (b"{% endfor %}", b"{% endfro %}")))
    srv = Serve(distlib.BIN, distlib.WORK, broken, free_port(), ["--local", "--ctx", "64"], key=KEY)
    try:
        st, _, body = request(srv.port, "GET", "/status.json", key=KEY)
        check("a template the interpreter cannot parse, of a known family: the built-in rendering, with a warning",
              st == 200 and json.loads(body)["model"]["chat_template"] == "chatml (built-in)" and
              "endfro" in srv.text(), f"{st} {body[:200]}")
    finally:
        srv.stop()
    both = gen_model("qwen3moe", "q8_0", 15, vocab=vocab_with("both", (b"{% endfor %}", b"{% endfro %}"),
                                                             (b"<|im_start|>", b"<|turn_in|>:")))
    p = subprocess.run([f"{distlib.BIN}/moex-hub", "serve", "-m", both, "--local", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    check("neither: refused at start, the ways out named", p.returncode != 0 and "--chat-template-file" in p.stderr,
          f"rc={p.returncode} {p.stderr[-400:]}")
    srv = Serve(distlib.BIN, distlib.WORK, both, free_port(), ["--local", "--chat-template", "llama3", "--ctx", "64"])
    try:
        st, _, body = request(srv.port, "GET", "/status.json")
        check("  --chat-template overrides it", st == 200 and
              json.loads(body)["model"]["chat_template"] == "llama3 (built-in)", f"{st} {body[:200]}")
    finally:
        srv.stop()
    p = subprocess.run([f"{distlib.BIN}/moex-hub", "serve", "-m", MODEL, "--local", "--chat-template", "jinja"],
                       capture_output=True, text=True, timeout=60)
    check("an unknown --chat-template name: refused, the known ones listed",
          p.returncode != 0 and "chatml" in p.stderr and "llama3" in p.stderr, p.stderr[-300:])
    for args, what in ((["--parallel", "0"], "--parallel"), (["--bogus", "1"], "unknown option"), (["--port"], "value")):
        p = subprocess.run([f"{distlib.BIN}/moex-hub", "serve", "-m", MODEL, "--local", *args], capture_output=True,
                           text=True, timeout=60)
        check(f"serve {' '.join(args)}: exit 2 with a message", p.returncode == 2 and what in p.stderr, p.stderr[-300:])


finish_script()
