#!/usr/bin/python3
"""Independent NumPy reference of the MoEx model forward pass (float64).

Reads a GGUF file with its own parser, dequantizes every tensor with its own
vectorised decoders (ggml block layouts and formulas), and runs the forward
pass of llama / mixtral / qwen3 / qwen3moe written from the model definitions.
It shares no code with the C engine: it exists to check it.

    moex_ref.py MODEL.gguf --tokens 1,2,3 --out LOGITS.f32

writes float32 logits [positions][vocab] for every position (teacher forcing).
"""
import argparse
import struct
import sys

import numpy as np


class RefError(Exception):
    """Bad input (file, metadata, tokens): reported as one clear line."""


# ---------------------------------------------------------------- GGUF parser

GGUF_MAGIC = b"GGUF"
# Metadata value types: id -> struct format of a scalar (None: string/array).
GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
                7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
GGUF_STRING, GGUF_ARRAY = 8, 9

# ggml type id -> (name, elements per block, bytes per block)
GGML_TYPES = {
    0: ("f32", 1, 4), 1: ("f16", 1, 2), 30: ("bf16", 1, 2),
    2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20), 6: ("q5_0", 32, 22),
    7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34),
    12: ("q4_K", 256, 144), 13: ("q5_K", 256, 176), 14: ("q6_K", 256, 210),
    39: ("mxfp4", 32, 17),
}


