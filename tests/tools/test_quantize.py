#!/usr/bin/python3
"""moex-gguf quantize against an independent reading of its output.

Quantizes f32 models from `moex-gguf gen` and checks, with the NumPy GGUF
reader and dequantizers of tests/ref (not the C code under test):
  - tensors: the same names, order and shapes; each type as llama.cpp's rule
    gives it (restated here: q4_K_M's mix, the 8-expert variant, a tied
    token_embd as the output, block fallbacks; norms and routers untouched);
  - values: dequantized output against the source within each type's error
    (q8_0: half a quantization step per element; the others a relative RMS
    bound per tensor), norms and routers bit for bit;
  - metadata: every key copied unchanged except general.file_type;
  - re-quantizing a Q8_0 file to q8_0 gives the same bytes;
  - bad usage (unknown type, missing input, OUT = IN) fails clearly and
    leaves no output (and the input untouched).

    test_quantize.py MOEX_GGUF VOCAB.gguf WORKDIR
"""
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "ref"))
import moex_ref  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import check, failures  # noqa: E402

T = {"f32": 0, "f16": 1, "q4_0": 2, "q5_0": 6, "q5_1": 7, "q8_0": 8, "q4_K": 12, "q5_K": 13, "q6_K": 14}
NAME = {v: k for k, v in T.items()}
BLOCK = {0: 1, 1: 1, 2: 32, 6: 32, 7: 32, 8: 32, 12: 256, 13: 256, 14: 256}
# Relative RMS error of a tensor of roughly normal values (measured well below).
REL_RMS = {1: 1e-3, 2: 0.12, 6: 0.06, 7: 0.05, 12: 0.08, 13: 0.04, 14: 0.02}


def run(cmd, expect=0):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if p.returncode != expect:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}, expected {expect}\n{p.stderr}")
    return p


def more_bits(layer, n_layer):
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


def expected_type(name, ne, n_dims, src_type, mode, n_layer, n_expert, tied):
    """llama.cpp's llama_tensor_get_type for the types and tensors these models have."""
    if n_dims < 2 or "ffn_gate_inp" in name:
        return src_type
    if mode != "q4_K_M":
        want = T[mode]
    else:
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        eight = n_expert == 8
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            want = T["q6_K"]
        elif ".attn_k." in name:
            want = T["q8_0"] if eight else T["q4_K"]
        elif ".attn_v." in name:
            want = T["q8_0"] if eight else (T["q6_K"] if more_bits(layer, n_layer) else T["q4_K"])
        elif ".attn_output." in name:
            want = T["q5_K"] if eight else T["q4_K"]
        elif ".ffn_down" in name:
            want = T["q6_K"] if more_bits(layer, n_layer) else T["q4_K"]
        else:
            want = T["q4_K"]
    if ne[0] % BLOCK[want]:
        want = {T["q4_K"]: T["q5_0"], T["q5_K"]: T["q5_1"], T["q6_K"]: T["q8_0"]}.get(want, want)
        if ne[0] % BLOCK[want]:
            want = T["f16"]
    return want


def q8_0_bound(src):
    """Per element: half of its block's step absmax/127 (+ the f16 rounding of the scale)."""
    blocks = src.reshape(-1, 32)
    step = np.abs(blocks).max(1, keepdims=True) / 127
    return np.broadcast_to(step * 0.5 + step * 127 * 2 ** -10, blocks.shape).reshape(src.shape)


