#!/usr/bin/python3
"""Benchmark (not a test): the prompt cache of `moex-hub serve` on multi-turn
requests. CHATS conversations, each a held-out Brown passage (~400 tokens,
train/brown-heldout.txt) and a question, then a second turn that repeats the
history (passage, question, the first answer) and asks another: what a chat
client or an agent sends. Through /v1/chat/completions (the shipped model's
ChatML template), greedy, 16 tokens a turn, streamed: time to first token of
each turn, on a server with the prompt cache (the default) and one with
--no-prompt-cache, and whether both servers' answers are the same.

usage: bench/bench_prompt_cache.py BUILD_DIR [SERVE_ARGS...]   (default --local -t 2)
env: MOEX_BENCH_CHATS (10), MOEX_BENCH_MODEL (the shipped model), MOEX_BENCH_WORDS (words of each passage at
most, 260: the shipped model's 512-token context), MOEX_BENCH_CTX (1024; capped at the model's)
"""
import http.client
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from benchlib import heldout_passages, port, wait_healthy  # noqa: E402
BIN = os.path.join(os.path.abspath(sys.argv[1]), "bin")
ARGS = sys.argv[2:] or ["--local", "-t", "2"]
MODEL = os.environ.get("MOEX_BENCH_MODEL", os.path.join(REPO, "train", "model", "brown-moe-q8_0.gguf"))
CHATS = int(os.environ.get("MOEX_BENCH_CHATS", "10"))
WORDS = int(os.environ.get("MOEX_BENCH_WORDS", "260"))   # turn 2 (~60 more tokens) fits the shipped model's 512
CTX = os.environ.get("MOEX_BENCH_CTX", "1024")


def passages(k):
    """k passages: held-out paragraphs of 120 words or more, joined with the next ones up to WORDS words."""
    paras = heldout_passages(4 * k, 120, 100000)
    out = []
    for i in range(k):
        words = []
        for p in paras[i:]:
            words += p.split()
            if len(words) >= WORDS:
                break
        out.append(" ".join(words[:WORDS]))
    return out


def stream(p, messages):
    """(text, seconds to the first text chunk, usage) of a streamed greedy chat answer."""
    c = http.client.HTTPConnection("127.0.0.1", p, timeout=120)
    body = json.dumps({"messages": messages, "max_tokens": 16, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    t0 = time.time()
    c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text, ttft, usage = "", None, {}
    for line in r:
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        d = json.loads(line[6:])
        if d.get("choices") and d["choices"][0]["delta"].get("content"):
            if ttft is None:
                ttft = time.time() - t0
            text += d["choices"][0]["delta"]["content"]
        if d.get("usage"):
            usage = d["usage"]
    c.close()
    return text, ttft or (time.time() - t0), usage


def run(extra):
    p = port()
    log = open(os.path.join("/tmp", f"bench-prompt-cache-{p}.log"), "w")
    srv = subprocess.Popen([f"{BIN}/moex-hub", "serve", "-m", MODEL, "--port", str(p), "--parallel", "2", "--ctx",
                            CTX, *ARGS, *extra], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(p, srv, 600, "bench_prompt_cache")
        out = []
        for doc in passages(CHATS):
            turn1 = [{"role": "user", "content": f"{doc}\n\nWhat is this passage about?"}]
            a1, t1, u1 = stream(p, turn1)
            turn2 = [*turn1, {"role": "assistant", "content": a1}, {"role": "user", "content": "Who is named in it?"}]
            a2, t2, u2 = stream(p, turn2)
            out.append((a1, a2, t1, t2, u1.get("prompt_tokens"), u2.get("prompt_tokens"),
                        u2.get("prompt_tokens_details", {}).get("cached_tokens")))
        return out
    finally:
        srv.terminate()
        srv.wait()


cached, plain = run([]), run(["--no-prompt-cache"])
print(f"machine: {os.cpu_count()} cores, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}, serve {' '.join(ARGS)}, "
      f"{os.path.basename(MODEL)}")
same = sum((c[0], c[1]) == (p[0], p[1]) for c, p in zip(cached, plain))
for i, (c, p) in enumerate(zip(cached, plain)):
    print(f"chat {i}: prompts {c[4]} / {c[5]} tokens, cached {c[6]}; ttft turn 1 {c[2] * 1e3:.1f} ms, turn 2 "
          f"{c[3] * 1e3:.1f} ms ({c[3] / c[2]:.2f} of turn 1); without the cache {p[2] * 1e3:.1f} / {p[3] * 1e3:.1f} ms")
r = sorted(c[3] / c[2] for c in cached)
rp = sorted(p[3] / p[2] for p in plain)
print(f"second turn's ttft / first turn's: median {r[len(r) // 2]:.3f}, worst {r[-1]:.3f} with the cache; median "
      f"{rp[len(rp) // 2]:.3f} without; answers equal in {same}/{len(cached)} chats")
