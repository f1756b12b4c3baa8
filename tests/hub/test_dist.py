#!/usr/bin/python3
"""Distributed inference end to end: a real hub and real workers, as separate
processes talking WebSockets on loopback. Each scenario asserts the tokens the
hub prints (greedy) equal what --local prints for the same model.

usage: test_dist.py BIN_DIR VOCAB_DIR WORK_DIR [scenario ...]
"""
import os
import re
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distlib  # noqa: E402
from distlib import (Cluster, check, finish_script, free_port, gen_model, local_tokens, metric,  # noqa: E402
                     run_hostile_clients, scenario, setup, stops_within, tcp_hostile_peers)

setup(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "train", "model", "brown-moe-q8_0.gguf")
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
        if model == MOE:
            d, m = metric(err, "dispatches"), metric(err, "messages")
            check("  a worker's DISPATCHes of a prompt layer share a message", d and m and m < d, f"{d} {m}")


@scenario
def split_messages():
    # --split-bytes 1: every DISPATCH leaves as a message of its own (a prompt layer's message is
    # cut at 256 KiB by default); the worker answers each apart and computes them as they come.
    # A 40-token prompt: its layers are timed apart from the decode's.
    prompt = ",".join(str(7 + 97 * i) for i in range(40))
    ref = local_tokens(MOE, N, prompt)
    c = Cluster(MOE, 3, N, hub_args=["--replicas", "2", "--split-bytes", "1"], prompt=prompt)
    rc, toks, err = c.finish()
    check("every frame its own message: tokens equal --local", rc == 0 and toks == ref,
          f"rc={rc} got={toks[:6]} want={ref[:6]}" + ("" if rc == 0 else err[-2000:]))
    d, m = metric(err, "dispatches"), metric(err, "messages")
    check("  one message per DISPATCH", d and m == d, f"dispatches={d} messages={m}")
    lines = re.findall(r"^hub layer timing(, layers of over 16 tokens)? \(us, p50/p99 over (\d+)(?: layers)?\):", err, re.M)
    check("  the hub's timing: all layers, then the prompt's apart (one forward: a layer each)",
          len(lines) == 2 and not lines[0][0] and lines[1][0] and 0 < int(lines[1][1]) < int(lines[0][1]), f"{lines}")


@scenario
def tcp_transport():
    # Two workers on the hub's --tcp-port (frames on a plain TCP stream), one on its WebSocket, every worker
    # 40 ms late so that the hostile TCP peers below connect while the hub generates (~8 s).
    tcp_port = free_port()
    slow = ["--inject-delay-ms", "40", "--inject-delay-prob", "1"]
    c = Cluster(MOE, 0, N_TIMED, hub_args=["--replicas", "2", "--tcp-port", str(tcp_port)], min_workers=3)
    c.start_worker("t0", slow, {"MOEX_LOG": "info"}, port=tcp_port, scheme="tcp")
    c.start_worker("t1", slow, {"MOEX_LOG": "info"}, port=tcp_port, scheme="tcp")
    c.start_worker("w2", slow)
    while c.tokens_so_far() < 1 and c.hub.poll() is None:
        time.sleep(0.01)
    wrong = subprocess.run([f"{distlib.BIN}/moex-worker", "--hub", f"tcp://127.0.0.1:{tcp_port}", "--token", "wrong",
                            "--model", MOE, "--threads", "1", "--reconnect-max-s", "10"],
                           capture_output=True, text=True, timeout=60)
    peers = tcp_hostile_peers(tcp_port)
    during = c.hub.poll() is None and c.tokens_so_far() < N_TIMED
    rc, toks, err = c.finish()
    check("tcp:// and ws:// workers together: tokens equal --local", rc == 0 and toks == REF_TIMED,
          f"rc={rc} got={toks[:6]} want={REF_TIMED[:6]}" + ("" if rc == 0 else err[-2000:]))
    logs = c.worker_logs()
    check("  the tcp:// workers joined over TCP and computed",
          all("connected to the hub tcp://" in l and re.search(r"moex-worker: [1-9]\d* dispatches", l) for l in logs[:2]),
          " | ".join(l[-300:] for l in logs[:2]))
    check("  a tcp:// worker with a wrong token exits at once, saying so",
          wrong.returncode == 1 and "check --token" in wrong.stderr, f"rc={wrong.returncode} {wrong.stderr[-400:]}")
    check("  the hostile TCP peers connected during generation", during)
    refused = {w: (closed, codes) for w, closed, codes in peers}
    check("  HTTP, a wrong token, JOIN before AUTH: ERROR 9 (unauthorized), then the close",
          all(refused[w] == (True, [9]) for w in ("HTTP", "wrong token", "JOIN before AUTH")), f"{peers}")
    check("  silence: closed after the hub's 5 s, no ERROR", refused["silence"] == (True, []), f"{peers}")
    check("  after AUTH, a bad magic and a frame over the limit: an ERROR (bad frame), then the close",
          all(refused[w][0] and refused[w][1] and refused[w][1][0] < 0 for w in ("bad magic", "over the frame limit")),
          f"{peers}")
    check("  the hub counted the refusals", (metric(err, "refused") or 0) >= 3, f"refused={metric(err, 'refused')}")


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
    # w2 survives with every expert of the departed (r=2 of 3, then 2 of 2): failover, not the hub's fallback
    rd, fb = metric(err, "re-dispatches"), metric(err, "fallbacks")
    check("  lost tasks went to the surviving replica", (rd or 0) >= 1 and fb == 0, f"re-dispatches={rd} fallbacks={fb}")
    sent, won = metric(err, "hedges sent"), metric(err, "won")
    check("  --hedge 1: no hedge sent, none won (a re-dispatch's answer is no hedge's)", sent == 0 and won == 0,
          f"sent={sent} won={won}")


