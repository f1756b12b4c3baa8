#!/usr/bin/python3
"""moex-worker --backend vulkan end to end: a real hub with one Vulkan worker
and one CPU worker on loopback, each expert on one of them (--replicas 1),
every result recomputed by the hub (--verify 1). Asserts the tokens equal
`moex-hub --local`, that the Vulkan worker did its share and batched a
prefill's dispatches, that the hub's verification (relative L2 1e-3 per
result) never evicted it, and that it takes over the experts of a CPU worker
that dies (a second assignment: more experts uploaded, its GPU slots grown).

Exit 77 (skipped) when the worker finds no Vulkan device.

usage: test_worker_vk.py BIN_DIR VOCAB_DIR WORK_DIR
"""
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import distlib  # noqa: E402
from distlib import TOKEN, check, finish_script, free_port, gen_model, metric  # noqa: E402

distlib.setup(sys.argv[1], sys.argv[2], sys.argv[3])
BIN = distlib.BIN
N = 24


def local_tokens(model):
    return distlib.local_tokens(model, N)


def worker_row(err, name):
    """(dispatched, won, state) of a worker in the hub's final table."""
    m = re.search(r"^\s+" + re.escape(name) + r"\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+(\d+)\s+(\d+)\s+\d+"
                  r"\s+\d+ \([^)]*\)\s+(\w+)", err, re.M)
    return (int(m.group(1)), int(m.group(2)), m.group(3)) if m else None


def vulkan_available():
    """A Vulkan worker that finds no device exits at once saying so; one that
    does keeps retrying the (absent) hub until --reconnect-max-s."""
    p = subprocess.run([f"{BIN}/moex-worker", "--hub", f"ws://127.0.0.1:{free_port()}/ws", "--token", TOKEN,
                        "--model", gen_model("qwen3moe", "q8_0", 11), "--backend", "vulkan", "--threads", "1",
                        "--reconnect-max-s", "0.5"], capture_output=True, text=True, timeout=120)
    if "--backend vulkan:" in p.stderr:
        print("SKIP: " + p.stderr.strip().splitlines()[-1])
        return False
    return True


def run_cluster(model, worker_args, hub_args=("--replicas", "1"), hub_env=None):
    """A hub with --verify 1 (--replicas 1 by default) and one worker per (name, flags, environment) of worker_args.
    Returns (hub rc, tokens, hub stderr, worker logs, worker exit codes)."""
    # --timeout-ms 5000: this test is about the Vulkan worker's results, not deadlines; a first dispatch that
    # compiles pipelines on lavapipe under ASan can outlast the default 500 ms and fall back to the hub
    c = distlib.Cluster(model, 0, N, hub_args=["--verify", "1", "--timeout-ms", "5000", *hub_args],
                        min_workers=len(worker_args), hub_env=hub_env)
    for name, extra, env in worker_args:
        c.start_worker(name, extra, env)
    rc, toks, err = c.finish(timeout=180)
    return rc, toks, err, c.worker_logs(), [w.returncode for w in c.workers]


def slots(vk_log):
    """(experts resident, slots) after each assignment."""
    return [(int(a), int(b)) for a, b in re.findall(r"vulkan: (\d+) experts resident in (\d+) slots", vk_log)]


def vulkan_and_cpu(model, budget=None):
    name = os.path.basename(model)
    ref = local_tokens(model)
    rc, toks, err, (vk_log, _), codes = run_cluster(model, [
        ("vk", ["--backend", "vulkan"] + (["--memory-budget", budget] if budget else []), {"MOEX_LOG": "debug"}),
        ("cpu", [], {}),
    ])
    check(f"vulkan + cpu workers, --verify 1: equal --local ({name})", rc == 0 and toks == ref,
          f"rc={rc} got={toks[:6]} want={ref[:6]}" + ("" if rc == 0 else err[-2000:]))
    check("  the vulkan worker computed on the GPU", "(vulkan)" in vk_log and "experts resident" in vk_log,
          vk_log[-800:] if "(vulkan)" not in vk_log else "")
    row = worker_row(err, "vk")
    verified = metric(err, "verified") or 0
    check("  the vulkan worker answered its share", row is not None and row[1] >= 0.25 * max(verified, 1),
          f"vk dispatched/won/state={row}, verified={verified}")
    mismatches, evictions, fallbacks = metric(err, "mismatches"), metric(err, "evictions"), metric(err, "fallbacks")
    check("  every vulkan result passed --verify: no mismatch, no eviction",
          mismatches == 0 and evictions == 0 and row is not None and row[2] != "evicted",
          f"mismatches={mismatches} evictions={evictions} " +
          " ".join(l for l in err.splitlines() if "evicted" in l)[:400])
    check("  no expert fell back to the hub", fallbacks == 0, f"fallbacks={fallbacks}")
    batches = [int(m) for m in re.findall(r"vulkan: (\d+) dispatches in one submission", vk_log)]
    check("  the prefill's dispatches ran batched", len(batches) > 0,
          f"{len(batches)} batched submissions, largest {max(batches) if batches else 0}")
    check("  the workers stopped cleanly on SIGTERM", codes == [0, 0], f"exit codes {codes}")
    held = slots(vk_log)
    if budget:  # one allocation sized from the budget: room to spare
        check(f"  --memory-budget {budget} sized the GPU slots", held and held[0][1] > held[0][0], f"{held}")
    else:       # sized from the assignment
        check("  the assignment sized the GPU slots", held and held[0][1] == held[0][0], f"{held}")


