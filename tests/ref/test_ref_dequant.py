#!/usr/bin/python3
"""Checks the reference's vectorised decoders (moex_ref.dequantize) two ways:
1. hand-made blocks whose values follow from the ggml formulas by hand;
2. random blocks against a scalar, loop-by-loop transcription of ggml's
   dequantize_row_* (written separately here, element by element);
and 3. its activation quantizers (--act-quant) on hand-made inputs.
Exits nonzero on any mismatch."""
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moex_ref as R  # noqa: E402

FAILS = []


def check(name, got, want, tol=0.0):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape or not np.allclose(got, want, rtol=0, atol=tol):
        bad = np.argmax(np.abs(got - want)) if got.shape == want.shape else -1
        FAILS.append(f"{name}: shape {got.shape} vs {want.shape}, first bad index {bad}")


def h(x):
    return struct.pack("<e", x)


# ---- 1. hand-computed blocks ------------------------------------------------

def hand_blocks():
    # Q4_0: d = 0.5, every byte 0x9A: low nibble 10 -> (10-8)*0.5 = 1 (elements 0..15),
    # high nibble 9 -> 0.5 (elements 16..31).
    b = h(0.5) + bytes([0x9A]) * 16
    check("q4_0 hand", R.dequantize(2, np.frombuffer(b, np.uint8)), [1.0] * 16 + [0.5] * 16)

    # Q4_1: d = 2, m = -1, byte 0x31: low 1 -> 2*1-1 = 1; high 3 -> 5.
    b = h(2.0) + h(-1.0) + bytes([0x31]) * 16
    check("q4_1 hand", R.dequantize(3, np.frombuffer(b, np.uint8)), [1.0] * 16 + [5.0] * 16)

    # Q5_0: d = 1, qh = 0x00000001 | 0x00010000 (5th bit of elements 0 and 16),
    # nibbles 0: element 0 -> 16-16 = 0, element 16 -> 0, all others -> -16.
    b = h(1.0) + struct.pack("<I", 0x00010001) + bytes(16)
    want = [-16.0] * 32
    want[0] = want[16] = 0.0
    check("q5_0 hand", R.dequantize(6, np.frombuffer(b, np.uint8)), want)

    # Q5_1: d = 0.25, m = 1, qh bit 31 (element 31), byte 0xF0: low 0 -> 1;
    # high 15 -> 0.25*15+1 = 4.75, element 31: 31*0.25+1 = 8.75.
    b = h(0.25) + h(1.0) + struct.pack("<I", 0x80000000) + bytes([0xF0]) * 16
    want = [1.0] * 16 + [4.75] * 16
    want[31] = 8.75
    check("q5_1 hand", R.dequantize(7, np.frombuffer(b, np.uint8)), want)

    # Q8_0: d = -0.5, qs = -16..15 -> 8, 7.5, ..., -7.5.
    qs = np.arange(-16, 16, dtype=np.int8)
    b = h(-0.5) + qs.tobytes()
    check("q8_0 hand", R.dequantize(8, np.frombuffer(b, np.uint8)), -0.5 * qs.astype(np.float64))

    # Q4_K: d = 1, dmin = 0.5. scales bytes: s[0..3] = 2 (scale of sub-blocks 0-3),
    # s[4..7] = 4 (min of 0-3), s[8..11] = 0x13 (sub-blocks 4-7: scale 3, min 1),
    # plus s[0] |= 0x40 -> sub-block 4's scale gets 1<<4: 3 + 16 = 19.
    # All quant bytes 0x21: low nibble 1 (even sub-blocks), high 2 (odd).
    sc = bytes([0x42, 2, 2, 2, 4, 4, 4, 4, 0x13, 0x13, 0x13, 0x13])
    b = h(1.0) + h(0.5) + sc + bytes([0x21]) * 128
    scale = [2, 2, 2, 2, 19, 3, 3, 3]
    mins = [4, 4, 4, 4, 1, 1, 1, 1]
    q = [1, 2] * 4
    want = np.repeat([scale[s] * q[s] - 0.5 * mins[s] for s in range(8)], 32)
    check("q4_K hand", R.dequantize(12, np.frombuffer(b, np.uint8)), want)

    # Q5_K: same scales, quant bytes 0; qh byte = 0b00000100 for every l sets the
    # 5th bit in sub-block 2 only: sub-block 2 -> 2*16 - 0.5*4 = 30, others -0.5*min.
    b = h(1.0) + h(0.5) + sc + bytes([0x04]) * 32 + bytes(128)
    want = np.repeat([(scale[s] * (16 if s == 2 else 0)) - 0.5 * mins[s] for s in range(8)], 32)
    check("q5_K hand", R.dequantize(13, np.frombuffer(b, np.uint8)), want)

    # Q6_K: d = 0.5, scales 1..16 (sub-block i of 16 elements has scale i+1).
    # ql = 0, qh = 0xFF: every element's high two bits are 3 -> q = 48 - 32 = 16.
    scales = np.arange(1, 17, dtype=np.int8)
    b = bytes(128) + bytes([0xFF]) * 64 + scales.tobytes() + h(0.5)
    want = np.repeat(0.5 * 16 * np.arange(1, 17), 16)
    check("q6_K hand", R.dequantize(14, np.frombuffer(b, np.uint8)), want)
    # ... and ql low nibble 0xF, qh 0 in the first half only: elements 0..63 of
    # half 0 (groups 0,1) get q = 15 - 32 = -17.
    ql = bytearray(128)
    ql[0:64] = bytes([0x0F]) * 64
    b = bytes(ql) + bytes(64) + scales.tobytes() + h(0.5)
    q = np.full(256, -32.0)
    q[0:64] = -17.0
    check("q6_K hand 2", R.dequantize(14, np.frombuffer(b, np.uint8)), 0.5 * np.repeat(np.arange(1, 17), 16) * q)

    # MXFP4: e = 128 (x2); low nibbles the codes 0..15, high nibbles 15..0. Code c:
    # E2M1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6, negative for c >= 8. e = 1: x 2^-126.
    e2m1 = [0, .5, 1, 1.5, 2, 3, 4, 6, -0.0, -.5, -1, -1.5, -2, -3, -4, -6]
    qs = bytes(c | ((15 - c) << 4) for c in range(16))
    want = [2.0 * v for v in e2m1] + [2.0 * v for v in reversed(e2m1)]
    check("mxfp4 hand", R.dequantize(39, np.frombuffer(bytes([128]) + qs, np.uint8)), want)
    check("mxfp4 e 1", R.dequantize(39, np.frombuffer(bytes([1]) + qs, np.uint8)), [2.0 ** -126 * v / 2 for v in want])

    # Floats.
    v = np.array([1.5, -2.25, 1e-3, 65504.0])
    check("f32", R.dequantize(0, np.frombuffer(v.astype("<f4").tobytes(), np.uint8)), v.astype(np.float32))
    check("f16", R.dequantize(1, np.frombuffer(v.astype("<f2").tobytes(), np.uint8)), v.astype(np.float16))
    bf = np.array([0x3FC0, 0xC010, 0x0000, 0x7F7F], dtype="<u2")  # 1.5, -2.25, 0, max-ish
    want = [1.5, -2.25, 0.0, struct.unpack("<f", struct.pack("<I", 0x7F7F0000))[0]]
    check("bf16", R.dequantize(30, np.frombuffer(bf.tobytes(), np.uint8)), want)