@scenario
def all_but_one_gone():
    # r=3: the last worker holds every expert, so nothing may fall back to the hub (--no-local-fallback)
    c = Cluster(MOE, 3, N, hub_args=["--replicas", "3", "--no-local-fallback"],
                worker_args=[["--inject-exit-after", "4"], ["--inject-exit-after", "9"], []])
    rc, toks, err = c.finish()
    check("all workers but one gone: still correct", rc == 0 and toks == REF[MOE], f"rc={rc} {err[-1500:] if rc else ''}")
    rd, fb = metric(err, "re-dispatches"), metric(err, "fallbacks")
    check("  lost tasks re-dispatched to the survivor, none computed on the hub", (rd or 0) >= 1 and fb == 0,
          f"re-dispatches={rd} fallbacks={fb}")


@scenario
def hung_worker():
    # SIGSTOP: the worker's connection stays open, its answers never come. The per-expert deadline must move
    # its tasks to another replica (timeouts counted); with a deadline longer than the run, the heartbeat
    # silence (3 s) must remove it instead.
    slow = ["--inject-delay-ms", "10", "--inject-delay-prob", "1"]
    for timeout_ms, what in ((200, "deadline"), (60000, "heartbeat silence")):
        c = Cluster(MOE, 3, N_TIMED, hub_args=["--replicas", "2", "--timeout-ms", str(timeout_ms)],
                    worker_args=[slow] * 3)
        while c.tokens_so_far() < 3 and c.hub.poll() is None:
            time.sleep(0.005)
        c.workers[1].send_signal(signal.SIGSTOP)
        t0 = time.time()
        try:
            c.hub.wait(timeout=60)
        except Exception:
            pass
        wall = time.time() - t0
        c.workers[1].send_signal(signal.SIGCONT)
        rc, toks, err = c.finish()
        to, rd = metric(err, "timeouts"), metric(err, "re-dispatches")
        check(f"hung worker ({what}): output equals --local", rc == 0 and toks == REF_TIMED,
              f"rc={rc} {err[-1500:] if rc else ''}")
        if timeout_ms < 1000:
            check("  its tasks timed out and went elsewhere", (to or 0) >= 1 and (rd or 0) >= 1,
                  f"timeouts={to} re-dispatches={rd}")
            check("  bounded wall time (< 10 s)", wall < 10, f"{wall:.1f} s")
        else:
            check("  removed for silence, its tasks re-dispatched", "silent" in err and (rd or 0) >= 1 and to == 0,
                  f"timeouts={to} re-dispatches={rd}")
            check("  long before the 60 s deadline (< 20 s)", wall < 20, f"{wall:.1f} s")


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
    d, rd, sent, won = (metric(e2, k) for k in ("dispatches", "re-dispatches", "hedges sent", "won"))
    check("  h=2: one hedge sent with every task (dispatches - re-dispatches = 2 x hedges), won <= sent",
          sent and d - rd == 2 * sent and won <= sent, f"dispatches={d} re-dispatches={rd} sent={sent} won={won}")


