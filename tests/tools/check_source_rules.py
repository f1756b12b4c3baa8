#!/usr/bin/env python3
"""Rules of the source tree that docs/ARCHITECTURE.md states, checked on the
files themselves (a rule no test reads is a rule nobody keeps):

  one_constructor  engines are opened by moex_engine_open (engine/open.c) only:
                   no program, benchmark or tool builds a CPU or Vulkan state,
                   or an engine over one, by hand. Tests of the states
                   themselves (tests/) may.

Usage: check_source_rules.py SOURCE_DIR. Exit 1 listing every breach."""
import os
import re
import sys

PRODUCT_DIRS = ("bench", "common", "engine", "hub", "kernels", "model", "placement", "proto", "serve", "sim",
                "tools", "worker")

STATE_CONSTRUCTORS = re.compile(
    r"\b(moex_state_create(_multi)?|moex_vk_state_create(_multi|_remote|_remote_multi)?|moex_engine_cpu|"
    r"moex_engine_vk)\s*\(")


def c_files(root):
    for top in PRODUCT_DIRS:
        for d, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if f.endswith(".c"):
                    yield os.path.join(d, f)


def strip_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)


def one_constructor(root):
    breaches = []
    for path in c_files(root):
        rel = os.path.relpath(path, root)
        if rel.startswith("engine/"):   # the engine defines the states and opens them (open.c)
            continue
        with open(path, encoding="utf-8") as f:
            text = strip_comments(f.read())
        for n, line in enumerate(text.split("\n"), 1):
            m = STATE_CONSTRUCTORS.search(line)
            if m:
                breaches.append(f"{rel}:{n}: {m.group(1)}: open the engine with moex_engine_open (engine/engine.h)")
    return breaches


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = sys.argv[1]
    breaches = one_constructor(root)
    for b in breaches:
        print(b)
    if breaches:
        return 1
    print("source rules: ok (one_constructor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
