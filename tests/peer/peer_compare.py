#!/usr/bin/python3
"""Our engine against llama.cpp on generated models.

For each architecture x weight type: `moex-gguf gen` a test model, run
`moex-hub --local` greedily (--dump-logits) and llama.cpp (tests/peer/
llama_peer logits) on the same prompt, then compare:
  - the greedy tokens: equal, or the first difference sits where llama.cpp's
    own top-2 margin is a near-tie (then llama.cpp is re-run teacher-forced
    on our tokens so every logit row has the same input);
  - the logits, row by row: relative L2 error within the type's tolerance,
    argmax equal wherever llama.cpp's margin is clear (tests/ref/compare_logits.py).

    peer_compare.py --hub BIN --gguf BIN --fixtures DIR --workdir DIR
                    [--arch qwen3moe,qwen3,llama,mixtral] [--type f32,q8_0,...]
                    [--peer DIR] [--threads 2] [--keep]
Exit: 0 all within tolerance, 1 a mismatch, 77 llama.cpp peer unavailable.
"""
import argparse
import os
import subprocess
import sys
import time
import zlib

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True   # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(REPO, "tests", "ref"))
import compare_logits  # noqa: E402

SKIP = 77
ARCHS = ["qwen3moe", "qwen3", "llama", "mixtral"]
VOCAB_FILE = "ggml-vocab-llama-spm.gguf"   # 32000 tokens keeps f32 test models at ~80 MB
PROMPT_LEN, N_GEN = 12, 8
MARGIN = 1e-2   # relative top-2 margin under which a greedy pick may legitimately differ

# Relative L2 error of a logit row: (bound for every row, bound for the mean).
# Measured over all 4 archs x 13 types (2-layer test preset, 12+8 tokens):
# llama.cpp reproduces the NumPy reference (tests/ref) to 3e-7 on f32 weights;
# our engine measured 4e-7 early on and 2.9e-4 later (bounded at 1e-3 as
# the task asks). f16 5e-4 and bf16 4e-3: llama.cpp rounds activations to the
# weight's type. The 32-blocks and K-quants: both engines quantize activations
# (Q8_0/Q8_1/Q8_K), mostly to the same bits; 1e-2 when rounding differs.
TOLERANCE = {
    "f32": (1e-3, 5e-4),
    "f16": (5e-3, 2e-3),
    "bf16": (2e-2, 1e-2),
    "default": (5e-2, 3e-2),
}
# MoE only: when two experts' router scores nearly tie, activation noise can
# pick the other one and that row moves by up to ~0.3 (seen: 0.198 on
# qwen3moe q4_K, where each engine matched the reference under its own
# activation rounding; 0.318 on mixtral q5_K). A few such rows are allowed,
# below a hard cap; a real error moves every row.
MOE_OUTLIER_ROWS, OUTLIER_CAP = 2, 0.5


def run(cmd, what, timeout=300):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return p.stdout, p.stderr, time.time() - t0


def ids_line(stdout):
    """The last output line made only of integers: the generated ids."""
    for line in reversed(stdout.strip().splitlines()):
        parts = line.replace(",", " ").split()
        if parts and all(p.isdigit() for p in parts):
            return [int(p) for p in parts]
    raise RuntimeError(f"no line of token ids in:\n{stdout[-1000:]}")


def prompt_tokens(arch, wtype):
    """A fixed prompt per model: ordinary token ids (past control and byte tokens)."""
    rng = np.random.default_rng(zlib.crc32(f"peer/{arch}/{wtype}".encode()))
    return [int(t) for t in rng.integers(300, 30000, size=PROMPT_LEN)]


