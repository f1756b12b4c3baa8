#!/usr/bin/python3
"""moex-sim token --route-trace / --place-by-load.

  - the trace is replayed: with every token routed to experts 0 and 1 and
    replicas placed by load (0 and 1 on workers 0 and 1, the cold experts on
    2 and 3), a worker holding only cold experts can die without a single
    timeout, while the death of worker 0 costs timeouts
    (and, once it counts as unhealthy, a re-assignment on every token); with
    uniform draws instead, the death of worker 3 does cost timeouts;
  - the trace sets layers, experts and k (printed in the header);
  - hot experts sharing one worker queue behind each other: a trace that
    always picks the same two experts waits in queues with one worker, not
    with two workers and load-aware placement;
  - bad traces (header, ids out of range, too few ids) and --place-by-load
    without a trace are refused with exit 2 and a message.

    test_sim_routes.py MOEX_SIM WORKDIR
"""
import os
import subprocess
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import check, failures  # noqa: E402



def sim(*args):
    return subprocess.run([SIM, "token", *map(str, args)], capture_output=True, text=True, timeout=120)


def csv_row(p):
    lines = p.stdout.strip().splitlines()
    head, vals = lines[0].split(","), lines[1].split(",")
    return dict(zip(head, vals))


def write_trace(path, layers, experts, k, rows, tokens=None):
    with open(path, "w") as f:
        f.write("# moex routing trace\n")
        f.write(f"layers {layers} experts {experts} k {k} tokens {tokens if tokens is not None else len(rows)}\n")
        for r in rows:
            f.write(" | ".join(" ".join(map(str, g)) for g in r) + "\n")


def main():
    os.makedirs(WORK, exist_ok=True)
    hot = os.path.join(WORK, "hot.trace")
    write_trace(hot, 2, 8, 2, [[[0, 1], [1, 0]]] * 50)
    base = ["--route-trace", hot, "--workers", "4", "--replicas", "1", "--tokens", "100", "--timeout-ms", "5",
            "--format", "csv"]
    p = sim(*base, "--place-by-load", "--fail", "3@0")
    check(f"replay + place-by-load runs ({p.stderr.strip()})", p.returncode == 0)
    if p.returncode == 0:
        r = csv_row(p)
        check(f"a worker with only cold experts dies unnoticed "
                                                               f"(timeouts {r['timeouts']}, lost {r['lost']})", int(r["timeouts"]) == 0 and int(r["lost"]) == 0)
    p = sim(*base, "--place-by-load", "--fail", "0@0")
    if p.returncode == 0:
        r = csv_row(p)
        check(f"the hot experts' worker dying costs timeouts, then every token re-assigns "
              f"(timeouts {r['timeouts']}, reassigned {r['reassigned']})",
              int(r["timeouts"]) > 0 and int(r["reassigned"]) >= 50)
    else:
        check(f"failing worker 0: {p.stderr.strip()}", False)
    p = sim("--layers", "2", "--experts", "8", "--k", "2", "--workers", "4", "--replicas", "1", "--tokens", "100",
            "--timeout-ms", "5", "--format", "csv", "--fail", "3@0")
    if p.returncode == 0:
        r = csv_row(p)
        check(f"with uniform draws worker 3's death does cost timeouts ({r['timeouts']})", int(r["timeouts"]) > 0)
    p = sim("--route-trace", hot, "--tokens", "10")
    check("the trace sets layers, experts and k",
          p.returncode == 0 and "L=2 E=8 k=2" in p.stdout and "routing from trace" in p.stdout)
    one = sim("--route-trace", hot, "--workers", "1", "--replicas", "1", "--tokens", "100", "--format", "csv")
    two = sim("--route-trace", hot, "--workers", "2", "--replicas", "1", "--tokens", "100", "--format", "csv",
              "--place-by-load")
    if one.returncode == 0 and two.returncode == 0:
        w1, w2 = float(csv_row(one)["queue_wait_ms"]), float(csv_row(two)["queue_wait_ms"])
        check(f"hot experts queue on one worker ({w1:.3f} ms), not when placed apart ({w2:.3f} ms)", w1 > 0 and w2 == 0)
    else:
        check(f"queueing runs failed: {one.stderr.strip()} {two.stderr.strip()}", False)
    bad = os.path.join(WORK, "bad.trace")
    cases = [("a broken header", "layers two experts 8\n0 1\n"),
             ("an id outside the experts", "layers 1 experts 4 k 1 tokens 2\n0\n4\n"),
             ("fewer ids than the header promises", "layers 1 experts 4 k 2 tokens 3\n0 1\n2 3\n")]
    for what, text in cases:
        with open(bad, "w") as f:
            f.write(text)
        p = sim("--route-trace", bad)
        check(f"refuses {what} (exit {p.returncode})", p.returncode == 2 and "--route-trace" in p.stderr)
    p = sim("--place-by-load")
    check("--place-by-load without a trace is refused", p.returncode == 2 and "--route-trace" in p.stderr)
    p = sim("--route-trace", os.path.join(WORK, "absent.trace"))
    check("a missing trace file is refused", p.returncode == 2 and "cannot open" in p.stderr)
    print(f"{len(failures)} failed" if failures else "all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    SIM, WORK = sys.argv[1], sys.argv[2]
    sys.exit(main())
