#!/usr/bin/python3
"""Our tokenizer against llama.cpp's, id for id, on the vocab fixtures.

For each vocab (tests/data/vocab, and gpt-oss's o200k first, made by setup_peer.sh
into PEER/vocab from npm's ranks): the test texts of
the fixtures (*.inp) and N random strings (mixed scripts, digits, punctuation,
whitespace runs, newlines, emoji, contractions, special-token text, control
characters, a few invalid UTF-8 bytes), each tokenized with special-token
parsing off and on, by `moex-gguf tokenize --batch` and by llama.cpp
(tests/peer/llama_peer tokenize). Requires identical ids, identical
detokenized text, and that valid UTF-8 decodes back to itself.

    peer_tokenize.py --gguf MOEX_GGUF --vocab-dir DIR [--random 10000] [--seed 1]
                     [--peer DIR] [--write-out]

--write-out rewrites ggml-vocab-gpt-oss.gguf.out from llama.cpp's ids for
the .inp cases (the vectors tests/common/test_tokenizer.c checks without
the peer); otherwise that file is checked against llama.cpp too.
Exit: 0 all identical, 1 a difference, 77 llama.cpp peer unavailable.
"""
import argparse
import os
import random
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.dont_write_bytecode = True   # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(REPO, "tests"))
from testlib import check, finish  # noqa: E402

SKIP = 77
SEP = b"\n__ggml_vocab_test__\n"
GPT_OSS = "ggml-vocab-gpt-oss.gguf"
# (vocab, share of the random strings, whether llama.cpp's decoded text must match).
# gpt-oss gets every random string; the other fixtures a share, as a regression check.
# llama-bpe's decoded text is not compared: llama.cpp keeps clean_spaces (Hugging
# Face's clean_up_tokenization_spaces: " ?" -> "?", " 's" -> "'s", ...) for the
# llama3 pre-tokenizers in llama_detokenize, which moex_detokenize does not do.
VOCABS = [(GPT_OSS, 1.0, True), ("ggml-vocab-qwen2.gguf", 0.2, True), ("ggml-vocab-llama-bpe.gguf", 0.2, False),
          ("ggml-vocab-llama-spm.gguf", 0.2, True)]
FLAG_SPECIAL = 1


def setup_peer(peer_dir):
    env = dict(os.environ, MOEX_PEER_DIR=peer_dir)
    p = subprocess.run([os.path.join(HERE, "setup_peer.sh")], env=env, capture_output=True, text=True)
    if p.returncode == SKIP:
        print(p.stderr.strip())
        return None
    if p.returncode != 0:
        raise RuntimeError(f"setup_peer.sh failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return os.path.join(peer_dir, "bin", "llama_peer")


# ---- the texts

def fixture_texts(vocab_dir):
    """The distinct inputs of every *.inp fixture, in order."""
    seen, out = set(), []
    for name in sorted(os.listdir(vocab_dir)):
        if name.endswith(".inp"):
            for t in open(os.path.join(vocab_dir, name), "rb").read().split(SEP)[:-1]:
                if t not in seen:
                    seen.add(t)
                    out.append(t)
    return out


def chars(*ranges):
    return "".join(chr(c) for a, b in ranges for c in range(a, b + 1))


LOWER, UPPER = chars((0x61, 0x7A)), chars((0x41, 0x5A))
SCRIPTS = [
    chars((0x430, 0x44F)), chars((0x410, 0x42F)),            # Cyrillic lower / upper
    chars((0x3B1, 0x3C9)), chars((0x391, 0x3A9)),            # Greek lower / upper
    "éèêëàâäôöûüçñßøåæœÉÈÊÀÇÑØÅÆŒİıſ",                         # Latin with diacritics
    "ǅǈǋǲ", "ʰʲˆˇˠ",                                           # titlecase, modifier letters (Lt, Lm)
    "中文字符汉语日本語漢字", chars((0x3041, 0x3096)), chars((0x30A1, 0x30FA)),   # Han, kana
    chars((0xAC00, 0xAC40)), chars((0x5D0, 0x5EA)),           # Hangul, Hebrew
    chars((0x627, 0x64A)) + "\u064b\u064e\u0650",             # Arabic letters and marks
    chars((0x905, 0x939)) + "\u093e\u093f\u0940\u094d\u0902", # Devanagari letters and marks
    chars((0xE01, 0xE2E)) + "\u0e31\u0e34\u0e35\u0e48",       # Thai letters and marks
    "\u0301\u0308\u0327\u20dd",                                # combining marks alone
]
DIGITS = ["0123456789", chars((0x660, 0x669)), chars((0xFF10, 0xFF19)), "²³¹½¼¾", "ⅠⅡⅢⅫⅰ", "①②③"]
PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
UPUNCT = "«»„“”‘’—–…、。！？・¿¡§¶•€£¥©®™°±×÷∑√∞≠≤≥←→"
EMOJI = ["😀", "😁", "🦙", "🚀", "👍🏽", "👨\u200d👩\u200d👧", "🇺🇸", "❤\ufe0f", "1\ufe0f\u20e3", "✅", "🫠"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r", "\v", "\f", " \n ", "\u00a0", "\u3000", "\u2028",
          "\u0085", "\u2003", "\u200b", "\ufeff"]
CONTRACTIONS = ["'s", "'S", "'t", "'T", "'re", "'RE", "'rE", "'ve", "'Ve", "'m", "'M", "'ll", "'LL", "'lL", "'d",
                "'D", "'x", "'", "''", "’s"]
SPECIALS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>",
            "<|startoftext|>", "<|endoftext|>", "<|endofprompt|>", "<|reserved_200000|>", "<|reserved_200500|>",
            "<|reserved_201087|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|eot_id|>", "<s>", "</s>",
            "<unk>", "<|start", "<|", "|>", "<|START|>", "<|<|end|>|>", "<|start|><|start|>", "[PAD151646]"]