def setup_peer(peer_dir):
    env = dict(os.environ, MOEX_PEER_DIR=peer_dir)
    p = subprocess.run([os.path.join(HERE, "setup_peer.sh")], env=env, capture_output=True, text=True)
    if p.returncode == SKIP:
        print(p.stderr.strip())
        return None
    if p.returncode != 0:
        raise RuntimeError(f"setup_peer.sh failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return os.path.join(peer_dir, "bin", "llama_peer")


def check_model(a, peer, arch, wtype):
    name = f"{arch}_{wtype}"
    model = os.path.join(a.workdir, name + ".gguf")
    ours_f, ref_f = (os.path.join(a.workdir, f"{name}.{w}.f32") for w in ("ours", "llama"))
    prompt = prompt_tokens(arch, wtype)
    csv = ",".join(map(str, prompt))
    run([a.gguf, "gen", "--arch", arch, "--preset", "test", "--vocab", os.path.join(a.fixtures, "vocab", VOCAB_FILE),
         "--type", wtype, "--seed", "7", "--weights", a.weights, "-o", model, "--quiet"], "moex-gguf gen")
    out, _, t_ours = run([a.hub, "--local", "-m", model, "--prompt-tokens", csv, "-n", str(N_GEN), "--temp", "0",
                          "--print-tokens", "--dump-logits", ours_f, "--threads", str(a.threads)], "moex-hub")
    ours_gen = ids_line(out)
    out, _, t_ref = run([peer, "logits", model, csv, str(N_GEN), ref_f, "--threads", str(a.threads)], "llama_peer")
    ref_gen = ids_line(out)
    vocab = 32000
    ref = compare_logits.load_rows(ref_f, vocab)
    why, note = [], ""
    if ours_gen != ref_gen:
        m = next(i for i, (x, y) in enumerate(zip(ours_gen, ref_gen)) if x != y)
        margin = compare_logits.top2_margin(ref[PROMPT_LEN - 1 + m:PROMPT_LEN + m])[0]
        note = f"greedy differs at {m} (llama.cpp margin {margin:.2g}); teacher-forced"
        if margin > MARGIN:
            why.append(f"greedy token {m}: ours {ours_gen[m]}, llama.cpp {ref_gen[m]} with a clear margin {margin:.3g}")
        # Same inputs for every row: llama.cpp on our prompt + generated tokens.
        forced = ",".join(map(str, prompt + ours_gen[:-1]))
        run([peer, "logits", model, forced, "1", ref_f, "--threads", str(a.threads)], "llama_peer (forced)")
        ref = compare_logits.load_rows(ref_f, vocab)
    ours = compare_logits.load_rows(ours_f, vocab)
    if ours.shape != ref.shape:
        raise RuntimeError(f"{name}: ours has {ours.shape[0]} logit rows, llama.cpp {ref.shape[0]}")
    r = compare_logits.compare(ours, ref, ours_gen, PROMPT_LEN, MARGIN)
    row_tol, mean_tol = TOLERANCE.get(wtype, TOLERANCE["default"])
    outliers_allowed = MOE_OUTLIER_ROWS if arch in ("qwen3moe", "mixtral") else 0
    cap = OUTLIER_CAP if outliers_allowed else row_tol
    why += compare_logits.verdict(r, cap, None, 0.0)
    if r["finite"]:
        over = np.nonzero(r["rel"] > row_tol)[0]
        if len(over) > outliers_allowed:
            why.append(f"{len(over)} rows over relative L2 {row_tol:g} (allowed {outliers_allowed}): rows {over.tolist()[:10]}")
        # The mean without the allowed outliers: routing flips must stay rare, the rest close.
        rest = np.sort(r["rel"])[:len(r["rel"]) - outliers_allowed]
        if rest.mean() > mean_tol:
            why.append(f"mean relative L2 {rest.mean():.3g} > {mean_tol:g} (without the {outliers_allowed} largest)")
    print(f"{'FAIL' if why else 'ok  '} {name:18s} {compare_logits.summary(r)}  greedy {'same' if not note else note}"
          f"  [ours {t_ours:.2f}s, llama.cpp {t_ref:.2f}s]", flush=True)
    for w in why:
        print(f"     {name}: {w}")
    if not a.keep:
        for f in (model, ours_f, ref_f):
            os.remove(f)
    return not why


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hub", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--fixtures", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--peer", default=os.environ.get("MOEX_PEER_DIR", os.path.join(REPO, ".peer")))
    ap.add_argument("--arch", default=",".join(ARCHS))
    ap.add_argument("--type", default="f32,q8_0,q4_K")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--weights", default="blocks", help="gen --weights: blocks (fast) or float")
    ap.add_argument("--keep", action="store_true", help="keep models and logit dumps")
    a = ap.parse_args(argv)
    peer = setup_peer(a.peer)
    if peer is None:
        return SKIP
    os.makedirs(a.workdir, exist_ok=True)
    ok = True
    for arch in a.arch.split(","):
        for wtype in a.type.split(","):
            try:
                ok &= check_model(a, peer, arch, wtype)
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as e:
                print(f"FAIL {arch}_{wtype}: {e}")
                ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
