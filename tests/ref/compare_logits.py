#!/usr/bin/python3
"""Compares two float32 logit dumps [positions][vocab] (ours against the reference).

    compare_logits.py OURS.f32 REF.f32 --vocab V [--max-rel 1e-4] [--min-top1 0.95]
                      [--generated ID,ID,... --prompt-len P] [--margin 1e-2]

Per position: relative L2 error ||ours - ref|| / ||ref||, and whether the
argmax agrees. With --generated (the engine's greedy ids; id i was chosen from
row P-1+i), also checks that each id is the argmax of our own row and that it
equals the reference's argmax wherever the reference's top-2 margin is clear:
(top1 - top2) / max|row| > --margin. Exit status: 0 within tolerance, 1 over
it, 2 bad input.
"""
import argparse
import sys

import numpy as np


def load_rows(path, vocab):
    try:
        a = np.fromfile(path, dtype="<f4")
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e}")
    if a.size == 0 or a.size % vocab:
        raise ValueError(f"{path}: {a.size} floats is not a whole number of rows of {vocab}")
    return a.reshape(-1, vocab).astype(np.float64)


def top2_margin(rows):
    """(top1 - top2) / max|row| per row: how clearly the argmax wins."""
    part = -np.partition(-rows, 1, axis=1)[:, :2]
    scale = np.maximum(np.max(np.abs(rows), axis=1), 1e-30)
    return (part[:, 0] - part[:, 1]) / scale


def compare(ours, ref, generated=None, prompt_len=None, margin=1e-2):
    """Statistics of ours vs ref (same shape). Returns a dict."""
    if not np.all(np.isfinite(ours)):
        bad = np.nonzero(~np.all(np.isfinite(ours), axis=1))[0]
        return {"finite": False, "nonfinite_rows": bad.tolist()}
    rel = np.linalg.norm(ours - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
    arg_ours, arg_ref = np.argmax(ours, axis=1), np.argmax(ref, axis=1)
    ref_margin = top2_margin(ref)
    agree = arg_ours == arg_ref
    r = {
        "finite": True, "rows": len(rel), "rel": rel, "max_rel": float(rel.max()),
        "mean_rel": float(rel.mean()), "top1": float(agree.mean()),
        # Disagreements where the reference had a clear winner are real errors.
        "clear_disagree": np.nonzero(~agree & (ref_margin > margin))[0].tolist(),
        "ref_margin": ref_margin,
    }
    if generated is not None:
        rows = prompt_len - 1 + np.arange(len(generated))
        ok_rows = rows < len(rel)
        gen = np.asarray(generated)[ok_rows]
        rows = rows[ok_rows]
        r["gen_checked"] = len(rows)
        r["gen_not_own_argmax"] = [int(i) for i, row in enumerate(rows) if gen[i] != arg_ours[row]]
        r["gen_vs_ref_clear"] = [int(i) for i, row in enumerate(rows)
                                 if ref_margin[row] > margin and gen[i] != arg_ref[row]]
    return r


def verdict(r, max_rel, mean_rel, min_top1):
    """List of reasons the comparison fails (empty: passes)."""
    if not r["finite"]:
        return [f"non-finite logits in rows {r['nonfinite_rows'][:10]}"]
    why = []
    if r["max_rel"] > max_rel:
        why.append(f"max relative L2 {r['max_rel']:.3g} > {max_rel:g} (row {int(np.argmax(r['rel']))})")
    if mean_rel is not None and r["mean_rel"] > mean_rel:
        why.append(f"mean relative L2 {r['mean_rel']:.3g} > {mean_rel:g}")
    if r["top1"] < min_top1:
        why.append(f"top-1 agreement {r['top1']:.3f} < {min_top1:g}")
    if r["clear_disagree"]:
        why.append(f"argmax differs where the reference's margin is clear, rows {r['clear_disagree'][:10]}")
    if r.get("gen_not_own_argmax"):
        why.append(f"generated tokens {r['gen_not_own_argmax'][:10]} are not the argmax of our own logits")
    if r.get("gen_vs_ref_clear"):
        why.append(f"generated tokens {r['gen_vs_ref_clear'][:10]} differ from the reference's clear argmax")
    return why


def summary(r):
    if not r["finite"]:
        return "non-finite logits"
    s = (f"rows {r['rows']}  rel L2 max {r['max_rel']:.3g} mean {r['mean_rel']:.3g}  "
         f"top-1 {r['top1'] * 100:.1f}%  min ref margin {r['ref_margin'].min():.3g}")
    if "gen_checked" in r:
        s += f"  greedy checked {r['gen_checked']}"
    return s


def parse_ids(s):
    return [int(t) for t in s.split(",") if t.strip()]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ours")
    ap.add_argument("ref")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--max-rel", type=float, default=1e-4, help="per-position relative L2 bound")
    ap.add_argument("--mean-rel", type=float, default=None, help="bound on the mean over positions")
    ap.add_argument("--min-top1", type=float, default=0.95, help="minimum fraction of positions whose argmax agrees")
    ap.add_argument("--margin", type=float, default=1e-2, help="relative top-2 margin above which argmax must agree")
    ap.add_argument("--generated", help="our greedy ids, comma-separated")
    ap.add_argument("--prompt-len", type=int, help="P: generated id i was chosen from row P-1+i")
    ap.add_argument("--verbose", action="store_true", help="print every position")
    a = ap.parse_args(argv)
    try:
        if a.vocab <= 0:
            raise ValueError("--vocab must be positive")
        ours, ref = load_rows(a.ours, a.vocab), load_rows(a.ref, a.vocab)
        if ours.shape != ref.shape:
            raise ValueError(f"row counts differ: ours {ours.shape[0]}, reference {ref.shape[0]}")
        gen = parse_ids(a.generated) if a.generated else None
        if gen is not None and (a.prompt_len is None or a.prompt_len < 1):
            raise ValueError("--generated needs --prompt-len >= 1")
    except ValueError as e:
        print(f"compare_logits: {e}", file=sys.stderr)
        return 2
    r = compare(ours, ref, gen, a.prompt_len, a.margin)
    if a.verbose and r["finite"]:
        for i, (e, m) in enumerate(zip(r["rel"], r["ref_margin"])):
            print(f"  pos {i:3d}  rel {e:.3g}  argmax ours {np.argmax(ours[i])} ref {np.argmax(ref[i])}  ref margin {m:.3g}")
    print(summary(r))
    why = verdict(r, a.max_rel, a.mean_rel, a.min_top1)
    for w in why:
        print("FAIL:", w)
    return 1 if why else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
