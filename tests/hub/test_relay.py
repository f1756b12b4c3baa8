#!/usr/bin/env python3
"""Hub and workers through moex-relay, the LAN emulator: at 2 ms RTT (1 ms
each way, 0.3 ms jitter) three workers, r=2, print exactly the tokens of
--local, and every dispatch waited at least the emulated round trip (the
relay really sits in between)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distlib import Cluster, Relay, check, finish_script, gen_model, local_tokens, scenario, setup  # noqa: E402

setup(*sys.argv[1:4])
N = 12


@scenario
def lan_2ms():
    model = gen_model("qwen3moe", "q8_0", 21)
    want = local_tokens(model, N)
    c = Cluster(model, 0, N, hub_args=("--replicas", "2"), min_workers=3)
    relays = [Relay(c.port, 2.0, jitter_ms=0.3) for _ in range(3)]
    for i, r in enumerate(relays):
        c.start_worker(f"w{i}", port=r.port)
    rc, toks, err = c.finish(timeout=180)
    for r in relays:
        r.stop()
    check("through the relay at 2 ms RTT: tokens equal --local", rc == 0 and toks == want, f"rc={rc} got={toks}")
    p50 = [float(x) for x in __import__("re").findall(r"^\s+w\d\s+([\d.]+)\s", err, __import__("re").M)]
    check("every worker's p50 round trip is at least the emulated 2 ms", len(p50) == 3 and min(p50) >= 2.0,
          f"p50={p50}")


finish_script()
