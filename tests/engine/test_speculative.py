#!/usr/bin/python3
"""Speculative decoding in the CLI users run (moex-hub --local): greedy tokens
with --lookup and with --draft-model equal the tokens without, on the CPU
backend and (where a Vulkan device is) the Vulkan one and its CPU tier (--cpu-moe), including on the
random-weight model whose logits sit close to ties (any difference in a
verify row's bits shows there). The draft model is the same random model in
another weight type, so its drafts are partly right: verifies accept some of
their drafts and reject the rest (rollback over rejected rows). On the shipped
model, a prompt whose answer repeats it has prompt lookup accepting drafts.
With temperature, a run with a sampling draft model generates its tokens.
Bad flags get clear errors.

usage: test_speculative.py BIN_DIR VOCAB_DIR WORK_DIR SHIPPED_MODEL [--vulkan]
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from testlib import check, finish  # noqa: E402

BIN, VOCAB, WORK, SHIPPED = sys.argv[1:5]
VULKAN = "--vulkan" in sys.argv[5:]
HUB = os.path.join(BIN, "moex-hub")
os.makedirs(WORK, exist_ok=True)


def gen(wtype, seed=5, vocab="ggml-vocab-llama-spm"):
    out = os.path.join(WORK, f"moe_{wtype}_{seed}_{vocab}.gguf")
    if not os.path.exists(out):
        subprocess.run([os.path.join(BIN, "moex-gguf"), "gen", "--arch", "qwen3moe", "--preset", "test", "--vocab",
                        os.path.join(VOCAB, vocab + ".gguf"), "--type", wtype, "--seed", str(seed), "--quiet",
                        "-o", out], check=True, timeout=120)
    return out


def run(model, args, backend="cpu", prompt=("--prompt-tokens", "1,100,200,300"), n=48):
    p = subprocess.run([HUB, "--local", "--backend", backend, "-m", model, *prompt, "-n", str(n), "--temp", "0",
                        "--ignore-eos", "--print-tokens", "-t", "2", *args], capture_output=True, text=True,
                       timeout=300)
    return p.returncode, p.stdout.split(), p.stderr


def spec_stats(err):
    """(verifies, drafted, accepted, histogram {accepted: verifies}) from the stats line, or None."""
    m = re.search(r"speculative: (\d+) verifies, (\d+) drafted, (\d+) accepted .*accepted per verify:([ \d:]*)\|", err)
    if not m:
        return None
    hist = {int(a): int(b) for a, b in re.findall(r"(\d+):(\d+)", m.group(4))}
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), hist


target, twin = gen("q8_0"), gen("q4_0")
backends = ["cpu"] + (["vulkan"] if VULKAN else [])
for be in backends:
    rc, ref, err = run(target, [], be)
    check(f"{be}: the plain run", rc == 0 and len(ref) == 48, err[-800:])
    rc, toks, err = run(target, ["--draft-model", twin, "--draft-max", "4", "--draft-min", "2"], be)
    st = spec_stats(err)
    check(f"{be}: --draft-model (the q4_0 twin): 48 greedy tokens equal the plain run's", rc == 0 and toks == ref,
          f"rc={rc} got={toks[:8]} want={ref[:8]} {err[-800:]}")
    check(f"{be}:   verifies accepted some drafts and rejected others", st is not None and 0 < st[2] < st[1] and
          any(0 < a < 4 for a in st[3]), f"{st}")
    rc, toks, err = run(target, ["--lookup", "--draft-model", twin], be, n=40)
    check(f"{be}: --lookup with --draft-model behind it: the same tokens", rc == 0 and toks == ref[:40],
          f"rc={rc} {err[-600:]}")

    # the shipped model, a prompt whose continuation repeats it: prompt lookup drafts and is accepted
    text = ("The committee said the city would build a new school next year. "
            "The committee said the city would build")
    rc, ref, err = run(SHIPPED, [], be, prompt=("-p", text), n=64)
    rc2, toks, err2 = run(SHIPPED, ["--lookup", "--draft-min", "4"], be, prompt=("-p", text), n=64)
    st = spec_stats(err2)
    check(f"{be}: shipped model, --lookup: 64 greedy tokens equal the plain run's", rc == 0 and rc2 == 0 and
          toks == ref, f"got={toks[:8]} want={ref[:8]} {err2[-600:]}")
    check(f"{be}:   prompt lookup accepted drafts (more than one a verify on average)",
          st is not None and st[0] > 0 and st[2] > st[0], f"{st}")

# the CPU tier (--cpu-moe: the experts on this CPU beside the GPU): verifies of few rows compute their experts here
if VULKAN:
    rc, ref, err = run(target, ["--cpu-moe"], "vulkan")
    rc2, toks, err2 = run(target, ["--cpu-moe", "--draft-model", twin, "--draft-max", "4", "--draft-min", "2"], "vulkan")
    st = spec_stats(err2)
    check("vulkan --cpu-moe with --draft-model: the tokens without it", rc == 0 and rc2 == 0 and toks == ref and
          st is not None and st[0] > 0, f"{st} got={toks[:8]} want={ref[:8]} {err2[-400:]}")

# sampling: a sampling draft model; the rule itself is test_speculate's (chi-square)
p = subprocess.run([HUB, "--local", "-m", target, "--prompt-tokens", "1,5", "-n", "32", "--temp", "0.8", "--seed", "3",
                    "--ignore-eos", "--print-tokens", "-t", "2", "--draft-model", twin], capture_output=True,
                   text=True, timeout=300)
st = spec_stats(p.stderr)
check("--temp 0.8 with a draft model: 32 tokens, drafts checked", p.returncode == 0 and len(p.stdout.split()) == 32
      and st is not None and st[0] > 0, f"{st} {p.stderr[-600:]}")

# bad flags
other = gen("q8_0", 5, "ggml-vocab-qwen2")
rc, _, err = run(target, ["--draft-model", other])
check("a draft model with another vocabulary is refused, saying why", rc != 0 and "another vocabulary" in err,
      err[-300:])
rc, _, err = run(target, ["--draft-max", "0", "--lookup"])
check("--draft-max 0 is refused", rc != 0 and "--draft-max" in err, err[-300:])
rc, _, err = run(target, ["--lookup", "--dump-logits", os.path.join(WORK, "l.bin")])
check("--lookup with --dump-logits is refused", rc != 0 and "--dump-logits" in err, err[-300:])
rc, _, err = run(target, ["--draft-model", os.path.join(WORK, "missing.gguf")])
check("a missing draft model is an error naming it", rc != 0 and "missing.gguf" in err, err[-300:])
finish()