@scenario
def slow_worker_hedge_auto():
    slow = [["--inject-delay-ms", "150", "--inject-delay-prob", "1"], [], []]
    rc1, t1, s1, e1 = timed_run(["--replicas", "3", "--hedge", "auto"], slow, N_TIMED)
    rc2, t2, s2, e2 = timed_run(["--replicas", "3", "--hedge", "1"], slow, N_TIMED)
    check("slow worker, hedge auto and 1: same tokens", rc1 == 0 and rc2 == 0 and t1 == REF_TIMED and t2 == REF_TIMED)
    sent, won = metric(e1, "hedges sent"), metric(e1, "won")
    # auto hedges when a primary is late against its own history: the slow worker's dispatches get a second
    # copy, and those copies win; --hedge 1 never sends one
    check("slow worker, hedge auto: hedges sent and won", (sent or 0) >= 1 and (won or 0) >= 1,
          f"sent={sent} won={won}")
    check("  --hedge 1 sends none and wins none", metric(e2, "hedges sent") == 0 and metric(e2, "won") == 0,
          f"sent={metric(e2, 'hedges sent')} won={metric(e2, 'won')}")
    check("  hedges won <= hedges sent", (won or 0) <= (sent or 0), f"sent={sent} won={won}")
    check("  hedge auto no slower than --hedge 1 on the same slow worker (+20 %)", s1 <= 1.2 * s2,
          f"auto={s1:.3f}s h1={s2:.3f}s")


@scenario
def hostile_input():
    # every worker 40 ms late: generation lasts ~8 s, while the hostile clients connect
    slow = ["--inject-delay-ms", "40", "--inject-delay-prob", "1"]
    c = Cluster(MOE, 3, N_TIMED, hub_args=["--replicas", "2"], worker_args=[slow, slow, slow])
    while c.tokens_so_far() < 1 and c.hub.poll() is None:
        time.sleep(0.01)
    refused, closed, told, total = run_hostile_clients(c.port)
    during = c.hub.poll() is None and c.tokens_so_far() < N_TIMED
    rc, toks, err = c.finish()
    check("hostile clients ran during generation", during)
    check("wrong token refused", refused and "wrong or missing token" in err)
    # a close counts only when it came (a timeout is not one), each after an ERROR saying why
    check("malformed/text/oversized frames: every connection closed by the hub", closed == total, f"{closed}/{total}")
    check("  each told why (an ERROR before the close; not the 64 MiB one, reset mid-send)", told == total - 1,
          f"{told}/{total - 1}")
    bad, ref = metric(err, "bad frames"), metric(err, "refused")
    check("  the hub counted them", bad == total and (ref or 0) >= 1, f"bad frames={bad} refused={ref}")
    check("hub survives hostile clients with unchanged output", rc == 0 and toks == REF_TIMED, f"rc={rc}")


def evicted_names(err):
    return re.findall(r"worker (\S+) evicted", err)


@scenario
def corrupt_worker_evicted():
    c = Cluster(MOE, 3, N, hub_args=["--replicas", "2", "--verify", "1"],
                worker_args=[["--inject-corrupt-prob", "0.2", "--seed", "5"], [], []])
    rc, toks, err = c.finish()
    ev, names = metric(err, "evictions"), evicted_names(err)
    check("corrupt worker: output unchanged", rc == 0 and toks == REF[MOE], f"rc={rc}")
    # One eviction per connection of the corrupt worker: today's moex-worker reconnects after ERROR 7 (as a
    # new worker, without its key) and may be caught again; a worker that exits on it is caught exactly once.
    check("corrupt worker: evicted, and no one else", (ev or 0) >= 1 and names == ["w0"] * ev,
          f"evictions={ev} evicted={names}")
    # the same check against honest workers on the CPU: bit-identical results, nobody evicted
    c = Cluster(MOE, 3, N, hub_args=["--replicas", "2", "--verify", "1"])
    rc, toks, err = c.finish()
    ev, ver = metric(err, "evictions"), metric(err, "verified")
    check("honest CPU workers, --verify 1: output unchanged, every result verified, no eviction",
          rc == 0 and toks == REF[MOE] and ev == 0 and (ver or 0) >= N, f"rc={rc} evictions={ev} verified={ver}")
    # a small corruption: every value moved by up to 3 % of its row's RMS (docs/PROTOCOL.md, "Verification")
    c = Cluster(MOE, 3, N, hub_args=["--replicas", "2", "--verify", "1"],
                worker_args=[["--inject-corrupt-prob", "1", "--inject-corrupt-scale", "0.03", "--seed", "5"], [], []])
    rc, toks, err = c.finish()
    ev, names = metric(err, "evictions"), evicted_names(err)
    check("noise of 3 % of the RMS on every result: evicted, output unchanged",
          rc == 0 and toks == REF[MOE] and (ev or 0) >= 1 and set(names) == {"w0"}, f"rc={rc} evictions={ev} {names}")


