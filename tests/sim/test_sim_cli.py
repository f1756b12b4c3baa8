#!/usr/bin/python3
"""moex-sim command-line tests.

The hedging analytic column (adaptive Gauss-Kronrod in C) is checked against an
independent numpy integration of eq. 18: a fine trapezoid rule over ln t, and
quantiles by bisection on the numpy CDF. Monte Carlo must fall inside its own
mean +- 3 standard errors. Usage: test_sim_cli.py path/to/moex-sim"""
import csv
import io
import math
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import check, failures  # noqa: E402

SIM = sys.argv[1]


def run(*args):
    return subprocess.run([SIM, *map(str, args)], capture_output=True, text=True, timeout=120)


def csv_rows(text):
    return list(csv.DictReader(io.StringIO(text)))


_erfc = np.frompyfunc(math.erfc, 1, 1)


def survival(t, k, h, median, sigma):
    """1 - F_max(t) = 1 - [1 - (1 - F(t))^h]^k for log-normal F."""
    z = (np.log(t) - math.log(median)) / sigma
    q = (0.5 * _erfc(z / math.sqrt(2))).astype(float)  # 1 - F(t)
    with np.errstate(divide="ignore"):  # q = 1 far left: log1p(-1) = -inf, S = 1
        return -np.expm1(k * np.log1p(-(q ** h)))


def numpy_expect(k, h, median, sigma, n=400001):
    """E[T] = t_lo + integral_{t_lo}^{t_hi} S(t) dt on a log grid (S = 1 below t_lo)."""
    mu = math.log(median)
    u = np.linspace(mu - 40 * sigma, mu + 40 * sigma, n)
    t = np.exp(u)
    f = survival(t, k, h, median, sigma) * t  # dt = t du
    return float(t[0] + np.sum((f[1:] + f[:-1]) * 0.5 * np.diff(u)))


def numpy_quantile(p, k, h, median, sigma):
    lo, hi = median * math.exp(-40 * sigma), median * math.exp(40 * sigma)
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if 1 - survival(np.array([mid]), k, h, median, sigma)[0] < p:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi)


def test_hedging_against_numpy():
    for k, median, sigma in [(8, 20, 0.5), (4, 1, 1.5), (16, 0.7, 0.1), (1, 5, 1.0), (64, 2, 0.8)]:
        r = run("hedging", "--k", k, "--h", "1,2,3,4", "--median-ms", median, "--sigma", sigma,
                "--trials", 100000, "--seed", 3, "--format", "csv")
        check(f"hedging k={k} failed: {r.stderr}", r.returncode == 0)
        check(f"csv header: {r.stdout[:40]!r}", r.stdout.startswith("h,analytic_ms,mc_ms"))
        rows = csv_rows(r.stdout)
        check("one row per h", [int(x["h"]) for x in rows] == [1, 2, 3, 4])
        for row in rows:
            h = int(row["h"])
            a, mc, ci = float(row["analytic_ms"]), float(row["mc_ms"]), float(row["mc_ci3_ms"])
            ref = numpy_expect(k, h, median, sigma)
            err = abs(a - ref) / ref
            print(f"k={k} h={h} median={median} sigma={sigma}: analytic {a:.9g} numpy {ref:.9g} "
                  f"rel {err:.2e}; MC {mc:.6g} +- {ci:.3g}")
            check(f"analytic vs numpy k={k} h={h} sigma={sigma}: {a} vs {ref}", err < 1e-6)
            check(f"MC outside its 3se CI k={k} h={h}: {mc} +- {ci} vs {a}", abs(mc - a) <= ci)
            for col, p in [("p50_ms", 0.5), ("p99_ms", 0.99)]:
                q = numpy_quantile(p, k, h, median, sigma)
                check(f"{col} k={k} h={h}: {row[col]} vs {q}", abs(float(row[col]) - q) / q < 1e-6)
            check("bw_factor = h", float(row["bw_factor"]) == h)
            reduction = 100 * (1 - a / float(rows[0]["analytic_ms"]))
            check("reduction_pct", abs(float(row["reduction_pct"]) - reduction) < 1e-3)


