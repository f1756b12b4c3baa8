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

SIM = sys.argv[1]
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
        print("FAIL:", msg, file=sys.stderr)


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
        check(r.returncode == 0, f"hedging k={k} failed: {r.stderr}")
        check(r.stdout.startswith("h,analytic_ms,mc_ms"), f"csv header: {r.stdout[:40]!r}")
        rows = csv_rows(r.stdout)
        check([int(x["h"]) for x in rows] == [1, 2, 3, 4], "one row per h")
        for row in rows:
            h = int(row["h"])
            a, mc, ci = float(row["analytic_ms"]), float(row["mc_ms"]), float(row["mc_ci3_ms"])
            ref = numpy_expect(k, h, median, sigma)
            err = abs(a - ref) / ref
            print(f"k={k} h={h} median={median} sigma={sigma}: analytic {a:.9g} numpy {ref:.9g} "
                  f"rel {err:.2e}; MC {mc:.6g} +- {ci:.3g}")
            check(err < 1e-6, f"analytic vs numpy k={k} h={h} sigma={sigma}: {a} vs {ref}")
            check(abs(mc - a) <= ci, f"MC outside its 3se CI k={k} h={h}: {mc} +- {ci} vs {a}")
            for col, p in [("p50_ms", 0.5), ("p99_ms", 0.99)]:
                q = numpy_quantile(p, k, h, median, sigma)
                check(abs(float(row[col]) - q) / q < 1e-6, f"{col} k={k} h={h}: {row[col]} vs {q}")
            check(float(row["bw_factor"]) == h, "bw_factor = h")
            reduction = 100 * (1 - a / float(rows[0]["analytic_ms"]))
            check(abs(float(row["reduction_pct"]) - reduction) < 1e-3, "reduction_pct")


def test_sigma_zero_and_table():
    r = run("hedging", "--sigma", 0, "--median-ms", 7, "--format", "csv", "--trials", 1000)
    rows = csv_rows(r.stdout)
    check(r.returncode == 0 and all(float(x["analytic_ms"]) == 7 and float(x["mc_ms"]) == 7 for x in rows),
          f"sigma 0 must give the median: {r.stdout}")
    r = run("hedging", "--trials", 1000)
    check(r.returncode == 0 and "analytic_ms" in r.stdout and len(r.stdout.splitlines()) == 6, "table format")


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
        check(r.returncode == 2, f"{args}: exit {r.returncode}, want 2 (stderr {r.stderr!r})")
        check(r.stderr.strip() != "" and r.stdout == "", f"{args}: needs a message on stderr only")


def test_token():
    L, hub, ffn = 10, 1.5, 0.7
    r = run("token", "--layers", L, "--no-queueing", "--rtt-ms", "1,3", "--h", "1,2", "--tokens", 5,
            "--format", "csv")
    check(r.returncode == 0 and r.stdout.startswith("rtt_ms,h,mean_ms"), f"token csv: {r.stderr}")
    rows = csv_rows(r.stdout)
    check(len(rows) == 4, "one row per (rtt, h)")
    for row in rows:
        want = L * (hub + float(row["rtt_ms"]) + ffn)
        for col in ("mean_ms", "p50_ms", "p99_ms", "eq12_ms"):
            check(abs(float(row[col]) - want) < 1e-6, f"deterministic {col}: {row[col]} vs {want}")
        check(abs(float(row["tokens_per_s"]) - 1000 / want) < 1e-3, "tokens/s = 1000 / mean")

    r = run("token", "--table3", "--tokens", 10, "--layers", 8)
    check(r.returncode == 0 and sum(s in r.stdout for s in ("LAN", "WiFi", "WAN (city)", "WAN (cross)")) == 4,
          "table3 scenarios")
    check(len(r.stdout.splitlines()) == 2 + 12, "table3: 4 RTTs x 3 h")

    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "ffn.txt")
        with open(trace, "w") as f:
            f.write("# measured FFN times, ms\n0.5\n0.9, 0.7\n")
        r = run("token", "--trace", trace, "--no-queueing", "--layers", L, "--tokens", 20, "--format", "csv")
        row = csv_rows(r.stdout)[0]
        lo, hi = L * (hub + 0.5 + 0.5), L * (hub + 0.5 + 0.9)
        check(r.returncode == 0 and lo <= float(row["mean_ms"]) <= hi, f"trace run: {r.stdout} {r.stderr}")
        with open(trace, "w") as f:
            f.write("0.5 fast\n")
        r = run("token", "--trace", trace)
        check(r.returncode == 2 and "line 1" in r.stderr, f"bad trace: {r.stderr}")

    r = run("token", "--fail", "0@20,1@40,2@60", "--timeout-ms", 50, "--tokens", 30, "--layers", 12, "--format", "csv")
    row = csv_rows(r.stdout)[0]
    check(r.returncode == 0 and int(row["lost"]) > 0, f"failures: {r.stdout} {r.stderr}")


