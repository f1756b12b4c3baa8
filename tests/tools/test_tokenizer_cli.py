#!/usr/bin/python3
"""moex-gguf tokenize/detokenize against llama.cpp's vectors: text through
stdin (exact bytes: newlines, tabs, trailing spaces) and as an argument,
ids back to text, special tokens, and the exit codes of bad input/usage.
usage: test_tokenizer_cli.py MOEX_GGUF FIXTURES_VOCAB_DIR"""
import os
import subprocess
import sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import check, failures  # noqa: E402

TOOL, VOCAB_DIR = sys.argv[1], sys.argv[2]
SEP = b"\n__ggml_vocab_test__\n"


def load(name):
    inp = open(os.path.join(VOCAB_DIR, name + ".inp"), "rb").read()
    out = open(os.path.join(VOCAB_DIR, name + ".out"), "rb").read().decode().split("\n")
    cases = inp.split(SEP)
    assert cases[-1] == b"", "inputs end with the separator"
    cases = cases[:-1]
    return cases, [line.split() for line in out[:len(cases)]]


def run(args, stdin=b""):
    p = subprocess.run([TOOL] + args, input=stdin, capture_output=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def expect_ids(vocab, case, want, label, args=None, stdin=None):
    rc, out, err = run(["tokenize", vocab] + (args or []), stdin if stdin is not None else case)
    got = out.decode().rstrip("\n").split()
    check("%s: rc=%d want %s got %s %s" % (label, rc, want, got, err.decode()[:200]),
          rc == 0 and got == want and out.endswith(b"\n") and out.count(b"\n") == 1)


qwen = os.path.join(VOCAB_DIR, "ggml-vocab-qwen2.gguf")
cases, outs = load("ggml-vocab-qwen2.gguf")
# Whitespace-heavy inputs through stdin must arrive byte for byte.
for i, case in enumerate(cases):
    if case in (b"\n\n\n", b"   ", b"\t\n") or i == len(cases) - 1:
        expect_ids(qwen, case, outs[i], "qwen2 case %d via stdin" % i)
# TEXT as an argument.
i = cases.index(b"Hello world")
expect_ids(qwen, None, outs[i], "qwen2 'Hello world' as argument", args=["Hello world"], stdin=b"")
for name in ("ggml-vocab-llama-bpe.gguf", "ggml-vocab-llama-spm.gguf"):
    c, o = load(name)
    expect_ids(os.path.join(VOCAB_DIR, name), c[-1], o[-1], name + " last case via stdin")

# --batch: "FLAGS HEX" lines -> "IDS<tab>HEX of the decoded text" lines, exact bytes both ways.
batch = b"0 " + b"Hello world".hex().encode() + b"\n1 " + b"<|im_end|>\n".hex().encode() + b"\n0\n"
rc, out, err = run(["tokenize", qwen, "--batch"], batch)
want = ("9707 1879\t%s\n151645 198\t%s\n\t\n" % (b"Hello world".hex(), b"<|im_end|>\n".hex())).encode()
check("--batch: %r %r" % (out, err[:200]), rc == 0 and out == want)
rc, out, err = run(["tokenize", qwen, "--batch"], b"0 4x\n")
check("--batch rejects bad hex: rc=%d %r" % (rc, err[:200]), rc == 1 and b"FLAGS HEX" in err)

# detokenize: comma- and space-separated ids from stdin give the exact bytes back.
long_case, long_ids = cases[-1], outs[-1]
rc, out, err = run(["detokenize", qwen], ",".join(long_ids[:10]).encode() + b" " + " ".join(long_ids[10:]).encode())
check("detokenize round trip: rc=%d %r" % (rc, err[:200]), rc == 0 and out == long_case)
rc, out, err = run(["detokenize", qwen, "9707,1879"])
check("detokenize ids as argument: %r" % out, rc == 0 and out == b"Hello world")

# Special tokens.
rc, out, _ = run(["tokenize", qwen, "<|im_end|>", "--special"])
check("--special parses <|im_end|>: %r" % out, rc == 0 and out == b"151645\n")
rc, out, _ = run(["tokenize", qwen, "<|im_end|>"])
check("without --special <|im_end|> is text: %r" % out, rc == 0 and b"151645" not in out.split())
rc, out, _ = run(["detokenize", qwen, "151645", "--special"])
check("detokenize --special renders control tokens: %r" % out, rc == 0 and out == b"<|im_end|>")
rc, out, _ = run(["detokenize", qwen, "151645"])
check("detokenize hides control tokens by default: %r" % out, rc == 0 and out == b"")
spm = os.path.join(VOCAB_DIR, "ggml-vocab-llama-spm.gguf")
rc, out, _ = run(["tokenize", spm, "Hello", "--add-bos"])
check("--add-bos on SPM: %r" % out, rc == 0 and out.split()[0] == b"1")

# Bad input: exit 1 with a message; bad usage: exit 2.
for args, stdin, want_rc, label in [
        (["detokenize", qwen, "99999999"], b"", 1, "out-of-range id"),
        (["detokenize", qwen, "-1"], b"", 1, "negative id"),
        (["detokenize", qwen], b"12 abc", 1, "non-numeric id"),
        (["tokenize", "/nonexistent.gguf", "x"], b"", 1, "missing vocab file"),
        (["tokenize"], b"", 2, "no arguments"),
        (["tokenize", qwen, "a", "b"], b"", 2, "extra argument"),
        (["detokenize", qwen, "--bogus"], b"", 2, "unknown option")]:
    rc, out, err = run(args, stdin)
    check("%s: rc=%d (want %d), stderr %r" % (label, rc, want_rc, err[:200]), rc == want_rc and err.strip() != b"")

if failures:
    print("%d CLI check(s) failed" % len(failures), file=sys.stderr)
    sys.exit(1)
print("all tokenizer CLI checks passed")
