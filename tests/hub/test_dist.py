#!/usr/bin/python3
"""Distributed inference end to end: a real hub and real workers, as separate
processes talking WebSockets on loopback. Each scenario asserts the tokens the
hub prints (greedy) equal what --local prints for the same model.

usage: test_dist.py BIN_DIR VOCAB_DIR WORK_DIR [scenario ...]
"""
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distlib import (Cluster, check, finish_script, gen_model, local_tokens, metric, run_hostile_clients,  # noqa: E402
                     scenario, setup)

setup(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
MOE = gen_model("qwen3moe", "q8_0", 11)
MIX = gen_model("mixtral", "q4_K_M", 12)
N = 24          # tokens per run
N_TIMED = 96    # timing comparisons: long enough that one-off costs (discovering a slow worker) amortise
REF = {m: local_tokens(m, N) for m in (MOE, MIX)}
REF_TIMED = local_tokens(MOE, N_TIMED)


@scenario
def matches_local():
    for model in (MOE, MIX):
        c = Cluster(model, 3, N, hub_args=["--replicas", "2"])
        rc, toks, err = c.finish()
        check(f"3 workers r=2 equal --local ({os.path.basename(model)})", rc == 0 and toks == REF[model],
              f"rc={rc} got={toks[:6]} want={REF[model][:6]}" + ("" if rc == 0 else err[-2000:]))
        fb = metric(err, "fallbacks")
        check("  no expert fell back to the hub", fb == 0, f"fallbacks={fb}")


@scenario
def worker_deaths():
    # w0 exits abruptly after 30 dispatches; w1 is SIGKILLed once 8 tokens are out.
    # Every worker answers 10 ms late so that generation lasts long enough to kill into.
    slow = ["--inject-delay-ms", "10", "--inject-delay-prob", "1"]
    c = Cluster(MOE, 3, N, hub_args=["--replicas", "2"], worker_args=[["--inject-exit-after", "30"] + slow, slow, slow])
    killed_at = []
    def killer():
        while c.hub.poll() is None and c.tokens_so_far() < 8:
            time.sleep(0.002)
        killed_at.append(c.tokens_so_far())
        c.workers[1].send_signal(signal.SIGKILL)
    threading.Thread(target=killer, daemon=True).start()
    rc, toks, err = c.finish()
    check("abrupt exit + SIGKILL cost no token", rc == 0 and toks == REF[MOE], f"rc={rc} {err[-1500:] if rc else ''}")
    check("  the kill landed mid-generation", killed_at and killed_at[0] < N, f"after {killed_at} tokens")
    check("  the abrupt exit happened", c.workers[0].returncode not in (0, None), f"rc={c.workers[0].returncode}")


@scenario
def all_but_one_gone():
    c = Cluster(MOE, 3, N, hub_args=["--replicas", "2"],
                worker_args=[["--inject-exit-after", "4"], ["--inject-exit-after", "9"], []])
    rc, toks, err = c.finish()
    check("all workers but one gone: still correct", rc == 0 and toks == REF[MOE], f"rc={rc} {err[-1500:] if rc else ''}")


def timed_run(hub_args, worker_args, n_tokens, n_workers=3):
    c = Cluster(MOE, n_workers, n_tokens, hub_args=hub_args, worker_args=worker_args)
    t0 = time.time()
    rc, toks, err = c.finish()
    # the generation's own time: from the stats line
    dec = None
    for line in err.splitlines():
        if line.startswith("moex-hub: load"):
            parts = line.split("|")
            pt = float(parts[1].split()[1]) / max(float(parts[1].split()[3]), 1e-9)
            dt = float(parts[2].split()[1]) / max(float(parts[2].split()[3]), 1e-9)
            dec = pt + dt
    return rc, toks, dec if dec is not None else time.time() - t0, err


@scenario
def stragglers_hedge2():
    slow = ["--inject-delay-ms", "100", "--inject-delay-prob", "0.1"]
    wa = [slow + ["--seed", str(i)] for i in range(3)]
    rc1, t1, s1, e1 = timed_run(["--replicas", "3", "--hedge", "1"], wa, N_TIMED)
    rc2, t2, s2, e2 = timed_run(["--replicas", "3", "--hedge", "2"], wa, N_TIMED)
    check("stragglers: same tokens with h=1 and h=2", rc1 == 0 and rc2 == 0 and t1 == REF_TIMED and t2 == REF_TIMED)
    check("stragglers: h=2 takes at most half the time of h=1", s2 <= 0.5 * s1, f"h1={s1:.3f}s h2={s2:.3f}s")


@scenario
def slow_worker_hedge_auto():
    rc0, t0, s0, _ = timed_run(["--replicas", "3", "--hedge", "auto"], [[], [], []], N_TIMED)
    slow = [["--inject-delay-ms", "150", "--inject-delay-prob", "1"], [], []]
    rc1, t1, s1, e1 = timed_run(["--replicas", "3", "--hedge", "auto"], slow, N_TIMED)
    check("slow worker, hedge auto: same tokens", rc0 == 0 and rc1 == 0 and t0 == REF_TIMED and t1 == REF_TIMED)
    # Plus two of the slow worker's delays: the hub learns its latency from the first dispatches, a one-off
    # cost that 96 tokens no longer amortise now that the base run takes ~0.3 s (without hedging the
    # slow worker would add up to 150 ms a token, seconds in all).
    check("slow worker, hedge auto: within 1.5x of no delay (+ 0.3 s to learn)", s1 <= 1.5 * s0 + 0.3,
          f"base={s0:.3f}s slow={s1:.3f}s")


@scenario
def hostile_input():
    # every worker 40 ms late: generation lasts ~8 s, while the hostile clients connect
    slow = ["--inject-delay-ms", "40", "--inject-delay-prob", "1"]
    c = Cluster(MOE, 3, N_TIMED, hub_args=["--replicas", "2"], worker_args=[slow, slow, slow])
    while c.tokens_so_far() < 1 and c.hub.poll() is None:
        time.sleep(0.01)
    refused, closed, total = run_hostile_clients(c.port)
    during = c.hub.poll() is None and c.tokens_so_far() < N_TIMED
    rc, toks, err = c.finish()
    check("hostile clients ran during generation", during)
    check("wrong token refused", refused and "wrong or missing token" in err)
    check("malformed/text/oversized frames rejected", closed == total, f"{closed}/{total}")
    check("hub survives hostile clients with unchanged output", rc == 0 and toks == REF_TIMED, f"rc={rc}")


@scenario
def corrupt_worker_evicted():
    c = Cluster(MOE, 3, N, hub_args=["--replicas", "2", "--verify", "1"],
                worker_args=[["--inject-corrupt-prob", "0.2", "--seed", "5"], [], []])
    rc, toks, err = c.finish()
    check("corrupt worker: output unchanged", rc == 0 and toks == REF[MOE], f"rc={rc}")
    check("corrupt worker: evicted", "evicted" in err and (metric(err, "evictions") or 0) >= 1,
          f"evictions={metric(err, 'evictions')}")


finish_script()
