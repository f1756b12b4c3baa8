#!/usr/bin/python3
"""Self-checks of the reference forward pass on tiny random models written with
tiny_gguf: identities that hold for a correct implementation (GQA == MHA with
repeated k/v heads, MoE with identical experts == dense, causality, tied
output, RoPE properties), a per-token MoE loop against the vectorised one,
bad-input errors, and compare_logits' exit codes. Exits nonzero on failure."""
import os
import shutil
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_logits as C  # noqa: E402
import moex_ref as R  # noqa: E402
from tiny_gguf import write_gguf  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import check, failures  # noqa: E402

TMP = tempfile.mkdtemp(prefix="moex_ref_test_")
D, NH, NKV, HD, FF, V, L = 64, 4, 2, 16, 96, 120, 2


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def make_model(rng, arch="llama", n_kv=NKV, n_expert=0, k_used=0, tied=False):
    """kv and tensors of a random model; weights as float64 numpy arrays (out, in)."""
    kv = {"general.architecture": arch, f"{arch}.block_count": L, f"{arch}.embedding_length": D,
          f"{arch}.attention.head_count": NH, f"{arch}.attention.head_count_kv": n_kv,
          f"{arch}.attention.key_length": HD, f"{arch}.attention.value_length": HD,
          f"{arch}.feed_forward_length": FF, f"{arch}.rope.freq_base": 10000.0,
          f"{arch}.attention.layer_norm_rms_epsilon": 1e-6}
    if n_expert:
        kv[f"{arch}.expert_count"] = n_expert
        kv[f"{arch}.expert_used_count"] = k_used
        kv[f"{arch}.expert_feed_forward_length"] = FF
    w = lambda *s: rng.normal(0, 0.3 / np.sqrt(s[-1]), size=s) * 3
    t = {"token_embd.weight": rng.normal(0, 1, (V, D)), "output_norm.weight": 1 + 0.1 * rng.normal(size=D)}
    if not tied:
        t["output.weight"] = w(V, D)
    for i in range(L):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = 1 + 0.1 * rng.normal(size=D)
        t[p + "ffn_norm.weight"] = 1 + 0.1 * rng.normal(size=D)
        t[p + "attn_q.weight"] = w(NH * HD, D)
        t[p + "attn_k.weight"] = w(n_kv * HD, D)
        t[p + "attn_v.weight"] = w(n_kv * HD, D)
        t[p + "attn_output.weight"] = w(D, NH * HD)
        if arch.startswith("qwen3"):
            t[p + "attn_q_norm.weight"] = 1 + 0.2 * rng.normal(size=HD)
            t[p + "attn_k_norm.weight"] = 1 + 0.2 * rng.normal(size=HD)
        if n_expert:
            t[p + "ffn_gate_inp.weight"] = w(n_expert, D)
            t[p + "ffn_gate_exps.weight"] = w(n_expert, FF, D)
            t[p + "ffn_up_exps.weight"] = w(n_expert, FF, D)
            t[p + "ffn_down_exps.weight"] = w(n_expert, D, FF)
        else:
            t[p + "ffn_gate.weight"] = w(FF, D)
            t[p + "ffn_up.weight"] = w(FF, D)
            t[p + "ffn_down.weight"] = w(D, FF)
    return kv, t


def run(name, kv, t, tokens, ftype="f32"):
    path = os.path.join(TMP, name + ".gguf")
    write_gguf(path, kv, {k: (v, ftype if v.ndim > 1 else "f32") for k, v in t.items()})
    return R.forward(R.GGUF(path), tokens)


TOKENS = [1, 7, 33, 2, 99, 119, 0, 45, 45, 12, 3, 88]