def test_sigma_zero_and_table():
    r = run("hedging", "--sigma", 0, "--median-ms", 7, "--format", "csv", "--trials", 1000)
    rows = csv_rows(r.stdout)
    check(f"sigma 0 must give the median: {r.stdout}",
          r.returncode == 0 and all(float(x["analytic_ms"]) == 7 and float(x["mc_ms"]) == 7 for x in rows))
    r = run("hedging", "--trials", 1000)
    check("table format", r.returncode == 0 and "analytic_ms" in r.stdout and len(r.stdout.splitlines()) == 6)


def test_usage_errors():
    bad = [("hedging", "--k", "-1"), ("hedging", "--sigma", "abc"), ("hedging", "--format", "xml"),
           ("hedging", "--bogus"), ("hedging", "--h", "0"), ("hedging", "--h", "1,,2"),
           ("hedging", "--median-ms", "-5"), ("hedging", "--k"), ("hedging", "stray"), ("nonsense",), (),
           ("token", "--rtt-ms", "-1"), ("token", "--h", "3"), ("token", "--layers", "0"),
           ("token", "--fail", "99@10"), ("token", "--fail", "1-10"), ("token", "--speed", "0:-2"),
           ("token", "--trace", "/nonexistent/trace.txt"), ("token", "--select", "best"),
           ("placement", "--experts", "-3")]
    for args in bad:
        r = run(*args)
        check(f"{args}: exit {r.returncode}, want 2 (stderr {r.stderr!r})", r.returncode == 2)
        check(f"{args}: needs a message on stderr only", r.stderr.strip() != "" and r.stdout == "")


def test_token():
    L, hub, ffn = 10, 1.5, 0.7
    r = run("token", "--layers", L, "--no-queueing", "--rtt-ms", "1,3", "--h", "1,2", "--tokens", 5,
            "--format", "csv")
    check(f"token csv: {r.stderr}", r.returncode == 0 and r.stdout.startswith("rtt_ms,h,mean_ms"))
    rows = csv_rows(r.stdout)
    check("one row per (rtt, h)", len(rows) == 4)
    for row in rows:
        want = L * (hub + float(row["rtt_ms"]) + ffn)
        for col in ("mean_ms", "p50_ms", "p99_ms", "eq12_ms"):
            check(f"deterministic {col}: {row[col]} vs {want}", abs(float(row[col]) - want) < 1e-6)
        check("tokens/s = 1000 / mean", abs(float(row["tokens_per_s"]) - 1000 / want) < 1e-3)

    r = run("token", "--table3", "--tokens", 10, "--layers", 8)
    check("table3 scenarios",
          r.returncode == 0 and sum(s in r.stdout for s in ("LAN", "WiFi", "WAN (city)", "WAN (cross)")) == 4)
    check("table3: 4 RTTs x 3 h", len(r.stdout.splitlines()) == 2 + 12)

    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "ffn.txt")
        with open(trace, "w") as f:
            f.write("# measured FFN times, ms\n0.5\n0.9, 0.7\n")
        r = run("token", "--trace", trace, "--no-queueing", "--layers", L, "--tokens", 20, "--format", "csv")
        row = csv_rows(r.stdout)[0]
        lo, hi = L * (hub + 0.5 + 0.5), L * (hub + 0.5 + 0.9)
        check(f"trace run: {r.stdout} {r.stderr}", r.returncode == 0 and lo <= float(row["mean_ms"]) <= hi)
        with open(trace, "w") as f:
            f.write("0.5 fast\n")
        r = run("token", "--trace", trace)
        check(f"bad trace: {r.stderr}", r.returncode == 2 and "line 1" in r.stderr)

    r = run("token", "--fail", "0@20,1@40,2@60", "--timeout-ms", 50, "--tokens", 30, "--layers", 12, "--format", "csv")
    row = csv_rows(r.stdout)[0]
    check(f"failures: {r.stdout} {r.stderr}", r.returncode == 0 and int(row["lost"]) > 0)


