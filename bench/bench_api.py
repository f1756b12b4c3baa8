#!/usr/bin/python3
"""Serving speed through the OpenAI API of `moex-hub serve`: aggregate tokens/s
and time to first token at 1, 2, 4, 8, 16 concurrent streams, and one
stream through the API against the CLI's decode speed on the same model.

  bench_api.py --hub "CMD" [--worker "CMD"]... [--cli "CMD"] [options]

--hub     the server's command line; {port} is replaced by a free port, e.g.
          "build/bin/moex-hub serve -m M.gguf --local --parallel 16 --ctx 1024 --port {port}"
          ({tcp_port}: a second free port, for the hub's --tcp-port)
--worker  a worker's command line, started once the hub listens ({port} and {tcp_port} as above);
          repeat for more workers (the hub should wait for them: --min-workers N)
--cli     the CLI run to compare one stream with, e.g.
          "build/bin/moex-hub --local -m M.gguf --prompt-tokens {prompt} -n {n} --temp 0 --ignore-eos";
          {prompt} and {n} are filled in; its 'decode X tok/s' is read from stderr
--streams 1,2,4,8,16   --tokens 128   --prompt 32 (prompt tokens per stream)   --reps 1
--key K   the API key the hub wants   --smoke: 1 and 2 streams of 8 tokens (tests the script)
--logs DIR   keep the hub's stderr (DIR/hub.err: its metrics and layer timing at exit) and each worker's
          output (DIR/wN.err)

Each stream is a greedy streamed completion of a distinct token-id prompt
(ignore_eos, so every stream generates --tokens). Aggregate tokens/s is all
streams' tokens over the wall time from the first request to the last
token; TTFT is from sending a request to its first token (median and max
over the streams); per-stream decode is (tokens - 1) / (last - first token).
The CLI runs after the server and its workers have stopped, alone on the
machine as a user runs it. Prints a markdown table; exit 1 on a failed request.
"""
import argparse
import http.client
import json
import os
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import healthy, port as free_port  # noqa: E402


def wait_health(port, proc, timeout, err_tail, workers):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            time.sleep(0.2)
            sys.exit(f"bench_api: the hub exited with {proc.returncode}:\n{''.join(err_tail[-20:])}")
        gone = [w for w in workers if w.poll() is not None]
        if gone:
            gone[0].log.seek(0)
            sys.exit(f"bench_api: a worker exited with {gone[0].returncode}: {gone[0].log.read()[-1500:]}")
        if healthy(port):
            return
        time.sleep(0.2)
    sys.exit(f"bench_api: the hub was not healthy after {timeout} s")


def prompt_of(i, n):
    return [(1 + 7919 * (i + 1) * (k + 1)) % 30000 + 10 for k in range(n)]