def test_svg():
    with tempfile.TemporaryDirectory() as d:
        for args in (("hedging", "--trials", 1000), ("token", "--rtt-ms", "0.5,2,10,50", "--h", "1,2", "--tokens", 5)):
            path = os.path.join(d, "out.svg")
            r = run(*args, "--svg", path)
            check(r.returncode == 0, f"{args} --svg: {r.stderr}")
            root = ET.parse(path).getroot()
            ns = "{http://www.w3.org/2000/svg}"
            lines = root.findall(f"{ns}polyline")
            check(root.tag == f"{ns}svg" and len(lines) >= 2, f"{args}: svg has {len(lines)} polylines")
            for pl in lines:
                pts = [tuple(map(float, p.split(","))) for p in pl.get("points").split()]
                check(len(pts) >= 2 and all(0 <= x <= 720 and 0 <= y <= 460 for x, y in pts), "points inside")
        r = run("hedging", "--svg", "/nonexistent/dir/x.svg", "--trials", 100)
        check(r.returncode != 0 and "x.svg" in r.stderr, "unwritable svg path reported")


def test_placement():
    workers = "w0,w1,w2,w3:4.0,w4,w5"
    r = run("placement", "--workers", workers, "--layers", 8, "--experts", 128, "--replicas", 3, "--dump")
    check(r.returncode == 0 and r.stdout.startswith("layer,expert,replica,worker\n"), f"dump: {r.stderr}")
    rows = csv_rows(r.stdout)
    check(len(rows) == 8 * 128 * 3, f"dump rows: {len(rows)}")
    by_expert, slots = {}, {}
    for row in rows:
        by_expert.setdefault((row["layer"], row["expert"]), []).append(row["worker"])
        slots[row["worker"]] = slots.get(row["worker"], 0) + 1
    check(all(len(set(ws)) == 3 for ws in by_expert.values()), "replicas of an expert on distinct workers")
    check(set(slots) <= {"w0", "w1", "w2", "w3", "w4", "w5"}, f"unknown workers {set(slots)}")
    # Weight 4 of 9 would be 4/9 of the slots, but one worker holds at most one
    # of an expert's 3 replicas (1/3 of the slots): it must still hold clearly more.
    others = max(slots[w] for w in ("w0", "w1", "w2", "w4", "w5"))
    check(1.5 * others < slots["w3"] <= 8 * 128, f"weight 4 worker: {slots}")
    shuffled = run("placement", "--workers", "w5,w3:4.0,w1,w0,w4,w2", "--layers", 8, "--experts", 128,
                   "--replicas", 3, "--dump")
    check(shuffled.stdout == r.stdout, "placement must not depend on the order workers are listed in")

    r = run("placement", "--workers", workers, "--layers", 8, "--experts", 128, "--replicas", 3)
    check(r.returncode == 0 and "duplicate replicas: 0" in r.stdout, f"summary: {r.stdout} {r.stderr}")
    for w, n in slots.items():  # the summary's per-worker slots agree with the dump
        line = next((l for l in r.stdout.splitlines() if l.split() and l.split()[0] == w), "")
        check(line and int(line.split()[2]) == n, f"summary slots for {w}: {line!r} vs {n}")
    ratio = max(slots[w] / (4.0 if w == "w3" else 1.0) for w in slots) / (len(rows) / 9.0)
    line = next(l for l in r.stdout.splitlines() if l.startswith("max/mean"))
    check(abs(float(line.split()[-1]) - ratio) < 1e-3, f"max/mean {line} vs {ratio}")
    for bad in (("--workers", "w0", "--replicas", 2), ("--layers", 4), ("--workers", "w0,w0"),
                ("--workers", "bob"), ("--workers", "w0:0"), ("--workers", "w0,w1", "--dump", "--bogus")):
        r = run("placement", *bad)
        check(r.returncode == 2 and r.stderr and not r.stdout, f"placement {bad}: exit {r.returncode}")


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
