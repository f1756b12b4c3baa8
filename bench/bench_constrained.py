#!/usr/bin/python3
"""Benchmark (not a test): what constrained sampling costs a decode in
`moex-hub serve`. For each of K held-out Brown passages (train/brown-heldout.txt)
as a chat question, one greedy answer unconstrained (ignore_eos, max_tokens N),
the same with its logits rows read back (a zero logit_bias: what a grammar
request pays before any grammar work), one with response_format
json_object and one with a json_schema (a Pydantic-style object), on the
same server, the passage in the prompt cache
(a warm-up request). The figure is the request's time per completion token,
so answers of different lengths compare; the medians take answers of 32
tokens or more (a shorter one's figure is mostly the request's fixed cost:
HTTP, the first forward), after a discarded round on the first passage (the
GPU's clocks, first recordings). Prints one line per run (with the share of
its tokens whose first pick the grammar refused, from /metrics) and the
medians.

usage: bench/bench_constrained.py BUILD_DIR MODEL [SERVE_ARGS...]   (default --local -t 2)
env: MOEX_BENCH_K (6), MOEX_BENCH_TOKENS (96)
"""
import http.client
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from benchlib import heldout_passages, port, wait_healthy  # noqa: E402
BIN = os.path.join(os.path.abspath(sys.argv[1]), "bin")
MODEL = sys.argv[2]
ARGS = sys.argv[3:] or ["--local", "-t", "2"]
K = int(os.environ.get("MOEX_BENCH_K", "6"))
N = int(os.environ.get("MOEX_BENCH_TOKENS", "96"))
SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string"}, "year": {"type": "integer"}, "people": {"type": "array", "items": {
        "type": "object", "properties": {"name": {"type": "string"}, "role": {"type": "string"}},
        "required": ["name", "role"]}}, "summary": {"type": "string"}},
    "required": ["title", "year", "people", "summary"]}


def answer(p, body):
    """(completion tokens, seconds per token) of a whole chat answer: the request's time over its tokens (the
    prompt is in the prompt cache from a warm-up request: one token of it is evaluated)."""
    c = http.client.HTTPConnection("127.0.0.1", p, timeout=600)
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read()
    t = time.perf_counter() - t0
    if r.status != 200:
        sys.exit(f"HTTP {r.status}: {raw[:300]!r}")
    n = json.loads(raw)["usage"]["completion_tokens"]
    return n, t / n


def masked(p):
    """(grammar tokens, masked ones) so far, from /metrics."""
    c = http.client.HTTPConnection("127.0.0.1", p, timeout=60)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    val = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("moex_grammar")}
    return val.get("moex_grammar_tokens_total", 0), val.get("moex_grammar_masked_tokens_total", 0)


def main():
    p = port()
    log = open(os.path.join("/tmp", f"bench-constrained-{p}.log"), "w")
    srv = subprocess.Popen([f"{BIN}/moex-hub", "serve", "-m", MODEL, "--port", str(p), "--parallel", "1", *ARGS],
                           stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(p, srv, 900, "bench_constrained")
        runs = {"free": [], "free_rows": [], "json_object": [], "json_schema": []}
        passages = heldout_passages(K, 60, 80)
        for i, passage in enumerate([passages[0], *passages]):
            warm = i == 0
            msgs = [{"role": "user", "content": f"{passage}\nDescribe this text."}]
            base = {"messages": msgs, "temperature": 0, "max_tokens": N}
            answer(p, {**base, "max_tokens": 1})   # warm: the prompt cache has the passage
            for name, extra in (("free", {"ignore_eos": True}),
                                ("free_rows", {"ignore_eos": True, "logit_bias": {"0": 0}}),
                                ("json_object", {"response_format": {"type": "json_object"}}),
                                ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {
                                    "name": "doc", "schema": SCHEMA}}})):
                g0, m0 = masked(p)
                n, s = answer(p, {**base, **extra})
                g1, m1 = masked(p)
                if not warm and n >= 32:
                    runs[name].append(s)
                share = f"  {100 * (m1 - m0) / (g1 - g0):5.1f} % masked" if g1 > g0 else ""
                tag = "warm-up" if warm else f"passage {i - 1}"
                print(f"{tag:10s} {name:12s} {n:4d} tokens  {1000 * s:7.3f} ms/token{share}", flush=True)
        free = statistics.median(runs["free"])
        print(f"median free {1000 * free:.3f} ms/token")
        for name in ("free_rows", "json_object", "json_schema"):
            m = statistics.median(runs[name])
            print(f"median {name} {1000 * m:.3f} ms/token ({100 * (m / free - 1):+.1f} % against free)")
    finally:
        srv.terminate()
        srv.wait(60)


main()