INVALID = [b"\xff", b"\xfe", b"\xc3", b"\xe2\x82", b"\x80", b"\xbf", b"\xed\xa0\x80", b"\xf0\x9f\x98", b"\xc0\xaf"]
CONTROLS = [chr(c) for c in list(range(1, 9)) + [0x0e, 0x1b, 0x1c, 0x1f, 0x7f]] + ["\x00"]


def word(rng):
    """A letter run in some case pattern, Latin or another script."""
    n = rng.randint(1, 12)
    kind = rng.randrange(8)
    if kind == 0:
        return "".join(rng.choice(UPPER) for _ in range(n))
    if kind == 1:
        return rng.choice(UPPER) + "".join(rng.choice(LOWER) for _ in range(n))
    if kind == 2:   # camelCase / mixed
        return "".join(rng.choice(LOWER + UPPER) for _ in range(n))
    if kind in (3, 4):
        return "".join(rng.choice(LOWER) for _ in range(n))
    script = rng.choice(SCRIPTS)
    w = "".join(rng.choice(script) for _ in range(n))
    if rng.random() < 0.4:   # mixed with ASCII letters
        w = rng.choice([w + rng.choice(UPPER), rng.choice(UPPER) + w, w + rng.choice(LOWER), w.upper()])
    return w


def piece(rng):
    """One piece of a random string: text (str) or raw bytes."""
    r = rng.random()
    if r < 0.30:
        return word(rng)
    if r < 0.40:
        d = rng.choice(DIGITS) if rng.random() < 0.4 else "0123456789"
        return "".join(rng.choice(d) for _ in range(rng.randint(1, 9)))
    if r < 0.50:
        return "".join(rng.choice(PUNCT if rng.random() < 0.7 else UPUNCT) for _ in range(rng.randint(1, 4)))
    if r < 0.65:
        s = rng.choice(SPACES)
        return s * rng.randint(1, 3) if rng.random() < 0.3 else s
    if r < 0.72:
        return rng.choice(CONTRACTIONS)
    if r < 0.79:
        return rng.choice(EMOJI)
    if r < 0.87:
        return rng.choice(SPECIALS)
    if r < 0.90:
        return rng.choice(["/", "//", "/\n", "\n/", "://", "/\r\n/"])
    if r < 0.93:
        return rng.choice(CONTROLS)
    if r < 0.95:
        return rng.choice(INVALID)
    if r < 0.97:   # long runs
        return rng.choice(["a", " ", "A", "9", "!", "é", "\n", "中"]) * rng.randint(10, 60)
    return rng.choice(["I'm", "don't", "You'RE", "it's", "Hello World", "HTTPServer", "x=1;", "e.g.", "v2.0"])


# Short strings over a few characters that meet often: case changes (ASCII and not),
# contractions, marks, digits, line ends, slashes, a special token.
DENSE = ["a", "A", "é", "É", "Ж", "ж", "中", "'", "s", "S", "t", "R", "e", "l", "L", " ", "  ", "\n", "\r", "1", "٣",
         "/", ".", "\u0301", "\u00a0", "\t", "<|start|>", "ǅ", "ʰ", "😀", "\u3000", "!", "ﬁ"]


