#!/usr/bin/python3
"""Benchmark (not a test): speculative decoding on the shipped model and its
draft (train/model/brown-moe-q8_0.gguf, brown-moe-draft-q8_0.gguf).

  accept   held-out Brown text (train/brown-heldout.txt): PROMPTS prompts, each
           the first 24 words of a paragraph; 64 tokens after each, --local on
           the CPU with 8 drafts every step, greedy and at temperature 0.8:
           tokens per verify (accepted drafts + the verify's own token), over
           the first 64 tokens, and the greedy tokens against the plain run's
  dist     hub + 3 CPU workers, each behind its own moex-relay (RTT 0.5 ms by
           default): decode tok/s without speculation, with --draft-model, and
           --lookup on a prompt whose answer repeats it; tokens against the plain run
  local    --draft-model and --lookup --local, each against the plain run (runs alternating, the
           median of MOEX_BENCH_REPS), on each of MOEX_BENCH_BACKENDS: where speculation does not pay,
           how much the auto-off leaves of the plain speed

usage: bench/bench_spec.py BUILD_DIR [accept] [dist] [local]
env: MOEX_BENCH_RTT_MS (0.5), MOEX_BENCH_PROMPTS (16), MOEX_BENCH_N (64), MOEX_BENCH_THREADS (1 a worker),
     MOEX_BENCH_BACKENDS ("cpu"), MOEX_BENCH_REPS (3)
"""
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench"))
from benchlib import heldout_passages, port  # noqa: E402
BIN = os.path.join(os.path.abspath(sys.argv[1]), "bin")
STEPS = sys.argv[2:] or ["accept", "dist", "local"]
MODEL = os.path.join(REPO, "train", "model", "brown-moe-q8_0.gguf")
DRAFT = os.path.join(REPO, "train", "model", "brown-moe-draft-q8_0.gguf")
RTT = float(os.environ.get("MOEX_BENCH_RTT_MS", "0.5"))
N = int(os.environ.get("MOEX_BENCH_N", "64"))
THREADS = os.environ.get("MOEX_BENCH_THREADS", "1")
REPEAT = ("The committee said the city would build a new school next year, and the board agreed to pay for it. "
          "Repeat: The committee said the city would build")


def prompts(k):
    return heldout_passages(k, 40, 24)


def stats(err):
    m = re.search(r"speculative: (\d+) verifies, (\d+) drafted, (\d+) accepted", err)
    return tuple(int(x) for x in m.groups()) if m else (0, 0, 0)


def decode_rate(err):
    m = re.search(r"decode (\d+) tokens ([\d.]+) tok/s", err)
    return float(m.group(2)) if m else 0.0


def hub(args, prompt, n=N, temp="0", extra_env=None):
    p = subprocess.run([f"{BIN}/moex-hub", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", temp, "--seed", "7",
                        "--ignore-eos", "--print-tokens", *args], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, **(extra_env or {})))
    if p.returncode:
        sys.exit(f"bench_spec: moex-hub failed: {p.stderr[-1500:]}")
    return p.stdout.split(), p.stderr


def accept():
    ps = prompts(int(os.environ.get("MOEX_BENCH_PROMPTS", "16")))
    for temp in ("0", "0.8"):
        v = d = a = same = 0
        for pr in ps:
            # 8 drafts every step (--draft-min): acceptance, not whether drafting pays on this CPU
            toks, err = hub(["--local", "-t", "2", "--draft-model", DRAFT, "--draft-min", "8"], pr, temp=temp)
            s = stats(err)
            v, d, a = v + s[0], d + s[1], a + s[2]
            if temp == "0":
                ref, _ = hub(["--local", "-t", "2"], pr)
                same += ref == toks
        line = (f"accept temp {temp}: {len(ps)} held-out prompts x {N} tokens: {v} verifies, {d} drafted, {a} accepted "
                f"({100 * a / max(d, 1):.1f} %), tokens per verify {(a + v) / max(v, 1):.2f}")
        print(line + (f", greedy tokens equal the plain run's in {same}/{len(ps)}" if temp == "0" else ""), flush=True)


def cluster_run(args, prompt, tag, temp="0"):
    """hub + 3 workers, each behind a relay at RTT; returns (tokens, decode tok/s, stats). A second try when the
    first fails (a port chosen free can be taken before the relay binds it)."""
    try:
        return cluster_once(args, prompt, tag, temp)
    except SystemExit as e:
        print(f"bench_spec: retrying once: {str(e)[-200:]}", flush=True)
        return cluster_once(args, prompt, tag, temp)


