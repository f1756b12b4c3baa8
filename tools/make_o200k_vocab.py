#!/usr/bin/python3
"""Writes gpt-oss's tokenizer as a vocab-only GGUF, as llama.cpp's converter would.

    make_o200k_vocab.py RANKS OUT.gguf

RANKS: the o200k_base ranks, either js-tiktoken's dist/ranks/o200k_base.js
(npm: `npm pack js-tiktoken@1.0.21`, MIT) or a tiktoken file (base64 token,
space, rank per line). No pip packages: the GGUF v3 writer is below.

What goes in (the o200k_harmony encoding of gpt-oss, as convert_hf_to_gguf.py
writes it from the model's tokenizer.json):
  - tokenizer.ggml.model "gpt2", pre "gpt-4o" (llama.cpp's name for this regex);
  - ids 0..199997: the o200k_base tokens, each byte spelled with GPT-2's
    byte-to-unicode map, token type 1 (normal);
  - ids 199998..201087: the harmony special tokens (<|startoftext|>,
    <|endoftext|>, <|return|>, <|constrain|>, <|channel|>, <|start|>, <|end|>,
    <|message|>, <|call|>, <|endofprompt|>, <|reserved_N|> for the rest),
    token type 3 (control), n_vocab 201088;
  - merges: for every multi-byte token, the two parts that byte-level BPE
    restricted to lower ranks leaves it in (the derivation llama.cpp's
    converter uses for tiktoken vocabularies), in rank order;
  - bos 199998 (<|startoftext|>), eos 200002 (<|return|>), padding 199999
    (<|endoftext|>): gpt-oss's tokenizer_config.json / config.json; no
    add_bos_token key (gpt2 default: no BOS added).
"""
import base64
import json
import os
import struct
import sys

N_BASE = 199998
N_VOCAB = 201088
HARMONY = {
    199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
    200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>",
    200018: "<|endofprompt|>",
}
BOS, EOS, PAD = 199998, 200002, 199999
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3

# GGUF value types
GGUF_U32, GGUF_I32, GGUF_STR, GGUF_ARR = 4, 5, 8, 9


# ---- reading the ranks

def read_ranks(path):
    """{token bytes: rank} from js-tiktoken's ranks module or a .tiktoken file."""
    with open(path, "rb") as f:
        data = f.read()
    ranks = {}
    if path.endswith((".js", ".cjs")):
        # `export default {...}` / `module.exports = {...}`: JSON with "bpe_ranks", whose
        # lines are "<tag> <first rank> <b64> <b64> ..." with consecutive ranks.
        text = data.decode()
        obj = json.loads(text[text.index("{"):text.rindex("}") + 1])
        for line in obj["bpe_ranks"].split("\n"):
            if not line:
                continue
            parts = line.split(" ")
            first = int(parts[1])
            for i, b64 in enumerate(parts[2:]):
                ranks[base64.b64decode(b64)] = first + i
    else:
        for line in data.splitlines():
            if line.strip():
                b64, rank = line.split()
                ranks[base64.b64decode(b64)] = int(rank)
    if sorted(ranks.values()) != list(range(N_BASE)):
        sys.exit(f"{path}: expected ranks 0..{N_BASE - 1}, got {len(ranks)} tokens")
    return ranks


# ---- tiktoken ranks -> byte-level BPE

def byte_to_unicode():
    """GPT-2's map: printable bytes stand for themselves, the others for U+0100 onwards."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def bpe_parts(ranks, token, max_rank):
    """token's bytes merged by BPE, lowest rank first, using only ranks below max_rank."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, best_rank = -1, max_rank
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1])
            if r is not None and r < best_rank:
                best, best_rank = i, r
        if best < 0:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return parts


def build_vocab(ranks):
    """(tokens, token types, merges) as GGUF strings / ints."""
    enc = byte_to_unicode()
    spell = lambda b: "".join(enc[x] for x in b)
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    tokens = [spell(tok) for tok, _ in by_rank]
    types = [TOKEN_NORMAL] * N_BASE
    merges = []
    for tok, rank in by_rank:
        if len(tok) == 1:
            continue
        parts = bpe_parts(ranks, tok, rank)
        if len(parts) != 2:
            sys.exit(f"token {rank} {tok!r} does not split into two lower-ranked parts: {parts!r}")
        merges.append(spell(parts[0]) + " " + spell(parts[1]))
    for i in range(N_BASE, N_VOCAB):
        tokens.append(HARMONY.get(i, f"<|reserved_{i}|>"))
        types.append(TOKEN_CONTROL)
    return tokens, types, merges


# ---- a minimal GGUF v3 writer (metadata only, no tensors)

def _str(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def kv_str(key, v):
    return _str(key) + struct.pack("<I", GGUF_STR) + _str(v)


def kv_u32(key, v):
    return _str(key) + struct.pack("<II", GGUF_U32, v)


def kv_str_array(key, items):
    return _str(key) + struct.pack("<IIQ", GGUF_ARR, GGUF_STR, len(items)) + b"".join(_str(s) for s in items)


def kv_i32_array(key, items):
    return _str(key) + struct.pack("<IIQ", GGUF_ARR, GGUF_I32, len(items)) + struct.pack(f"<{len(items)}i", *items)


def write_gguf(path, kvs):
    # With no tensors there is no data section, so no padding (as llama.cpp's writer).
    blob = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(blob)
    os.replace(tmp, path)
    return len(blob)


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    ranks = read_ranks(argv[1])
    tokens, types, merges = build_vocab(ranks)
    kvs = [
        kv_str("general.architecture", "gpt-oss"),
        kv_str("general.name", "gpt-oss vocab (o200k_harmony)"),
        kv_str("tokenizer.ggml.model", "gpt2"),
        kv_str("tokenizer.ggml.pre", "gpt-4o"),
        kv_str_array("tokenizer.ggml.tokens", tokens),
        kv_i32_array("tokenizer.ggml.token_type", types),
        kv_str_array("tokenizer.ggml.merges", merges),
        kv_u32("tokenizer.ggml.bos_token_id", BOS),
        kv_u32("tokenizer.ggml.eos_token_id", EOS),
        kv_u32("tokenizer.ggml.padding_token_id", PAD),
    ]
    size = write_gguf(argv[2], kvs)
    print(f"{argv[2]}: {len(tokens)} tokens, {len(merges)} merges, {size} bytes")


if __name__ == "__main__":
    main(sys.argv)