# ---- 2. scalar transcription of ggml's loops ----------------------------------

def f16(b, off):
    return struct.unpack_from("<e", b, off)[0]


def scalar_q4_0(b):
    d = f16(b, 0)
    y = [0.0] * 32
    for j in range(16):
        y[j] = ((b[2 + j] & 0x0F) - 8) * d
        y[j + 16] = ((b[2 + j] >> 4) - 8) * d
    return y


def scalar_q4_1(b):
    d, m = f16(b, 0), f16(b, 2)
    y = [0.0] * 32
    for j in range(16):
        y[j] = (b[4 + j] & 0x0F) * d + m
        y[j + 16] = (b[4 + j] >> 4) * d + m
    return y


def scalar_q5(b, has_min):
    d = f16(b, 0)
    m = f16(b, 2) if has_min else 0.0
    o = 4 if has_min else 2
    qh = struct.unpack_from("<I", b, o)[0]
    qs = b[o + 4:o + 20]
    y = [0.0] * 32
    for j in range(16):
        xh_0 = ((qh >> (j + 0)) << 4) & 0x10
        xh_1 = (qh >> (j + 12)) & 0x10
        x0 = (qs[j] & 0x0F) | xh_0
        x1 = (qs[j] >> 4) | xh_1
        if has_min:
            y[j], y[j + 16] = x0 * d + m, x1 * d + m
        else:
            y[j], y[j + 16] = (x0 - 16) * d, (x1 - 16) * d
    return y


def scalar_q8_0(b):
    d = f16(b, 0)
    return [d * struct.unpack_from("<b", b, 2 + j)[0] for j in range(32)]


def get_scale_min_k4(j, q):
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def scalar_qK(b, five_bit):
    d, dmin = f16(b, 0), f16(b, 2)
    scales = b[4:16]
    qh = b[16:48] if five_bit else None
    ql = b[48:176] if five_bit else b[16:144]
    y = []
    is_, u1, u2, qo = 0, 1, 2, 0
    for _ in range(0, 256, 64):
        sc, m = get_scale_min_k4(is_ + 0, scales)
        d1, m1 = d * sc, dmin * m
        sc, m = get_scale_min_k4(is_ + 1, scales)
        d2, m2 = d * sc, dmin * m
        for l in range(32):
            hb = (16 if qh[l] & u1 else 0) if five_bit else 0
            y.append(d1 * ((ql[qo + l] & 0xF) + hb) - m1)
        for l in range(32):
            hb = (16 if qh[l] & u2 else 0) if five_bit else 0
            y.append(d2 * ((ql[qo + l] >> 4) + hb) - m2)
        qo += 32
        is_ += 2
        u1 <<= 2
        u2 <<= 2
    return y