def cluster_once(args, prompt, tag, temp):
    hp = port()
    procs = []
    for i in range(3):
        rp = port()
        procs.append(subprocess.Popen([f"{BIN}/moex-relay", "--listen", str(rp), "--to", f"127.0.0.1:{hp}",
                                       "--rtt-ms", str(RTT)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(0.1)
        procs.append(subprocess.Popen([f"{BIN}/moex-worker", "--hub", f"ws://127.0.0.1:{rp}/ws", "--token", "bench",
                                       "--model", MODEL, "--threads", THREADS, "--name", f"{tag}{i}"],
                                      stderr=subprocess.DEVNULL))
    try:
        toks, err = hub(["--port", str(hp), "--token", "bench", "--min-workers", "3", "--wait-s", "20", "--replicas", "1",
                         "-t", "2",
                         *args], prompt, temp=temp)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()
    return toks, decode_rate(err), stats(err)


def echo_prompt():
    """A prompt whose answer repeats part of it (as in summaries, edits, RAG): a held-out passage P, the model's own
    64-token greedy continuation C, a blank line, then P again, after which the model tends to produce C again."""
    p = prompts(3)[2]
    c = subprocess.run([f"{BIN}/moex-hub", "--local", "-m", MODEL, "-p", p, "-n", "64", "--temp", "0", "-t", "2"],
                       capture_output=True, text=True, timeout=120).stdout.rstrip("\n")
    return f"{p}{c}\n\n{p}"


def dist():
    """Held-out prompts (MOEX_BENCH_DIST_PROMPTS, 4), the repeat prompt and the echo prompt; greedy, then
    temperature 0.8."""
    cases = [(f"held-out prompt {i}", p) for i, p in enumerate(prompts(int(os.environ.get("MOEX_BENCH_DIST_PROMPTS",
                                                                                            "4"))))]
    cases.append(("repeat prompt", REPEAT))
    cases.append(("echo prompt", echo_prompt()))
    flags = (["--draft-model", DRAFT], ["--lookup"], ["--lookup", "--draft-model", DRAFT])
    for temp in ("0", "0.8"):
        ratios = {i: [] for i in range(len(flags))}
        for name, prompt in cases:
            ref, r0, _ = cluster_run([], prompt, "p", temp)
            line = f"dist RTT {RTT} ms, temp {temp}, {name}: plain {r0:.1f} tok/s"
            for i, flag in enumerate(flags):
                toks, r, s = cluster_run(flag, prompt, "s", temp)
                if name.startswith("held-out"):
                    ratios[i].append(r / max(r0, 1e-9))
                same = "" if temp != "0" else ", tokens equal" if toks == ref else ", tokens DIFFER"
                line += (f" | {' '.join(os.path.basename(f) for f in flag)} {r:.1f} ({r / max(r0, 1e-9):.2f}x, "
                         f"{(s[2] + s[0]) / max(s[0], 1):.2f} a verify{same})")
            print(line, flush=True)
        for i, flag in enumerate(flags):
            g = 1.0
            for x in ratios[i]:
                g *= x
            print(f"dist RTT {RTT} ms, temp {temp}, held-out prompts: {' '.join(os.path.basename(f) for f in flag)}: "
                  f"geometric mean speedup {g ** (1 / max(len(ratios[i]), 1)):.2f}x", flush=True)


def local():
    pr = prompts(1)[0]
    reps = int(os.environ.get("MOEX_BENCH_REPS", "3"))
    threads = ["-t", os.environ.get("MOEX_BENCH_LOCAL_THREADS", "2")]
    for be in os.environ.get("MOEX_BENCH_BACKENDS", "cpu").split():
        for name, prompt in (("held-out prompt", pr), ("repeat prompt", REPEAT)):
            for flag in (["--draft-model", DRAFT], ["--lookup"]):
                plain, spec, same, s = [], [], True, (0, 0, 0)
                for _ in range(reps):
                    ref, err = hub(["--local", "--backend", be, *threads], prompt)
                    plain.append(decode_rate(err))
                    toks, err = hub(["--local", "--backend", be, *threads, *flag], prompt)
                    spec.append(decode_rate(err))
                    s, same = stats(err), same and toks == ref
                p0, p1 = sorted(plain)[reps // 2], sorted(spec)[reps // 2]
                print(f"local {be}, {name}, {N} tokens: {' '.join(os.path.basename(f) for f in flag)}: {p1:.1f} tok/s "
                      f"against {p0:.1f} plain ({p1 / max(p0, 1e-9):.3f}x; medians of {reps}, runs {spec} / {plain}), "
                      f"{s[0]} verifies, tokens per verify {(s[2] + s[0]) / max(s[0], 1):.2f}, "
                      f"tokens {'equal' if same else 'DIFFER'}", flush=True)


print(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%dT%H:%MZ', time.gmtime())}")
for step in STEPS:
    {"accept": accept, "dist": dist, "local": local}[step]()
