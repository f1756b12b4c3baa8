#!/usr/bin/python3
"""The generator's weights are exactly the documented function of the seed.

`moex-gguf gen` promises the same model on any machine: value k of tensor t
(t = its position in the file) is
    key   = splitmix64(splitmix64(seed) ^ (t + 1) * 0xD1B54A32D192ED03)
    r     = splitmix64(key + k * 0x9E3779B97F4A7C15)
    normal: (sum of r's four 16-bit parts - 131070) * (1 / 37837.227)   [float32]
    weight = scale * normal, scale = gain / sqrt(fan_in)                [float32]
    norm weight = 1 + 0.1 * (2 * (r >> 40) / 2^24 - 1)                  [float32]
This re-derives the values of an f32 model with NumPy (an independent
implementation of that definition) and requires bit equality.

    test_gen_prng.py MOEX_GGUF VOCAB.gguf WORKDIR
"""
import os
import subprocess
import sys

import numpy as np

sys.dont_write_bytecode = True   # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ref"))
import moex_ref  # noqa: E402  (the reference's independent GGUF reader)

M64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(x):
    """Vectorised over uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x + np.uint64(GOLDEN)).astype(np.uint64)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def stream(seed, t, n):
    key = splitmix64(np.uint64(seed)) ^ np.uint64(((t + 1) * 0xD1B54A32D192ED03) & M64)
    key = splitmix64(np.array([key], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        k = np.arange(n, dtype=np.uint64) * np.uint64(GOLDEN) + key
    return splitmix64(k)


def normals(r):
    s = sum(((r >> np.uint64(16 * i)) & np.uint64(0xFFFF)).astype(np.int64) for i in range(4))
    return (s - 131070).astype(np.float32) * (np.float32(1.0) / np.float32(37837.227))


def norm_weights(r):
    u = (r >> np.uint64(40)).astype(np.float32) * (np.float32(1.0) / np.float32(16777216.0))
    return np.float32(1.0) + np.float32(0.1) * (np.float32(2.0) * u - np.float32(1.0))


def main(argv):
    gguf, vocab, work = argv
    os.makedirs(work, exist_ok=True)
    path = os.path.join(work, "prng.gguf")
    seed = 12345678901234567
    subprocess.run([gguf, "gen", "--arch", "qwen3moe", "--preset", "test", "--vocab", vocab, "--type", "f32",
                    "--seed", str(seed), "--layers", "1", "-o", path, "--quiet"], check=True)
    g = moex_ref.GGUF(path)
    names = list(g.tensors)
    n_embd = g.tensors["token_embd.weight"].ne[0]
    f32 = np.float32
    # (tensor, kind, scale) with the generator's documented gains.
    cases = [("token_embd.weight", "normal", f32(1.0)),
             ("blk.0.attn_q.weight", "normal", f32(1.0) / np.sqrt(f32(n_embd))),
             ("blk.0.attn_output.weight", "normal", f32(1.0) / np.sqrt(f32(256))),
             ("blk.0.ffn_gate_inp.weight", "normal", f32(1.5) / np.sqrt(f32(n_embd))),
             ("blk.0.ffn_down_exps.weight", "normal", f32(1.0) / np.sqrt(f32(256))),
             ("blk.0.attn_k_norm.weight", "norm", None),
             ("output_norm.weight", "norm", None),
             ("output.weight", "normal", f32(3.0) / np.sqrt(f32(n_embd)))]
    bad = 0
    for name, kind, scale in cases:
        t = g.tensors[name]
        got = np.frombuffer(g.raw_rows(t, 0, t.n_elements // t.ne[0]).tobytes(), dtype="<f4")
        r = stream(seed, names.index(name), t.n_elements)
        want = norm_weights(r) if kind == "norm" else scale * normals(r)
        same = np.array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))
        print(f"{'ok  ' if same else 'FAIL'} {name}: {t.n_elements} values"
              + ("" if same else f", {int(np.sum(got != want))} differ (first: got {got[got != want][:3]}, "
                                 f"want {want[got != want][:3]})"))
        bad += not same
    os.remove(path)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