def test_parse_roundtrip(rng):
    kv, t = make_model(rng)
    path = os.path.join(TMP, "rt.gguf")
    write_gguf(path, kv, {k: (v, "f32") for k, v in t.items()})
    g = R.GGUF(path)
    check("gguf metadata round trip", all(g.kv[k] == (np.float32(v) if isinstance(v, float) else v) for k, v in kv.items()))
    check("gguf tensors round trip", all(np.array_equal(g.load(k), v.astype(np.float32)) for k, v in t.items()))
    check("gguf row gather", np.array_equal(g.load("token_embd.weight", rows=[5, 2]), t["token_embd.weight"][[5, 2]].astype(np.float32)))


def test_gqa(rng, arch):
    """GQA with n_kv heads == MHA whose k/v heads are the GQA heads, each repeated
    group times: query head j reads kv head j // group."""
    kv, t = make_model(rng, arch)
    ours = run(f"gqa_{arch}", kv, t, TOKENS)
    group = NH // NKV
    kv2, t2 = dict(kv), dict(t)
    kv2[f"{arch}.attention.head_count_kv"] = NH
    for i in range(L):
        for n in ("attn_k", "attn_v"):
            w = t[f"blk.{i}.{n}.weight"].reshape(NKV, HD, D)
            t2[f"blk.{i}.{n}.weight"] = np.repeat(w, group, axis=0).reshape(NH * HD, D)
    mha = run(f"mha_{arch}", kv2, t2, TOKENS)
    check(f"{arch}: GQA == MHA with repeated kv heads", rel(ours, mha) < 1e-5, f"rel {rel(ours, mha):.2g}")


def test_moe_identical_experts(rng, arch_dense, arch_moe):
    kv, t = make_model(rng, arch_dense)
    dense = run(f"dense_{arch_dense}", kv, t, TOKENS)
    kvm = {k.replace(arch_dense + ".", arch_moe + "."): v for k, v in kv.items()}
    kvm["general.architecture"] = arch_moe
    kvm.update({f"{arch_moe}.expert_count": 4, f"{arch_moe}.expert_used_count": 2,
                f"{arch_moe}.expert_feed_forward_length": FF})
    tm = {}
    for k, v in t.items():
        if ".ffn_gate." in k or ".ffn_up." in k or ".ffn_down." in k:
            tm[k.replace(".weight", "_exps.weight")] = np.stack([v] * 4)
        else:
            tm[k] = v
    for i in range(L):
        tm[f"blk.{i}.ffn_gate_inp.weight"] = rng.normal(size=(4, D))
    moe = run(f"moe_{arch_moe}", kvm, tm, TOKENS)
    check(f"{arch_moe}: identical experts == dense {arch_dense}", rel(moe, dense) < 1e-5, f"rel {rel(moe, dense):.2g}")


def test_moe_loop(rng):
    """Vectorised routing against a plain per-token loop on one layer's input."""
    kv, t = make_model(rng, "qwen3moe", n_expert=6, k_used=3)
    path = os.path.join(TMP, "moe_loop.gguf")
    write_gguf(path, kv, {k: (v, "f32") for k, v in t.items()})
    g = R.GGUF(path)
    hp = R.HParams(g)
    h = rng.normal(size=(9, D))
    got = R.moe_ffn(R.Model(g), 1, h)
    router = g.load("blk.1.ffn_gate_inp.weight")
    exps = [g.load(f"blk.1.ffn_{p}_exps.weight") for p in ("gate", "up", "down")]
    want = np.zeros_like(h)
    for i in range(h.shape[0]):
        logits = router @ h[i]
        p = np.exp(logits - logits.max())
        p /= p.sum()
        top = sorted(range(6), key=lambda e: -p[e])[:3]
        s = sum(p[e] for e in top)
        for e in top:
            a = exps[0][e] @ h[i]
            want[i] += p[e] / s * (exps[2][e] @ (a / (1 + np.exp(-a)) * (exps[1][e] @ h[i])))
    check("MoE routing == per-token loop", rel(got, want) < 1e-12, f"rel {rel(got, want):.2g}")