class Reader:
    """Bounds-checked little-endian cursor over the mapped file."""

    def __init__(self, buf):
        self.buf, self.pos = buf, 0

    def take(self, n):
        if n < 0 or self.pos + n > len(self.buf):
            raise RefError(f"truncated GGUF: need {n} bytes at offset {self.pos}, file has {len(self.buf)}")
        b = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return b

    def scalar(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.scalar("<Q")
        return self.take(n).decode("utf-8", errors="replace")

    def value(self, vtype, depth=0):
        if vtype in GGUF_SCALARS:
            return self.scalar(GGUF_SCALARS[vtype])
        if vtype == GGUF_STRING:
            return self.string()
        if vtype == GGUF_ARRAY and depth < 4:
            etype, n = self.scalar("<I"), self.scalar("<Q")
            if etype in GGUF_SCALARS:  # fixed-size elements: read in one go
                fmt = GGUF_SCALARS[etype]
                size = struct.calcsize(fmt)
                return np.frombuffer(self.take(n * size), dtype=np.dtype(fmt))
            if n > len(self.buf):
                raise RefError(f"GGUF array of {n} elements cannot fit in the file")
            return [self.value(etype, depth + 1) for _ in range(n)]
        raise RefError(f"bad GGUF value type {vtype} at offset {self.pos}")


class Tensor:
    def __init__(self, name, ne, type_id, offset):
        if type_id not in GGML_TYPES:
            raise RefError(f"tensor {name}: unsupported ggml type {type_id}")
        self.name, self.ne, self.type_id, self.offset = name, ne, type_id, offset
        self.type_name, self.block_elems, self.block_bytes = GGML_TYPES[type_id]
        if ne[0] % self.block_elems:
            raise RefError(f"tensor {name}: row of {ne[0]} is not a multiple of the {self.type_name} block")
        self.n_elements = int(np.prod(ne, dtype=np.int64))
        self.row_bytes = ne[0] // self.block_elems * self.block_bytes
        self.nbytes = self.n_elements // ne[0] * self.row_bytes

    @property
    def shape(self):
        """numpy shape: ggml's ne reversed (ne[0] is the contiguous dimension)."""
        return tuple(reversed(self.ne))


class GGUF:
    def __init__(self, path):
        try:
            self.buf = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as e:
            raise RefError(f"cannot map {path}: {e}")
        r = Reader(self.buf)
        if r.take(4) != GGUF_MAGIC:
            raise RefError(f"{path} is not a GGUF file (bad magic)")
        self.version = r.scalar("<I")
        if self.version not in (2, 3):
            raise RefError(f"{path}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors, n_kv = r.scalar("<Q"), r.scalar("<Q")
        if n_tensors > len(self.buf) or n_kv > len(self.buf):
            raise RefError(f"{path}: implausible counts ({n_tensors} tensors, {n_kv} keys)")
        self.kv = {}
        for _ in range(n_kv):
            key = r.string()
            self.kv[key] = r.value(r.scalar("<I"))
        self.tensors = {}
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar("<I")
            if not 1 <= n_dims <= 4:
                raise RefError(f"tensor {name}: {n_dims} dimensions")
            ne = [r.scalar("<Q") for _ in range(n_dims)]
            type_id, offset = r.scalar("<I"), r.scalar("<Q")
            self.tensors[name] = Tensor(name, ne, type_id, offset)
        align = int(self.kv.get("general.alignment", 32))
        if align <= 0 or align & (align - 1):
            raise RefError(f"{path}: bad general.alignment {align}")
        self.data_offset = (r.pos + align - 1) // align * align
        for t in self.tensors.values():
            end = self.data_offset + t.offset + t.nbytes
            if t.offset % align or end > len(self.buf):
                raise RefError(f"tensor {t.name}: data [{t.offset}, +{t.nbytes}) misaligned or past end of file")

    def has(self, name):
        return name in self.tensors

    def raw_rows(self, t, first, count):
        """Bytes of rows first .. first+count-1 (rows of ne[0] elements)."""
        start = self.data_offset + t.offset + first * t.row_bytes
        return self.buf[start:start + count * t.row_bytes]

    def load(self, name, rows=None):
        """Dequantized float64 tensor in numpy shape; `rows` picks rows of a 2D tensor."""
        t = self.tensors.get(name)
        if t is None:
            raise RefError(f"missing tensor {name}")
        n_rows = t.n_elements // t.ne[0]
        if rows is not None:
            rows = np.asarray(rows, dtype=np.int64)
            if rows.size and (rows.min() < 0 or rows.max() >= n_rows):
                raise RefError(f"row index out of range for {name} ({n_rows} rows)")
            out = np.empty((rows.size, t.ne[0]), dtype=np.float64)
            for i, r in enumerate(rows):
                out[i] = dequantize(t.type_id, self.raw_rows(t, int(r), 1))
            return out
        out = np.empty(t.n_elements, dtype=np.float64)
        # Chunks of rows keep the decoder's temporaries small for big tensors.
        chunk = max(1, (1 << 22) // t.ne[0])
        for r0 in range(0, n_rows, chunk):
            n = min(chunk, n_rows - r0)
            out[r0 * t.ne[0]:(r0 + n) * t.ne[0]] = dequantize(t.type_id, self.raw_rows(t, r0, n))
        return out.reshape(t.shape)

    def block_mins(self, name, expert=None):
        """The f16 `m` of every q4_1/q5_1 block (at byte 2): (rows, blocks per row)."""
        t = self.tensors[name]
        if t.type_id not in (3, 7):
            raise RefError(f"{name} has no block mins")
        n = t.ne[1] if expert is not None else t.n_elements // t.ne[0]
        raw = self.raw_rows(t, (expert or 0) * t.ne[1], n)
        b = np.asarray(raw).reshape(n, -1, t.block_bytes)
        return b[:, :, 2:4].copy().view("<f2")[..., 0].astype(np.float64)

    def load_expert(self, name, e):
        """Expert e of a 3D tensor [in, out, n_expert]: (out, in) float64, decoding only its rows."""
        t = self.tensors.get(name)
        if t is None:
            raise RefError(f"missing tensor {name}")
        if len(t.ne) != 3 or not 0 <= e < t.ne[2]:
            raise RefError(f"{name} is not a 3D expert tensor with expert {e}")
        return dequantize(t.type_id, self.raw_rows(t, e * t.ne[1], t.ne[1])).reshape(t.ne[1], t.ne[0])


# ------------------------------------------------------------ dequantization
# Each decoder takes the raw bytes of whole blocks and returns float64 values
# in element order. Formulas follow ggml-quants.c dequantize_row_*.

def f16_field(blocks, off):
    return blocks[:, off:off + 2].copy().view("<f2").astype(np.float64)  # (nb, 1)


def deq_f32(raw):
    return np.frombuffer(raw, dtype="<f4").astype(np.float64)


def deq_f16(raw):
    return np.frombuffer(raw, dtype="<f2").astype(np.float64)


def deq_bf16(raw):
    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32).astype(np.float64)


def nibbles_split(qs):
    """32-blocks: low nibbles are elements 0..15, high nibbles 16..31."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.float64)


def high_bits_32(qh_bytes):
    """Bit j of the little-endian u32 qh is the 5th bit of element j."""
    return np.unpackbits(qh_bytes, axis=1, bitorder="little").astype(np.float64)


def deq_q4_0(b):
    return (f16_field(b, 0) * (nibbles_split(b[:, 2:18]) - 8)).ravel()


def deq_q4_1(b):
    return (f16_field(b, 0) * nibbles_split(b[:, 4:20]) + f16_field(b, 2)).ravel()


def deq_q5_0(b):
    q = nibbles_split(b[:, 6:22]) + 16 * high_bits_32(b[:, 2:6])
    return (f16_field(b, 0) * (q - 16)).ravel()


def deq_q5_1(b):
    q = nibbles_split(b[:, 8:24]) + 16 * high_bits_32(b[:, 4:8])
    return (f16_field(b, 0) * q + f16_field(b, 2)).ravel()


def deq_q8_0(b):
    qs = b[:, 2:34].copy().view(np.int8).astype(np.float64)
    return (f16_field(b, 0) * qs).ravel()


def deq_mxfp4(b):
    """MXFP4 (OCP MX): an E8M0 exponent byte e (2^(e-127)), then 32 E2M1 codes as
    nibbles (low: elements 0..15): sign bit 3, exponent bits 2..1 (bias 1,
    0 subnormal), mantissa bit 0. From the bits, not from ggml's doubled table."""
    c = nibbles_split(b[:, 1:17]).astype(np.int64)
    exp, man = (c >> 1) & 3, (c & 1).astype(np.float64)
    mag = np.where(exp == 0, 0.5 * man, np.ldexp(1.0 + 0.5 * man, np.maximum(exp - 1, 0)))
    vals = np.where(c & 8, -mag, mag)
    return (np.ldexp(1.0, b[:, 0].astype(np.int64) - 127)[:, None] * vals).ravel()


def k_scales_mins(s):
    """The 8 six-bit (scale, min) pairs packed in the 12 `scales` bytes of Q4_K/Q5_K."""
    s = s.astype(np.int64)
    sc = np.empty((s.shape[0], 8), dtype=np.int64)
    mn = np.empty_like(sc)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 0xF) | ((s[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (s[:, 8:12] >> 4) | ((s[:, 4:8] >> 6) << 4)
    return sc.astype(np.float64), mn.astype(np.float64)


def k_nibbles(qs):
    """K-quant 4-bit part: 4 chunks of 32 bytes; low nibbles are sub-block 2c, high 2c+1."""
    q = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([q & 0xF, q >> 4], axis=2).reshape(-1, 8, 32).astype(np.float64)


def deq_q4_K(b):
    d, dmin = f16_field(b, 0), f16_field(b, 2)
    sc, mn = k_scales_mins(b[:, 4:16])
    q = k_nibbles(b[:, 16:144])
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).ravel()


def deq_q5_K(b):
    d, dmin = f16_field(b, 0), f16_field(b, 2)
    sc, mn = k_scales_mins(b[:, 4:16])
    qh = b[:, 16:48]  # bit s of qh[l] is the 5th bit of element l of sub-block s
    hbit = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1
    q = k_nibbles(b[:, 48:176]) + 16 * hbit.astype(np.float64)
    return ((d * sc)[:, :, None] * q - (dmin * mn)[:, :, None]).ravel()


def deq_q6_K(b):
    ql = b[:, 0:128].reshape(-1, 2, 64)
    qh = b[:, 128:192].reshape(-1, 2, 32)
    scales = b[:, 192:208].copy().view(np.int8).astype(np.float64)  # 16 sub-blocks of 16
    d = f16_field(b, 208)
    # Per 128-half: 4 groups of 32; group g takes low (g<2) or high nibbles of
    # ql[32*(g%2) + l] and bits 2g..2g+1 of qh[l].
    lo = np.stack([ql[:, :, 0:32] & 0xF, ql[:, :, 32:64] & 0xF, ql[:, :, 0:32] >> 4, ql[:, :, 32:64] >> 4], axis=2)
    hi = np.stack([(qh >> (2 * g)) & 3 for g in range(4)], axis=2)
    q = (lo.astype(np.int64) | (hi.astype(np.int64) << 4)) - 32  # (nb, 2, 4, 32)
    q = q.reshape(-1, 16, 16).astype(np.float64)
    return (d[:, :, None] * scales[:, :, None] * q).ravel()


DEQUANT_BLOCKS = {2: deq_q4_0, 3: deq_q4_1, 6: deq_q5_0, 7: deq_q5_1, 8: deq_q8_0,
                  12: deq_q4_K, 13: deq_q5_K, 14: deq_q6_K, 39: deq_mxfp4}
DEQUANT_FLOAT = {0: deq_f32, 1: deq_f16, 30: deq_bf16}


def dequantize(type_id, raw):
    """float64 values of raw bytes holding whole blocks of type_id."""
    raw = np.asarray(raw, dtype=np.uint8)
    if type_id in DEQUANT_FLOAT:
        return DEQUANT_FLOAT[type_id](raw.tobytes())
    if type_id not in DEQUANT_BLOCKS:
        raise RefError(f"no decoder for ggml type {type_id}")
    block_bytes = GGML_TYPES[type_id][2]
    if raw.size % block_bytes:
        raise RefError(f"{raw.size} bytes is not a whole number of {GGML_TYPES[type_id][0]} blocks")
    return DEQUANT_BLOCKS[type_id](raw.reshape(-1, block_bytes))


# ------------------------------------------------------------- hyperparameters

class HParams:
    def __init__(self, g):
        arch = g.kv.get("general.architecture")
        if arch not in ("llama", "qwen3", "qwen3moe"):
            raise RefError(f"unsupported architecture {arch!r} (llama, qwen3, qwen3moe)")

        def key(suffix, default=None):
            v = g.kv.get(f"{arch}.{suffix}", default)
            if v is None:
                raise RefError(f"missing metadata key {arch}.{suffix}")
            return v

        self.arch = arch
        self.n_layer = int(key("block_count"))
        self.n_embd = int(key("embedding_length"))
        self.n_head = int(key("attention.head_count"))
        self.n_head_kv = int(key("attention.head_count_kv", self.n_head))
        self.head_dim = int(key("attention.key_length", self.n_embd // self.n_head))
        self.rope_dim = int(key("rope.dimension_count", self.head_dim))
        self.rope_base = float(key("rope.freq_base", 10000.0))
        self.eps = float(key("attention.layer_norm_rms_epsilon", 1e-5))
        self.n_expert = int(key("expert_count", 0))
        self.n_expert_used = int(key("expert_used_count", 0))
        # Qwen-style: rotate halves and normalise q/k per head.
        self.neox = self.qk_norm = arch in ("qwen3", "qwen3moe")
        if self.n_head % self.n_head_kv or self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise RefError(f"inconsistent heads: {self.n_head}/{self.n_head_kv} heads, head_dim {self.head_dim}, rope_dim {self.rope_dim}")
        if self.n_expert and not 0 < self.n_expert_used <= self.n_expert:
            raise RefError(f"bad expert_used_count {self.n_expert_used} of {self.n_expert}")
        emb = g.tensors.get("token_embd.weight")
        if emb is None or len(emb.ne) != 2 or emb.ne[0] != self.n_embd:
            raise RefError("token_embd.weight missing or not [n_embd, n_vocab]")
        self.n_vocab = emb.ne[1]


# ------------------------------------------- optional activation quantization
# llama.cpp (and our engine) quantize the activations of a product with a
# quantized weight to 8 bits: Q8_0 for q4_0/q5_0/q8_0/mxfp4, Q8_1 for q4_1/q5_1, Q8_K
# for K-quants (ggml's quantize_row_q8_*_ref). With --act-quant the reference
# does the same (arithmetic of the quantizer in float32, as ggml does), so the
# only difference left is summation order. Float weights keep f32 activations.
Q8_0_PARTNERS = (2, 6, 8, 39)  # mxfp4 too
Q8_1_PARTNERS = (3, 7)  # weights with a min: the min term uses the Q8_1 block sum
Q8_K_PARTNERS = (12, 13, 14)


def signed_absmax(blocks):
    """Per block: the first element of largest magnitude, with its sign."""
    idx = np.argmax(np.abs(blocks), axis=-1)
    return np.take_along_axis(blocks, idx[..., None], axis=-1)


def act_q8_0(x):
    """Q8_0: d = amax / 127 (stored as f16), q = roundf(x / d) computed as x * (1/d).
    Returns the values d16 * q and, per block, the Q8_1 sum term s16 - d16 * sum(q)
    (s16 = f16(d * sum(q)) is what a Q8_1 block carries for the weights' min term)."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    d = np.abs(signed_absmax(b)) / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (b * inv).astype(np.float64)
    q = np.sign(v) * np.floor(np.abs(v) + 0.5)  # roundf: halves away from zero
    d16 = d.astype(np.float16).astype(np.float64)
    sum_q = q.sum(axis=-1, keepdims=True)
    s16 = (sum_q.astype(np.float32) * d).astype(np.float16).astype(np.float64)
    return (d16 * q).reshape(x.shape), (s16 - d16 * sum_q)[..., 0]


def act_q8_K(x):
    """Q8_K: iscale = -127 / (signed max), q = min(127, nearest_int(iscale x)), d = 1 / iscale (f32)."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, 256)
    mx = signed_absmax(b)
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127) / mx, np.float32(0)).astype(np.float32)
        d = np.where(mx != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    q = np.minimum(127, np.rint((iscale * b).astype(np.float64)))  # nearest_int: halves to even
    return (d.astype(np.float64) * q).reshape(x.shape)


def quantize_activations(x, weight_type):
    """(values the engine multiplies, per-32-block correction of the min term or None)."""
    if weight_type in Q8_0_PARTNERS:
        return act_q8_0(x)[0], None
    if weight_type in Q8_1_PARTNERS:
        return act_q8_0(x)
    if weight_type in Q8_K_PARTNERS:
        return act_q8_K(x), None
    return x, None


# ---------------------------------------------------------------- the model

def rms_norm(x, w, eps):
    """Normalises the last axis: x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def rope(x, positions, rope_dim, base, neox):
    """Rotates the first rope_dim dims of each head. x: (T, heads, head_dim).
    Pair i (i < rope_dim/2) turns by pos * base^(-2i/rope_dim); the pair is
    (i, i + rope_dim/2) in neox style, (2i, 2i+1) otherwise."""
    half = rope_dim // 2
    theta = positions[:, None] * base ** (-2.0 * np.arange(half) / rope_dim)  # (T, half)
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:rope_dim]
        out[..., :half] = a * cos - b * sin
        out[..., half:rope_dim] = a * sin + b * cos
    else:
        a, b = x[..., 0:rope_dim:2], x[..., 1:rope_dim:2]
        out[..., 0:rope_dim:2] = a * cos - b * sin
        out[..., 1:rope_dim:2] = a * sin + b * cos
    return out


class Model:
    """A GGUF model's weights and hyperparameters, and how its products are taken."""

    def __init__(self, g, act_quant=False):
        self.g, self.hp, self.act_quant = g, HParams(g), act_quant

    def vec(self, name):
        return self.g.load(name)

    def linear(self, x, name, expert=None):
        """x @ W.T for the weight `name` (numpy shape (out, in)); `expert` picks a 3D slice."""
        w = self.g.load(name) if expert is None else self.g.load_expert(name, expert)
        if not self.act_quant:
            return x @ w.T
        xq, min_corr = quantize_activations(x, self.g.tensors[name].type_id)
        y = xq @ w.T
        if min_corr is not None:
            y += min_corr @ self.g.block_mins(name, expert).T
        return y


def attention(m, il, h, positions):
    """Causal GQA self-attention of the normalised hidden states h: (T, n_embd)."""
    hp, T, hd = m.hp, h.shape[0], m.hp.head_dim
    name = lambda n: f"blk.{il}.{n}.weight"
    q = m.linear(h, name("attn_q")).reshape(T, hp.n_head, hd)
    k = m.linear(h, name("attn_k")).reshape(T, hp.n_head_kv, hd)
    v = m.linear(h, name("attn_v")).reshape(T, hp.n_head_kv, hd)
    if hp.qk_norm:  # before RoPE
        q = rms_norm(q, m.vec(name("attn_q_norm")), hp.eps)
        k = rms_norm(k, m.vec(name("attn_k_norm")), hp.eps)
    q = rope(q, positions, hp.rope_dim, hp.rope_base, hp.neox)
    k = rope(k, positions, hp.rope_dim, hp.rope_base, hp.neox)
    group = hp.n_head // hp.n_head_kv
    k = np.repeat(k, group, axis=1)  # query head j reads kv head j // group
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(hd)
    future = np.triu(np.ones((T, T), dtype=bool), 1)
    scores[:, future] = -np.inf
    out = np.einsum("hts,shd->thd", softmax(scores), v).reshape(T, hp.n_head * hd)
    return m.linear(out, name("attn_output"))


def swiglu(m, x, names, expert=None):
    """down(silu(gate x) * up x) with names = (gate, up, down)."""
    gate, up, down = names
    return m.linear(silu(m.linear(x, gate, expert)) * m.linear(x, up, expert), down, expert)


def expert_ffn(m, il, e, x):
    """Expert e: merged 3D tensors, or one tensor per expert (older Mixtral files)."""
    if m.g.has(f"blk.{il}.ffn_gate_exps.weight"):
        return swiglu(m, x, [f"blk.{il}.ffn_{p}_exps.weight" for p in ("gate", "up", "down")], e)
    return swiglu(m, x, [f"blk.{il}.ffn_{p}.{e}.weight" for p in ("gate", "up", "down")])


def moe_ffn(m, il, h):
    """Softmax router over all experts, top-k, weights renormalised to sum 1."""
    probs = softmax(h @ m.vec(f"blk.{il}.ffn_gate_inp.weight").T)  # (T, n_expert)
    top = np.argsort(-probs, axis=1, kind="stable")[:, :m.hp.n_expert_used]
    w = np.take_along_axis(probs, top, axis=1)
    w /= w.sum(axis=1, keepdims=True)
    out = np.zeros_like(h)
    for e in np.unique(top):
        tok, slot = np.nonzero(top == e)
        out[tok] += w[tok, slot][:, None] * expert_ffn(m, il, int(e), h[tok])
    return out


def ffn(m, il, h):
    if m.g.has(f"blk.{il}.ffn_gate_inp.weight"):
        if not m.hp.n_expert:
            raise RefError(f"layer {il} has a router but {m.hp.arch}.expert_count is absent")
        return moe_ffn(m, il, h)
    return swiglu(m, h, [f"blk.{il}.ffn_{p}.weight" for p in ("gate", "up", "down")])


def forward(g, tokens, act_quant=False):
    """Logits (T, n_vocab) in float64 for every position of `tokens`."""
    m = Model(g, act_quant)
    hp = m.hp
    tokens = np.asarray(tokens, dtype=np.int64)
    if tokens.size == 0:
        raise RefError("no tokens")
    if tokens.min() < 0 or tokens.max() >= hp.n_vocab:
        raise RefError(f"token id out of range [0, {hp.n_vocab})")
    positions = np.arange(tokens.size, dtype=np.float64)
    x = g.load("token_embd.weight", rows=tokens)
    for il in range(hp.n_layer):
        x = x + attention(m, il, rms_norm(x, m.vec(f"blk.{il}.attn_norm.weight"), hp.eps), positions)
        x = x + ffn(m, il, rms_norm(x, m.vec(f"blk.{il}.ffn_norm.weight"), hp.eps))
    x = rms_norm(x, m.vec("output_norm.weight"), hp.eps)
    out_name = "output.weight" if g.has("output.weight") else "token_embd.weight"  # tied embeddings
    return m.linear(x, out_name)


def parse_tokens(s):
    try:
        return [int(t) for t in s.split(",") if t.strip()]
    except ValueError:
        raise RefError(f"--tokens must be comma-separated integers, got {s!r}")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--out", required=True, help="float32 logits [positions][vocab]")
    ap.add_argument("--act-quant", action="store_true",
                    help="quantize activations to 8 bits before products with quantized weights, as llama.cpp does")
    args = ap.parse_args(argv)
    try:
        logits = forward(GGUF(args.model), parse_tokens(args.tokens), args.act_quant)
    except RefError as e:
        print(f"moex_ref: {e}", file=sys.stderr)
        return 1
    logits.astype("<f4").tofile(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
