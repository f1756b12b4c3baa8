#!/usr/bin/python3
"""Exports a train/train.py run to a GGUF file that MoEx and llama.cpp load.

    export_gguf.py RUN_DIR OUT.gguf [--type f32|f16] [--vocab VOCAB.gguf] [--name NAME]

The file follows `moex-gguf gen --arch qwen3moe` (tools/tool_gen_plan.c):
the same metadata keys, tensor names and order, merged expert tensors
(ffn_gate_exps / ffn_up_exps / ffn_down_exps, [n_embd, n_ff_exp, n_expert]
and [n_ff_exp, n_embd, n_expert]), norms and router in f32, the other
weights in --type, no output.weight (the output is tied to token_embd), and
every tokenizer.* key copied byte for byte from the vocab GGUF the corpus was
tokenized with. Quantized files come from it through `moex-gguf quantize`.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
DEFAULT_VOCAB = os.path.join(REPO, "tests", "data", "vocab", "ggml-vocab-llama-spm.gguf")
ALIGN = 32
GGUF_U32, GGUF_F32, GGUF_STR, GGUF_ARR = 4, 6, 8, 9
FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}   # GGUF value type -> bytes
TYPE_ID = {"f32": (0, "<f4"), "f16": (1, "<f2")}
FILE_TYPE = {"f32": 0, "f16": 1}   # llama_ftype ALL_F32 / MOSTLY_F16


# ---- reading the vocab file's metadata, keeping each key/value's raw bytes

def _skip_value(buf, off, vtype):
    if vtype in FIXED:
        return off + FIXED[vtype]
    if vtype == GGUF_STR:
        (n,) = struct.unpack_from("<Q", buf, off)
        return off + 8 + n
    if vtype == GGUF_ARR:
        et, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        if et in FIXED:
            return off + n * FIXED[et]
        for _ in range(n):
            off = _skip_value(buf, off, et)
        return off
    raise ValueError(f"unknown GGUF value type {vtype}")


def raw_kvs(path):
    """{key: raw bytes of the whole key/value record} of a GGUF file."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:4] != b"GGUF":
        sys.exit(f"export_gguf.py: {path} is not a GGUF file")
    _, _, n_kv = struct.unpack_from("<IQQ", buf, 4)
    off, out = 24, {}
    for _ in range(n_kv):
        start = off
        (klen,) = struct.unpack_from("<Q", buf, off)
        key = buf[off + 8:off + 8 + klen].decode()
        (vtype,) = struct.unpack_from("<I", buf, off + 8 + klen)
        off = _skip_value(buf, off + 12 + klen, vtype)
        out[key] = buf[start:off]
    return out


# ---- writing

def _str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return _str(key) + struct.pack("<II", GGUF_U32, int(v))


def kv_f32(key, v):
    return _str(key) + struct.pack("<If", GGUF_F32, float(v))


def kv_str(key, v):
    return _str(key) + struct.pack("<I", GGUF_STR) + _str(v)


def metadata(cfg, wtype, name, n_vocab):
    a = "qwen3moe"
    return [kv_str("general.architecture", a), kv_str("general.name", name),
            kv_u32("general.file_type", FILE_TYPE[wtype]), kv_u32("general.quantization_version", 2),
            kv_u32(f"{a}.block_count", cfg["n_layer"]), kv_u32(f"{a}.context_length", cfg["n_ctx"]),
            kv_u32(f"{a}.embedding_length", cfg["n_embd"]), kv_u32(f"{a}.feed_forward_length", cfg["n_ff_exp"]),
            kv_u32(f"{a}.attention.head_count", cfg["n_head"]),
            kv_u32(f"{a}.attention.head_count_kv", cfg["n_head_kv"]),
            kv_u32(f"{a}.attention.key_length", cfg["head_dim"]),
            kv_u32(f"{a}.attention.value_length", cfg["head_dim"]),
            kv_u32(f"{a}.rope.dimension_count", cfg["head_dim"]), kv_f32(f"{a}.rope.freq_base", cfg["rope_base"]),
            kv_f32(f"{a}.attention.layer_norm_rms_epsilon", cfg["rms_eps"]), kv_u32(f"{a}.vocab_size", n_vocab),
            kv_u32(f"{a}.expert_count", cfg["n_expert"]), kv_u32(f"{a}.expert_used_count", cfg["n_expert_used"]),
            kv_u32(f"{a}.expert_feed_forward_length", cfg["n_ff_exp"])]