def check_model(gguf, src_path, out_path, mode, n_layer, n_expert, tied):
    run([gguf, "quantize", src_path, out_path, "--type", mode, "--quiet"])
    src, out = moex_ref.GGUF(src_path), moex_ref.GGUF(out_path)
    label = f"{os.path.basename(src_path)} -> {mode}"
    check(f"{label}: tensor names/order differ", list(src.tensors) == list(out.tensors))
    types = {}
    for name, ts in src.tensors.items():
        to = out.tensors.get(name)
        if to is None:
            continue
        check(f"{label}: {name} shape {to.ne} != {ts.ne}", to.ne == ts.ne)
        want = expected_type(name, ts.ne, len(ts.ne), ts.type_id, mode, n_layer, n_expert, tied)
        check(f"{label}: {name} is {NAME.get(to.type_id)}, expected {NAME.get(want)}", to.type_id == want)
        types[to.type_id] = types.get(to.type_id, 0) + 1
        a, b = src.load(name).ravel(), out.load(name).ravel()
        if to.type_id == ts.type_id:
            check(f"{label}: {name} kept its type but changed values", np.array_equal(a, b))
        elif to.type_id == T["q8_0"]:
            err = np.abs(a - b) - q8_0_bound(a)
            check(f"{label}: {name} q8_0 error exceeds half a step by {err.max():.3g}", err.max() <= 1e-7)
        else:
            rel = np.sqrt(np.mean((a - b) ** 2) / np.mean(a ** 2))
            check(f"{label}: {name} {NAME[to.type_id]} relative RMS {rel:.3g} "
                                             f">= {REL_RMS[to.type_id]}", rel < REL_RMS[to.type_id])
    for k, v in src.kv.items():
        if k != "general.file_type":
            check(f"{label}: metadata {k} not copied",
                  k in out.kv and (out.kv[k] == v if not isinstance(v, np.ndarray) else np.array_equal(out.kv[k], v)))
    check(f"{label}: extra metadata keys", set(out.kv) - set(src.kv) <= {"general.file_type"})
    ftype = {"q8_0": 7, "q4_K_M": 15, "f16": 1, "q4_0": 2, "q5_K": 16, "q6_K": 18}[mode]
    check(f"{label}: general.file_type {out.kv.get('general.file_type')}", out.kv.get("general.file_type") == ftype)
    print(f"ok   {label}: " + ", ".join(f"{NAME[t]} x{n}" for t, n in sorted(types.items())))


def check_usage(gguf, src_path, work):
    out = os.path.join(work, "bad.gguf")
    before = open(src_path, "rb").read()
    for args, code, why in (([src_path, out, "--type", "q3_K"], 2, "unknown --type"),
                            ([src_path, out], 2, "missing --type"),
                            ([os.path.join(work, "absent.gguf"), out, "--type", "q8_0"], 1, "missing input"),
                            ([src_path, src_path, "--type", "q8_0"], 1, "OUT = IN")):
        p = run([gguf, "quantize"] + args, expect=code)
        check(f"usage ({why}): no message", p.stderr.strip() != "")
        check(f"usage ({why}): left a file", not os.path.exists(out) and not os.path.exists(out + ".partial"))
    check("usage: the input changed", open(src_path, "rb").read() == before)
    print("ok   bad usage: clear errors, no output, input untouched")


def main(argv):
    gguf, vocab, work = argv
    os.makedirs(work, exist_ok=True)
    models = [  # (name, gen flags, layers, experts, tied)
        ("moe8", ["--layers", "2"], 2, 8, False),
        ("moe16_tied", ["--layers", "4", "--experts", "16", "--experts-used", "2", "--expert-ff", "64", "--tied"],
         4, 16, True),
    ]
    for name, flags, n_layer, n_expert, tied in models:
        src = os.path.join(work, f"{name}-f32.gguf")
        run([gguf, "gen", "--arch", "qwen3moe", "--preset", "test", "--vocab", vocab, "--type", "f32", "--seed", "3",
             "--quiet", "-o", src] + flags)
        for mode in ("q8_0", "q4_K_M", "f16", "q4_0", "q5_K"):
            check_model(gguf, src, os.path.join(work, f"{name}-{mode}.gguf"), mode, n_layer, n_expert, tied)
    # Q8_0 -> q8_0 copies the blocks: the same bytes.
    q8, again = os.path.join(work, "moe8-q8_0.gguf"), os.path.join(work, "moe8-q8_0-again.gguf")
    run([gguf, "quantize", q8, again, "--type", "q8_0", "--quiet"])
    check("q8_0 -> q8_0 changed the file", open(q8, "rb").read() == open(again, "rb").read())
    print("ok   q8_0 -> q8_0 is byte for byte the same file")
    check_usage(gguf, os.path.join(work, "moe8-f32.gguf"), work)
    for f in os.listdir(work):
        os.remove(os.path.join(work, f))
    print(f"{'FAILED' if failures else 'passed'}: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