def verified_per_worker(err):
    """{name: (verified, worst share)} from the hub's worker table."""
    return {m.group(1): (int(m.group(2)), float(m.group(3)))
            for m in re.finditer(r"^  (\S+) .*? (\d+) \(([\d.]+|inf)\)  \w+$", err, re.M)}


@scenario
def verify_every_cpu_path():
    # The shipped (trained) model, --verify 1: workers on every CPU code path of this machine. Their results
    # are bit-identical only on the hub's own path; the others differ where an 8-bit rounding is a near tie,
    # which the bound allows (kernels/expert_check.c). None may be evicted.
    prompt = ",".join(str(t) for t in (1, 450, 3303, 310, 278, 3303, 310, 278, 3186, 338, 263, 1532, 2655, 29889))
    n = 96
    ref = local_tokens(SHIPPED, n, prompt)
    c = Cluster(SHIPPED, 0, n, hub_args=["--replicas", "1", "--verify", "1"], prompt=prompt, min_workers=3)
    for name, simd in (("portable", "portable"), ("avx2", "avx2"), ("best", "")):
        c.start_worker(name, ["--simd", simd] if simd else [])
    rc, toks, err = c.finish()
    ev, ver = metric(err, "evictions"), metric(err, "verified")
    per = verified_per_worker(err)
    check("--verify 1 on the shipped model, portable + AVX2 + best CPU workers: tokens equal --local, no eviction",
          rc == 0 and toks == ref and ev == 0, f"rc={rc} evictions={ev} {err[-1500:] if rc or ev else ''}")
    check("  over 2000 results verified, each worker's among them", (ver or 0) >= 2000 and len(per) == 3
          and all(v > 0 for v, _ in per.values()), f"verified={ver} per worker={per}")


@scenario
def printed_worker_command():
    # The hub prints the moex-worker line that joins it, with its token (shell-quoted): run as printed, it joins.
    token = "t0k en$'x\"y"
    c = Cluster(MOE, 0, N, hub_args=["--replicas", "1"], token=token, min_workers=1, hub_env={"MOEX_LOG": "info"})
    line = None
    deadline = time.time() + 20
    while line is None and time.time() < deadline and c.hub.poll() is None:
        m = re.search(r"native workers: (moex-worker [^\n]*)", "".join(c.err))
        line = m.group(1) if m else None
        time.sleep(0.05)
    w = None
    if line:
        cmd = f"exec {distlib.BIN}/{line.replace('HOST', '127.0.0.1')} --model {MOE} --threads 1"  # exec: one process
        w = subprocess.Popen(["sh", "-c", cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        c.workers.append(w)
    rc, toks, err = c.finish()
    check("the printed worker command, run as printed (token with a space and quotes), joins: --local's tokens",
          line and rc == 0 and toks == REF[MOE], f"line={line!r} rc={rc} {err[-800:] if rc else ''}")
    # SIGTERM while the hub waits for its workers: it stops at once
    c = Cluster(MOE, 0, N, min_workers=1)
    time.sleep(1)
    t0 = time.time()
    stopped = stops_within(c.hub, 5)
    c.finish()
    check("SIGTERM while the hub waits for workers: stopped within 5 s", stopped, f"{time.time() - t0:.1f} s")


@scenario
def speculative():
    # --draft-model (the same random model as q4_0: drafts partly right, so verifies both accept and roll back)
    # through 3 workers; w1 exits abruptly on its 10th dispatch, in the middle of some forward's layers
    twin = gen_model("qwen3moe", "q4_0", 11)
    slow = ["--inject-delay-ms", "20", "--inject-delay-prob", "1"]
    c = Cluster(MOE, 3, N_TIMED, hub_args=["--replicas", "2", "--draft-model", twin, "--draft-max", "4",
                                           "--draft-min", "2"],
                worker_args=[slow, ["--inject-exit-after", "10"] + slow, slow])
    rc, toks, err = c.finish()
    check("speculative (draft model), a worker gone mid-run: greedy tokens equal --local",
          rc == 0 and toks == REF_TIMED, f"rc={rc} got={toks[:6]} want={REF_TIMED[:6]}" + ("" if rc == 0 else err[-1500:]))
    m = re.search(r"speculative: (\d+) verifies, (\d+) drafted, (\d+) accepted", err)
    check("  verifies went through the workers, accepting some drafts and not all",
          m and int(m.group(1)) > 0 and 0 < int(m.group(3)) < int(m.group(2)), m.group(0) if m else err[-500:])
    check("  the departed worker's tasks went to its replicas", (metric(err, "re-dispatches") or 0) >= 1 and
          c.workers[1].returncode not in (0, None), f"re-dispatches={metric(err, 're-dispatches')}")

finish_script()