def tensors(state, cfg):
    """(GGUF name, numpy array in numpy order, is a norm/router) in gen's order."""
    out = [("token_embd.weight", state["tok_embd.weight"], False)]
    for il in range(cfg["n_layer"]):
        p, b = f"blocks.{il}.", f"blk.{il}."
        out += [(b + "attn_norm.weight", state[p + "attn_norm.weight"], True),
                (b + "attn_q.weight", state[p + "attn.wq.weight"], False),
                (b + "attn_k.weight", state[p + "attn.wk.weight"], False),
                (b + "attn_v.weight", state[p + "attn.wv.weight"], False),
                (b + "attn_output.weight", state[p + "attn.wo.weight"], False),
                (b + "attn_q_norm.weight", state[p + "attn.q_norm.weight"], True),
                (b + "attn_k_norm.weight", state[p + "attn.k_norm.weight"], True),
                (b + "ffn_norm.weight", state[p + "ffn_norm.weight"], True),
                (b + "ffn_gate_inp.weight", state[p + "moe.router.weight"], True),
                (b + "ffn_gate_exps.weight", state[p + "moe.gate"], False),
                (b + "ffn_up_exps.weight", state[p + "moe.up"], False),
                (b + "ffn_down_exps.weight", state[p + "moe.down"], False)]
    out.append(("output_norm.weight", state["output_norm.weight"], True))
    return out


def write_gguf(path, kvs, items, wtype):
    infos, blobs, offset = [], [], 0
    for name, arr, keep_f32 in items:
        tid, dt = TYPE_ID["f32" if keep_f32 else wtype]
        blob = np.ascontiguousarray(arr, dtype=dt).tobytes()
        ne = list(reversed(arr.shape))
        infos.append(_str(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
                     + struct.pack("<IQ", tid, offset))
        blob += bytes(-len(blob) % ALIGN)
        blobs.append(blob)
        offset += len(blob)
    head = b"GGUF" + struct.pack("<IQQ", 3, len(items), len(kvs)) + b"".join(kvs) + b"".join(infos)
    head += bytes(-len(head) % ALIGN)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(head)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)
    return len(head) + offset


def load_run(run_dir):
    import torch   # only here: the rest of the file needs numpy alone
    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    state = {}
    for shard in run["shards"]:
        for k, v in torch.load(os.path.join(run_dir, shard), map_location="cpu").items():
            state[k] = v.float().numpy()
    return run, state


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("out")
    ap.add_argument("--type", choices=sorted(TYPE_ID), default="f32")
    ap.add_argument("--vocab", default=DEFAULT_VOCAB)
    ap.add_argument("--name", default=None)
    a = ap.parse_args(argv)
    run, state = load_run(a.run_dir)
    cfg = run["model"]
    vocab = raw_kvs(a.vocab)
    tok_keys = [k for k in vocab if k.startswith("tokenizer.")]
    if "tokenizer.ggml.tokens" not in vocab:
        sys.exit(f"export_gguf.py: {a.vocab} has no tokenizer.ggml.tokens")
    n_vocab = state["tok_embd.weight"].shape[0]
    name = a.name or f"moex brown-moe {run['preset']} ({run['n_params'] / 1e6:.1f} M params, seed {run['seed']})"
    kvs = metadata(cfg, a.type, name, n_vocab) + [vocab[k] for k in tok_keys]
    size = write_gguf(a.out, kvs, tensors(state, cfg), a.type)
    print(f"export_gguf.py: wrote {a.out} ({size / 1e6:.1f} MB, {a.type}, {len(tok_keys)} tokenizer keys)")


if __name__ == "__main__":
    main(sys.argv[1:])