def test_causal_and_tied(rng):
    kv, t = make_model(rng, "qwen3", tied=True)
    full = run("tied", kv, t, TOKENS)
    prefix = run("tied", kv, t, TOKENS[:5])
    check("causal: a prefix's logits do not change", rel(full[:5], prefix) < 1e-12)
    t2 = dict(t)
    t2["output.weight"] = t["token_embd.weight"]
    untied = run("untied", kv, t2, TOKENS)
    check("tied output == explicit copy of token_embd", rel(full, untied) < 1e-12)
    half = run("tied_f16", kv, t, TOKENS, "f16")
    check("f16 weights close to f32", rel(half, full) < 1e-2, f"rel {rel(half, full):.2g}")


def test_rope(rng):
    x = rng.normal(size=(5, 3, 16))
    pos = np.arange(5, dtype=np.float64) * 3
    for neox in (False, True):
        check(f"rope neox={neox}: position 0 is the identity", np.allclose(R.rope(x, np.zeros(5), 16, 1e4, neox), x))
        check(f"rope neox={neox}: keeps norms", np.allclose(np.linalg.norm(R.rope(x, pos, 16, 1e4, neox), axis=-1), np.linalg.norm(x, axis=-1)))
        # q.k after rotation depends only on the distance between positions.
        q, k = x[0, 0], x[1, 0]
        d1 = R.rope(q[None, None], np.array([7.0]), 16, 1e4, neox) @ R.rope(k[None, None], np.array([3.0]), 16, 1e4, neox)[0, 0]
        d2 = R.rope(q[None, None], np.array([104.0]), 16, 1e4, neox) @ R.rope(k[None, None], np.array([100.0]), 16, 1e4, neox)[0, 0]
        check(f"rope neox={neox}: relative positions", np.allclose(d1, d2))
    # neox pairs (i, i+8) are normal pairs (2i, 2i+1) after interleaving the halves.
    perm = np.stack([np.arange(8), np.arange(8) + 8], axis=1).ravel()
    a = R.rope(x, pos, 16, 1e4, True)[..., perm]
    b = R.rope(x[..., perm], pos, 16, 1e4, False)
    check("rope: neox == normal on interleaved dims", np.allclose(a, b))
    # Partial rotation leaves the tail alone; pair 1 at pos 1 turns by base^(-2/rope_dim).
    y = R.rope(x, pos, 8, 1e4, False)
    check("rope: dims past rope_dim untouched", np.array_equal(y[..., 8:], x[..., 8:]))
    e = np.zeros((1, 1, 4))
    e[0, 0, 2] = 1.0
    th = 100.0 ** -0.5
    check("rope: pair (2,3) angle at pos 1", np.allclose(R.rope(e, np.array([1.0]), 4, 100.0, False)[0, 0], [0, 0, np.cos(th), np.sin(th)]))