def takes_over_experts(model):
    """A CPU worker exits abruptly; the hub re-assigns its experts and the
    Vulkan worker uploads its share of them while generation goes on."""
    ref = local_tokens(model)
    rc, toks, err, (vk_log, _, _), codes = run_cluster(model, [
        ("vk", ["--backend", "vulkan"], {"MOEX_LOG": "info"}),
        ("cpu", [], {}),
        ("dies", ["--inject-exit-after", "12"], {}),
    ])
    check("a CPU worker dies: still equal --local", rc == 0 and toks == ref,
          f"rc={rc} got={toks[:6]} want={ref[:6]}" + ("" if rc == 0 else err[-2000:]))
    check("  the dying worker died", codes[2] not in (0, None), f"exit code {codes[2]}")
    held = slots(vk_log)
    # against the fewest it held before the death: a slow (ASan) start can see an
    # early assignment made before the third worker joined, (10, 10) then (5, 10)
    check("  the vulkan worker took over experts (more resident, all in slots)",
          len(held) >= 2 and held[-1][0] > min(r for r, _ in held[:-1]) and held[-1][1] >= held[-1][0],
          f"(resident, slots) after each assignment: {held}")
    row = worker_row(err, "vk")
    check("  ... and stayed in: no eviction", metric(err, "evictions") == 0 and row is not None and row[2] == "ready",
          f"evictions={metric(err, 'evictions')} vk={row}")
    check("  the survivors stopped cleanly", codes[:2] == [0, 0], f"exit codes {codes}")


def hedged(model):
    """Every expert on both workers, each dispatch sent to both (--hedge 2):
    the loser's copy is cancelled, also while it sits in a GPU batch."""
    ref = local_tokens(model)
    rc, toks, err, (vk_log, _), codes = run_cluster(model, [("vk", ["--backend", "vulkan"], {}), ("cpu", [], {})],
                                                    hub_args=("--replicas", "2", "--hedge", "2"))
    check("hedged to both workers: equal --local", rc == 0 and toks == ref,
          f"rc={rc} got={toks[:6]} want={ref[:6]}" + ("" if rc == 0 else err[-2000:]))
    m = re.search(r"moex-worker: (\d+) dispatches, (\d+) results, (\d+) cancels", vk_log)
    check("  the vulkan worker received dispatches and cancels", m and int(m.group(1)) > 0 and int(m.group(3)) > 0,
          m.group(0) if m else vk_log[-500:])
    check("  no eviction", metric(err, "evictions") == 0, f"evictions={metric(err, 'evictions')}")
    check("  the workers stopped cleanly", codes == [0, 0], f"exit codes {codes}")


def split_messages(model):
    # every DISPATCH in a message of its own (--split-bytes 1; a prompt layer's message is cut at 256 KiB):
    # the Vulkan worker computes a layer's dispatches as they arrive, in as many submissions as it takes
    ref = local_tokens(model)
    rc, toks, err, _, codes = run_cluster(model, [("vk", ["--backend", "vulkan"], {})],
                                          hub_args=("--replicas", "1", "--split-bytes", "1"))
    check("a vulkan worker, one message per DISPATCH, --verify 1: equal --local", rc == 0 and toks == ref,
          f"rc={rc} got={toks[:6]} want={ref[:6]}" + ("" if rc == 0 else err[-2000:]))
    d, m = metric(err, "dispatches"), metric(err, "messages")
    check("  one message per DISPATCH", d and m == d, f"dispatches={d} messages={m}")
    check("  no mismatch, no fallback", metric(err, "mismatches") == 0 and metric(err, "fallbacks") == 0,
          f"mismatches={metric(err, 'mismatches')} fallbacks={metric(err, 'fallbacks')}")
    check("  the worker stopped cleanly", codes == [0], f"exit codes {codes}")


def bad_device():
    """A device index the machine lacks: a clear error, exit 1, before any connection."""
    p = subprocess.run([f"{BIN}/moex-worker", "--hub", f"ws://127.0.0.1:{free_port()}/ws", "--token", TOKEN,
                        "--model", gen_model("qwen3moe", "q8_0", 11), "--backend", "vulkan", "--device", "99"],
                       capture_output=True, text=True, timeout=60)
    check("--device 99: exit 1 naming the device", p.returncode == 1 and "--device 99" in p.stderr,
          f"rc={p.returncode} {p.stderr.strip()[-300:]}")


if not vulkan_available():
    sys.exit(77)
bad_device()
for model, budget in ((gen_model("qwen3moe", "q8_0", 11), None), (gen_model("mixtral", "q4_K_M", 12), "1536K")):
    t0 = time.time()
    vulkan_and_cpu(model, budget)
    print(f"     ({os.path.basename(model)}: {time.time() - t0:.1f} s)", flush=True)
for fn in (takes_over_experts, hedged, split_messages):
    t0 = time.time()
    fn(gen_model("qwen3moe", "q8_0", 11))
    print(f"     ({fn.__name__}: {time.time() - t0:.1f} s)", flush=True)
finish_script()