def stream_one(port, key, prompt, n, out):
    """One streamed completion: records (t_sent, t_first, t_last, tokens)."""
    body = json.dumps({"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", body, headers)
    r = c.getresponse()
    if r.status != 200:
        out.update(error=f"{r.status} {r.read()[:300]!r}")
        return
    first = last = None
    tokens = 0
    while True:
        line = r.fp.readline()
        if not line:
            break
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        if ev.get("choices") and ev["choices"][0].get("text") is not None and ev["choices"][0]["finish_reason"] is None:
            now = time.perf_counter()
            first = first or now
            last = now
    c.close()
    out.update(t0=t0, first=first, last=last, tokens=tokens)


def run_level(port, key, n_streams, n_tokens, n_prompt, salt):
    results = [{} for _ in range(n_streams)]
    threads = [threading.Thread(target=stream_one, args=(port, key, prompt_of(salt + i, n_prompt), n_tokens, results[i]))
               for i in range(n_streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r["error"] for r in results if "error" in r or r.get("first") is None]
    if bad:
        sys.exit(f"bench_api: a request failed: {bad[0]}")
    start = min(r["t0"] for r in results)
    end = max(r["last"] for r in results)
    total = sum(r["tokens"] for r in results)
    ttft = [r["first"] - r["t0"] for r in results]
    per = [(r["tokens"] - 1) / (r["last"] - r["first"]) for r in results if r["last"] > r["first"]]
    return {"streams": n_streams, "agg": total / (end - start), "ttft_med": statistics.median(ttft),
            "ttft_max": max(ttft), "per_stream": statistics.median(per) if per else 0.0, "tokens": total,
            "wall": end - start}


def cli_decode(cli, n_prompt, n_tokens):
    cmd = cli.replace("{prompt}", ",".join(map(str, prompt_of(10_000, n_prompt)))).replace("{n}", str(n_tokens))
    p = subprocess.run(shlex.split(cmd), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                       errors="replace")
    m = re.search(r"decode \d+ tokens ([\d.]+) tok/s", p.stderr)
    if p.returncode or not m:
        sys.exit(f"bench_api: the CLI run failed: {p.stderr[-500:]}")
    return float(m.group(1))


def keep_logs(where, hub, err_tail, workers):
    os.makedirs(where, exist_ok=True)
    time.sleep(0.2)  # the reader thread's last lines
    with open(os.path.join(where, "hub.err"), "w") as f:
        f.write("".join(err_tail))
    for i, w in enumerate(workers):
        w.log.seek(0)
        with open(os.path.join(where, f"w{i}.err"), "w") as f:
            f.write(w.log.read())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hub", required=True)
    ap.add_argument("--worker", action="append", default=[])
    ap.add_argument("--cli")
    ap.add_argument("--streams", default="1,2,4,8,16")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--key")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--logs")
    ap.add_argument("--start-timeout", type=float, default=600)
    a = ap.parse_args()
    if a.smoke:
        a.streams, a.tokens, a.prompt = "1,2", 8, 8
    levels = [int(x) for x in a.streams.split(",")]
    port, tcp_port = free_port(), free_port()
    fill = lambda cmd: cmd.replace("{port}", str(port)).replace("{tcp_port}", str(tcp_port))
    hub = subprocess.Popen(shlex.split(fill(a.hub)), stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    err_tail = []
    threading.Thread(target=lambda: [err_tail.append(l) for l in hub.stderr], daemon=True).start()
    workers = []
    try:
        time.sleep(0.5)
        for w in a.worker:
            log = tempfile.TemporaryFile("w+")
            workers.append(subprocess.Popen(shlex.split(fill(w)), stdout=log,
                                            stderr=subprocess.STDOUT, text=True))
            workers[-1].log = log
        wait_health(port, hub, a.start_timeout, err_tail, workers)
        run_level(port, a.key, 1, min(8, a.tokens), a.prompt, 99_000)  # warm-up
        rows = []
        for n in levels:
            reps = [run_level(port, a.key, n, a.tokens, a.prompt, 1000 * r + 100 * n) for r in range(a.reps)]
            rows.append(max(reps, key=lambda x: x["agg"]))
    finally:
        for p in [hub] + workers:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in [hub] + workers:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if a.logs:
            keep_logs(a.logs, hub, err_tail, workers)
    cli = cli_decode(a.cli, a.prompt, a.tokens) if a.cli else None
    one = rows[0]["agg"] if rows and rows[0]["streams"] == 1 else None
    print(f"hub: {a.hub}")
    for w in a.worker:
        print(f"worker: {w}")
    print(f"{a.prompt} prompt tokens, {a.tokens} generated per stream, greedy, best of {a.reps}\n")
    print("| streams | aggregate tok/s | x one stream | TTFT median s | TTFT max s | per-stream decode tok/s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        x = f"{r['agg'] / one:.2f}" if one else "-"
        print(f"| {r['streams']} | {r['agg']:.1f} | {x} | {r['ttft_med']:.3f} | {r['ttft_max']:.3f} | "
              f"{r['per_stream']:.1f} |")
    if cli is not None and rows and rows[0]["streams"] == 1:
        api = rows[0]["per_stream"]
        print(f"\none stream: API decode {api:.1f} tok/s, CLI decode {cli:.1f} tok/s: API/CLI = {api / cli:.3f}")


if __name__ == "__main__":
    main()