def scalar_q6_K(b):
    d = f16(b, 208)
    y = [0.0] * 256
    for n in range(2):
        ql, qh, yo = 64 * n, 128 + 32 * n, 128 * n
        sc = lambda i: struct.unpack_from("<b", b, 192 + 8 * n + i)[0]
        for l in range(32):
            is_ = l // 16
            q1 = ((b[ql + l] & 0xF) | (((b[qh + l] >> 0) & 3) << 4)) - 32
            q2 = ((b[ql + l + 32] & 0xF) | (((b[qh + l] >> 2) & 3) << 4)) - 32
            q3 = ((b[ql + l] >> 4) | (((b[qh + l] >> 4) & 3) << 4)) - 32
            q4 = ((b[ql + l + 32] >> 4) | (((b[qh + l] >> 6) & 3) << 4)) - 32
            y[yo + l + 0] = d * sc(is_ + 0) * q1
            y[yo + l + 32] = d * sc(is_ + 2) * q2
            y[yo + l + 64] = d * sc(is_ + 4) * q3
            y[yo + l + 96] = d * sc(is_ + 6) * q4
    return y


# type id -> (scalar decoder of one block, offsets of its f16 fields)
SCALAR = {
    2: (scalar_q4_0, [0]), 3: (scalar_q4_1, [0, 2]),
    6: (lambda b: scalar_q5(b, False), [0]), 7: (lambda b: scalar_q5(b, True), [0, 2]),
    8: (scalar_q8_0, [0]), 12: (lambda b: scalar_qK(b, False), [0, 2]),
    13: (lambda b: scalar_qK(b, True), [0, 2]), 14: (scalar_q6_K, [208]),
}


def random_blocks(rng, type_id, n_blocks, f16_offsets):
    bb = R.GGML_TYPES[type_id][2]
    raw = rng.integers(0, 256, size=(n_blocks, bb), dtype=np.uint8)
    for off in f16_offsets:  # finite scales of either sign
        raw[:, off:off + 2] = rng.uniform(-2, 2, size=(n_blocks, 1)).astype("<f2").view(np.uint8)
    return raw


def random_vs_scalar():
    rng = np.random.default_rng(1234)
    for type_id, (scalar, f16s) in SCALAR.items():
        raw = random_blocks(rng, type_id, 7, f16s)
        want = np.concatenate([scalar(bytes(row)) for row in raw])
        # Python's scalar floats are float64, as are the reference's: exact match.
        check(f"{R.GGML_TYPES[type_id][0]} random", R.dequantize(type_id, raw.ravel()), want, tol=1e-12)
    # Bad input: a partial block is a clear error.
    try:
        R.dequantize(2, np.zeros(17, np.uint8))
        FAILS.append("partial q4_0 block was accepted")
    except R.RefError:
        pass


# ---- 3. activation quantizers of --act-quant (ggml quantize_row_q8_*_ref) ----

def activation_quantizers():
    # Q8_0: amax 127 -> d = 1; roundf sends halves away from zero (2.5 -> 3, -2.5 -> -3).
    x = np.zeros((1, 32))
    x[0, :5] = [127, 2.5, -2.5, 0.4, -126.6]
    vals, corr = R.act_q8_0(x)
    want = np.zeros(32)
    want[:5] = [127, 3, -3, 0, -127]
    check("act q8_0 rounding", vals[0], want)
    # Q8_1 sum term: s16 = f16(d * sum q) vs d16 * sum q, with d = 0.3/127 not exact in f16.
    x = np.full((1, 32), 0.1)
    x[0, 0] = 0.3
    vals, corr = R.act_q8_0(x)
    d = np.float32(np.float32(0.3) / np.float32(127))
    q = np.sign(x[0] / d) * np.floor(np.abs(np.float32(x[0]) * (np.float32(1) / d)) + 0.5)
    s16 = float(np.float16(np.float32(q.sum()) * d))
    check("act q8_1 sum term", corr[0], [s16 - float(np.float16(d)) * q.sum()], tol=1e-15)
    # Q8_K: signed max -2 -> iscale = 63.5, nearest_int ties to even (1 -> 63.5 -> 64), d = 1/63.5.
    x = np.zeros((1, 256))
    x[0, :4] = [-2, 1, 0.5, 1.9]
    want = np.zeros(256)
    want[:4] = np.array([-127, 64, 32, 121]) * float(np.float32(1) / np.float32(63.5))  # 1.9 * 63.5 = 120.65 -> 121
    check("act q8_K rounding", R.act_q8_K(x)[0], want, tol=1e-12)
    # A zero block stays zero (no division by zero).
    check("act q8_K zero block", R.act_q8_K(np.zeros((2, 256))), np.zeros((2, 256)))
    check("act q8_0 zero block", R.act_q8_0(np.zeros((2, 64)))[0], np.zeros((2, 64)))


def main():
    hand_blocks()
    random_vs_scalar()
    activation_quantizers()
    for f in FAILS:
        print("FAIL", f)
    print(f"dequant checks: {len(FAILS)} failures")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