def test_act_quant_q4_1(rng):
    """--act-quant with a q4_1 weight: each block contributes d_w * d_a * sum(q_w q_a)
    + m_w * s_a, with s_a = f16(d_a * sum(q_a)) the Q8_1 block sum (ggml's vec_dot_q4_1_q8_1)."""
    rows, cols = 3, 64
    raw = rng.integers(0, 256, size=(rows * cols // 32, 20), dtype=np.uint8)
    raw[:, 0:4] = rng.uniform(-1, 1, size=(raw.shape[0], 2)).astype("<f2").view(np.uint8)
    path = os.path.join(TMP, "q4_1.gguf")
    write_gguf(path, {"general.architecture": "llama"}, {"w": ("raw", 3, [cols, rows], raw.tobytes())})
    m = R.Model.__new__(R.Model)
    m.g, m.act_quant = R.GGUF(path), True
    x = rng.normal(size=(2, cols))
    got = m.linear(x, "w")
    want = np.zeros((2, rows))
    for t in range(2):
        for r in range(rows):
            for b in range(cols // 32):
                blk = raw[r * cols // 32 + b]
                dw, mw = blk[0:2].view("<f2")[0], blk[2:4].view("<f2")[0]
                qw = np.concatenate([blk[4:20] & 0xF, blk[4:20] >> 4]).astype(np.int64)
                xa = np.float32(x[t, 32 * b:32 * b + 32])
                da = np.max(np.abs(xa)) / np.float32(127)
                qa = np.array([np.sign(v) * np.floor(abs(v) + 0.5) for v in (xa * (np.float32(1) / da)).astype(np.float64)])
                sa = float(np.float16(np.float32(qa.sum()) * da))
                want[t, r] += float(dw) * float(np.float16(da)) * float((qw * qa).sum()) + float(mw) * sa
    check("act-quant q4_1 == ggml's per-block formula", rel(got, want) < 1e-12, f"rel {rel(got, want):.2g}")


def test_bad_input(rng):
    kv, t = make_model(rng)
    path = os.path.join(TMP, "bad.gguf")
    write_gguf(path, kv, {k: (v, "f32") for k, v in t.items()})
    data = open(path, "rb").read()
    cases = {"truncated header": data[:100], "truncated data": data[:-64], "bad magic": b"GGUX" + data[4:],
             "empty": b""}
    for name, blob in cases.items():
        p = os.path.join(TMP, "bad_case.gguf")
        open(p, "wb").write(blob)
        try:
            R.forward(R.GGUF(p), [1, 2])
            check(f"bad input rejected: {name}", False)
        except R.RefError as e:
            check(f"bad input rejected: {name}", True, str(e)[:60])
    out = os.path.join(TMP, "o.f32")
    check("token out of range: exit 1", R.main([path, "--tokens", f"1,{V}", "--out", out]) == 1)
    check("non-numeric tokens: exit 1", R.main([path, "--tokens", "1,x", "--out", out]) == 1)


def test_compare_logits(rng):
    ref = rng.normal(size=(6, 50)).astype("<f4")
    ref[:, 7] += 10  # a clear argmax everywhere
    p_ref, p_ours = os.path.join(TMP, "ref.f32"), os.path.join(TMP, "ours.f32")
    ref.tofile(p_ref)
    near = ref + 1e-6 * rng.normal(size=ref.shape).astype("<f4")
    near.tofile(p_ours)
    check("compare: near-identical passes", C.main([p_ours, p_ref, "--vocab", "50", "--generated", "7,7,7", "--prompt-len", "4"]) == 0)
    check("compare: generated id that is not the argmax fails", C.main([p_ours, p_ref, "--vocab", "50", "--generated", "7,3,7", "--prompt-len", "4"]) == 1)
    far = ref.copy()
    far[2] += 0.1 * rng.normal(size=50).astype("<f4")
    far.tofile(p_ours)
    check("compare: 1e-2 error fails a 1e-4 bound", C.main([p_ours, p_ref, "--vocab", "50"]) == 1)
    check("compare: ... and passes a 0.1 bound", C.main([p_ours, p_ref, "--vocab", "50", "--max-rel", "0.1"]) == 0)
    swapped = ref.copy()
    swapped[3, 7] -= 20
    swapped.tofile(p_ours)
    check("compare: clear argmax change fails", C.main([p_ours, p_ref, "--vocab", "50", "--max-rel", "10", "--min-top1", "0"]) == 1)
    ref[:4].tofile(p_ours)
    check("compare: row count mismatch is exit 2", C.main([p_ours, p_ref, "--vocab", "50"]) == 2)
    check("compare: vocab not dividing is exit 2", C.main([p_ours, p_ref, "--vocab", "7"]) == 2)


def main():
    rng = np.random.default_rng(7)
    test_parse_roundtrip(rng)
    test_gqa(rng, "llama")
    test_gqa(rng, "qwen3")
    test_moe_identical_experts(rng, "llama", "llama")
    test_moe_identical_experts(rng, "qwen3", "qwen3moe")
    test_moe_loop(rng)
    test_causal_and_tied(rng)
    test_rope(rng)
    test_act_quant_q4_1(rng)
    test_bad_input(rng)
    test_compare_logits(rng)
    shutil.rmtree(TMP, ignore_errors=True)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