def test_svg():
    with tempfile.TemporaryDirectory() as d:
        for args in (("hedging", "--trials", 1000), ("token", "--rtt-ms", "0.5,2,10,50", "--h", "1,2", "--tokens", 5)):
            path = os.path.join(d, "out.svg")
            r = run(*args, "--svg", path)
            check(f"{args} --svg: {r.stderr}", r.returncode == 0)
            root = ET.parse(path).getroot()
            ns = "{http://www.w3.org/2000/svg}"
            lines = root.findall(f"{ns}polyline")
            check(f"{args}: svg has {len(lines)} polylines", root.tag == f"{ns}svg" and len(lines) >= 2)
            for pl in lines:
                pts = [tuple(map(float, p.split(","))) for p in pl.get("points").split()]
                check("points inside", len(pts) >= 2 and all(0 <= x <= 720 and 0 <= y <= 460 for x, y in pts))
        r = run("hedging", "--svg", "/nonexistent/dir/x.svg", "--trials", 100)
        check("unwritable svg path reported", r.returncode != 0 and "x.svg" in r.stderr)


def test_placement():
    workers = "w0,w1,w2,w3:4.0,w4,w5"
    r = run("placement", "--workers", workers, "--layers", 8, "--experts", 128, "--replicas", 3, "--dump")
    check(f"dump: {r.stderr}", r.returncode == 0 and r.stdout.startswith("layer,expert,replica,worker\n"))
    rows = csv_rows(r.stdout)
    check(f"dump rows: {len(rows)}", len(rows) == 8 * 128 * 3)
    by_expert, slots = {}, {}
    for row in rows:
        by_expert.setdefault((row["layer"], row["expert"]), []).append(row["worker"])
        slots[row["worker"]] = slots.get(row["worker"], 0) + 1
    check("replicas of an expert on distinct workers", all(len(set(ws)) == 3 for ws in by_expert.values()))
    check(f"unknown workers {set(slots)}", set(slots) <= {"w0", "w1", "w2", "w3", "w4", "w5"})
    # Weight 4 of 9 would be 4/9 of the slots, but one worker holds at most one
    # of an expert's 3 replicas (1/3 of the slots): it must still hold clearly more.
    others = max(slots[w] for w in ("w0", "w1", "w2", "w4", "w5"))
    check(f"weight 4 worker: {slots}", 1.5 * others < slots["w3"] <= 8 * 128)
    shuffled = run("placement", "--workers", "w5,w3:4.0,w1,w0,w4,w2", "--layers", 8, "--experts", 128,
                   "--replicas", 3, "--dump")
    check("placement must not depend on the order workers are listed in", shuffled.stdout == r.stdout)

    r = run("placement", "--workers", workers, "--layers", 8, "--experts", 128, "--replicas", 3)
    check(f"summary: {r.stdout} {r.stderr}", r.returncode == 0 and "duplicate replicas: 0" in r.stdout)
    for w, n in slots.items():  # the summary's per-worker slots agree with the dump
        line = next((l for l in r.stdout.splitlines() if l.split() and l.split()[0] == w), "")
        check(f"summary slots for {w}: {line!r} vs {n}", line and int(line.split()[2]) == n)
    ratio = max(slots[w] / (4.0 if w == "w3" else 1.0) for w in slots) / (len(rows) / 9.0)
    line = next(l for l in r.stdout.splitlines() if l.startswith("max/mean"))
    check(f"max/mean {line} vs {ratio}", abs(float(line.split()[-1]) - ratio) < 1e-3)
    for bad in (("--workers", "w0", "--replicas", 2), ("--layers", 4), ("--workers", "w0,w0"),
                ("--workers", "bob"), ("--workers", "w0:0"), ("--workers", "w0,w1", "--dump", "--bogus")):
        r = run("placement", *bad)
        check(f"placement {bad}: exit {r.returncode}", r.returncode == 2 and r.stderr and not r.stdout)


if __name__ == "__main__":
    test_hedging_against_numpy()
    test_sigma_zero_and_table()
    test_usage_errors()
    test_token()
    test_svg()
    test_placement()
    if failures:
        print(f"{len(failures)} failure(s)", file=sys.stderr)
        sys.exit(1)
    print("test_sim_cli: all checks passed")
