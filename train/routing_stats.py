#!/usr/bin/python3
"""Routing statistics of a trace written by `moex-hub --routing-trace`.

    routing_stats.py TRACE [--json OUT.json]

Per layer: the load of each expert (its share of the token x slot picks),
max/mean load (1 = perfectly balanced), the entropy of the load in bits
against log2(E) (the uniform maximum), the share of the busiest 25 % of
experts, and how often a token reuses an expert of the previous token in
the same layer (the fraction of its k experts that the previous token also
had; uniform random routing gives k/E). Prints a table; --json writes all.
"""
import argparse
import json
import math
import sys

import numpy as np


def read_trace(path):
    with open(path) as f:
        lines = [ln for ln in f if ln.strip() and not ln.startswith("#")]
    head = lines[0].split()
    if len(head) != 8 or head[0::2] != ["layers", "experts", "k", "tokens"]:
        sys.exit(f"routing_stats.py: {path}: expected 'layers L experts E k K tokens T', got {lines[0]!r}")
    L, E, K, T = (int(x) for x in head[1::2])
    ids = np.array(" ".join(lines[1:]).replace("|", " ").split(), dtype=np.int64)
    if ids.size != T * L * K:
        sys.exit(f"routing_stats.py: {path}: {ids.size} ids, the header promises {T * L * K}")
    return ids.reshape(T, L, K), E


def layer_stats(ids, E):
    """ids: (T, K) of one layer."""
    T, K = ids.shape
    load = np.bincount(ids.ravel(), minlength=E) / ids.size
    p = load[load > 0]
    entropy = float(-(p * np.log2(p)).sum())
    top = np.sort(load)[::-1][:max(1, E // 4)].sum()
    prev = np.zeros((T, E), dtype=bool)
    prev[np.arange(T)[:, None], ids] = True
    reuse = (prev[:-1][np.arange(T - 1)[:, None], ids[1:]]).mean() if T > 1 else float("nan")
    return {"load": load.round(5).tolist(), "max_over_mean": float(load.max() * E), "min_over_mean": float(load.min() * E),
            "entropy_bits": entropy, "entropy_max_bits": math.log2(E), "top_quarter_share": float(top),
            "unused_experts": int((load == 0).sum()), "reuse_prev_token": float(reuse), "reuse_uniform": K / E}


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    ids, E = read_trace(a.trace)
    T, L, K = ids.shape
    layers = [layer_stats(ids[:, l], E) for l in range(L)]
    print(f"{T} tokens, {L} layers, top-{K} of {E} experts")
    print(f"{'layer':>5} {'max/mean':>9} {'min/mean':>9} {'entropy':>8} {'of max':>7} {'top 25%':>8} {'unused':>6} "
          f"{'reuse':>6} {'uniform':>7}")
    for l, s in enumerate(layers):
        print(f"{l:5d} {s['max_over_mean']:9.2f} {s['min_over_mean']:9.2f} {s['entropy_bits']:8.3f} "
              f"{s['entropy_bits'] / s['entropy_max_bits']:7.1%} {s['top_quarter_share']:8.1%} {s['unused_experts']:6d} "
              f"{s['reuse_prev_token']:6.1%} {s['reuse_uniform']:7.1%}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tokens": T, "layers": L, "experts": E, "k": K, "per_layer": layers}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