def random_texts(n, seed):
    """n strings: a quarter dense (DENSE), the rest 1-20 pieces of every kind."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.25:
            out.append("".join(rng.choice(DENSE) for _ in range(rng.randint(1, 14))).encode())
            continue
        parts = []
        for _ in range(rng.randint(1, 20)):
            p = piece(rng)
            parts.append(p if isinstance(p, bytes) else p.encode("utf-8"))
            if rng.random() < 0.35:
                parts.append(b" ")
        out.append(b"".join(parts))
    return out


# ---- running both tokenizers

def batch_input(texts):
    """Each text twice: special-token parsing off, then on."""
    return "".join(f"{flags} {t.hex()}\n" for t in texts for flags in (0, FLAG_SPECIAL)).encode()


def run_batch(cmd, stdin, what):
    t0 = time.time()
    p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {p.returncode}): {p.stderr.decode(errors='replace')[-2000:]}")
    return p.stdout.decode().split("\n")[:-1], time.time() - t0


def is_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def compare(name, texts, ours, theirs, same_text):
    """Ids (and, when same_text, detokenized text) equal line for line; valid UTF-8 decodes back to itself."""
    bad_ids, bad_text, bad_trip, shown = 0, 0, 0, 0
    spm = "spm" in name
    for i, t in enumerate(texts):
        for k, flags in enumerate((0, FLAG_SPECIAL)):
            o_ids, o_txt = ours[2 * i + k].split("\t")
            p_ids, p_txt = theirs[2 * i + k].split("\t")
            back = bytes.fromhex(o_txt)
            # Not for SPM: it puts a space before the text at the start and after every special
            # token, and decoding drops only the first (llama.cpp's decode gives the same).
            trip_ok = not is_utf8(t) or spm or back == t
            bad_ids += o_ids != p_ids
            text_ok = o_txt == p_txt or not same_text
            bad_text += not text_ok
            bad_trip += not trip_ok
            if (o_ids != p_ids or not text_ok or not trip_ok) and shown < 8:
                shown += 1
                print(f"  {name} special={flags} text {t!r}\n    moex  {o_ids}\n    llama {p_ids}\n"
                      f"    decoded moex {back!r} llama {bytes.fromhex(p_txt)!r}")
    n = 2 * len(texts)
    check(f"{name}: {n} tokenizations, ids identical to llama.cpp ({bad_ids} differ)", bad_ids == 0)
    if same_text:
        check(f"{name}: detokenized text identical to llama.cpp ({bad_text} differ)", bad_text == 0)
    check(f"{name}: valid UTF-8 round trips ({bad_trip} do not)", bad_trip == 0)


def check_vectors(vocab_dir, texts_inp, theirs, write):
    """ggml-vocab-gpt-oss.gguf.out: llama.cpp's ids of the .inp cases (special parsing off)."""
    inp = open(os.path.join(vocab_dir, GPT_OSS + ".inp"), "rb").read().split(SEP)[:-1]
    by_text = {t: theirs[2 * i].split("\t")[0].split() for i, t in enumerate(texts_inp)}
    want = "".join("".join(" " + x for x in by_text[t]) + "\n" for t in inp)
    path = os.path.join(vocab_dir, GPT_OSS + ".out")
    if write:
        with open(path, "w") as f:
            f.write(want)
        print(f"wrote {path} ({len(inp)} cases)")
    have = open(path).read() if os.path.exists(path) else ""
    check(f"{GPT_OSS}.out holds llama.cpp's ids for the {len(inp)} cases", have == want)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", required=True, help="moex-gguf binary")
    ap.add_argument("--vocab-dir", default=os.path.join(REPO, "tests", "data", "vocab"))
    ap.add_argument("--random", type=int, default=10000, help="random strings for gpt-oss")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--peer", default=os.environ.get("MOEX_PEER_DIR", os.path.join(REPO, ".peer")))
    ap.add_argument("--write-out", action="store_true", help=f"rewrite {GPT_OSS}.out from llama.cpp")
    a = ap.parse_args(argv[1:])
    peer = setup_peer(a.peer)
    if peer is None:
        return SKIP
    fixtures = fixture_texts(a.vocab_dir)
    randoms = random_texts(a.random, a.seed)
    for name, share, same_text in VOCABS:
        path = os.path.join(a.peer, "vocab", name) if name == GPT_OSS else os.path.join(a.vocab_dir, name)
        texts = fixtures + randoms[:int(len(randoms) * share)]
        stdin = batch_input(texts)
        ours, t_ours = run_batch([a.gguf, "tokenize", path, "--batch"], stdin, "moex-gguf tokenize --batch")
        theirs, t_theirs = run_batch([peer, "tokenize", path], stdin, "llama_peer tokenize")
        print(f"{name}: {len(texts)} texts ({len(fixtures)} fixture cases), moex {t_ours:.2f} s, "
              f"llama.cpp {t_theirs:.2f} s")
        if not check(f"{name}: both answered every line", len(ours) == len(theirs) == 2 * len(texts)):
            continue
        compare(name, texts, ours, theirs, same_text)
        if name == GPT_OSS:
            check_vectors(a.vocab_dir, fixtures, theirs, a.write_out)
    finish("tokenizer comparisons")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
