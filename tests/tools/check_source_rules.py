#!/usr/bin/env python3
"""Rules of the source tree that docs/ARCHITECTURE.md states, checked on the
files themselves (a rule no test reads is a rule nobody keeps):

  one_constructor  engines are opened by moex_engine_open (engine/open.c) only:
                   no program, benchmark or tool builds a CPU or Vulkan state,
                   or an engine over one, by hand. Tests of the states
                   themselves (tests/) may.

  arrows_down      a module includes only its own headers and those of the
                   modules below it (docs/ARCHITECTURE.md's graph): serve/ sits
                   on hub/, hub/ on engine/, and nothing includes upwards.

  one_definition   the protocol's numbers the browser worker uses (message types,
                   states, ERROR codes, session timing, struct offsets) are
                   defined once, in C; web/'s scripts read them from the
                   generated moex_constants.js (web/gen_constants.c) and spell
                   none of them. The block layouts' sizes and field offsets are
                   defined once, in common/types.h: the GLSL and WGSL kernels
                   read them as Q6_K_BYTES, Q6_K_D, ... (blocks.glsl and
                   MOEX.WGSL_BLOCKS, generated from common/block_views.h).

  no_hidden_knobs  the programs read only the environment variables that
                   docs/ARCHITECTURE.md's "Settings" table lists (the log level,
                   cache paths); every choice else is a flag or an option
                   (--vk-tune, --simd, ...), and every --vk-tune key is in that
                   table too. Benchmarks (bench/) may read more.

  no_test_hooks    the hooks for tests (kernels/kernels_testing.h,
                   kernels/vk/vk_testing.h) are included by their own module
                   and by tests and benchmarks only, not by programs.

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


# What each module may include besides itself (docs/ARCHITECTURE.md, "The dependency graph").
BELOW = {
    "common": set(),
    "kernels": {"common"},
    "proto": {"common"},
    "placement": {"common"},
    "model": {"kernels", "common"},
    "engine": {"model", "kernels", "common"},
    "worker": {"model", "kernels", "proto", "common"},
    "hub": {"engine", "model", "kernels", "proto", "placement", "common"},
    "serve": {"hub", "engine", "model", "kernels", "proto", "placement", "common"},
    "sim": {"placement", "common"},
    "tools": {"model", "kernels", "common"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')


def arrows_down(root):
    breaches = []
    for module, allowed in BELOW.items():
        for d, _, files in os.walk(os.path.join(root, module)):
            for f in files:
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8") as fh:
                    for n, line in enumerate(fh, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1) != module and m.group(1) in BELOW and m.group(1) not in allowed:
                            breaches.append(f"{rel}:{n}: {module}/ includes {m.group(1)}/, which is not below it")
    return breaches


# What a hand copy of a C number looks like in a script: an object of them
# (MSG/ERR/STATE tables, struct offsets) or a timing constant.
JS_COPIES = [
    (re.compile(r"\bconst\s+MOEX\s*="), "a MOEX table: read the generated moex_constants.js"),
    (re.compile(r"\b(DISPATCH|HEARTBEAT|MODEL_MISMATCH|STARTING|n_tokens)\s*:\s*\d"), "a protocol number spelled out"),
    (re.compile(r"\b\w*(HEARTBEAT|SILENCE|BACKOFF)\w*\s*=\s*[\d.]"), "session timing spelled out (MOEX.SESSION)"),
    (re.compile(r"\bMSG_FIELDS\s*="), "moex_wasm_msg's offsets spelled out (MOEX.MSG_FIELDS)"),
]


# A block's size as a multiplier, or a K-quant field's offset, spelled in a kernel.
SHADER_BLOCK_NUMBERS = re.compile(r"\*\s*(18|20|22|24|34|144|176|210)u\b|\+\s*(192|208)u\b")


def shader_files(root):
    for sub, ext in (("kernels/vk/shaders", ".comp"), ("web/wgsl", ".wgsl")):
        d = os.path.join(root, sub)
        if os.path.isdir(d):
            for f in sorted(os.listdir(d)):
                if f.endswith(ext):
                    yield os.path.join(d, f)


def one_definition(root):
    breaches = []
    for path in shader_files(root):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if SHADER_BLOCK_NUMBERS.search(line.split("//")[0]):
                    breaches.append(f"{rel}:{n}: a block layout's size or offset spelled out (use Q6_K_BYTES, ...)")
    for d, _, files in os.walk(os.path.join(root, "web")):
        if "third_party" in d or "node_modules" in d:
            continue
        for f in files:
            if not f.endswith(".js"):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, root)
            with open(path, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    for rx, why in JS_COPIES:
                        if rx.search(line):
                            breaches.append(f"{rel}:{n}: {why}")
    return breaches


GETENV = re.compile(r'getenv\("([A-Za-z_0-9]+)"\)')


def settings_section(root):
    with open(os.path.join(root, "docs", "ARCHITECTURE.md"), encoding="utf-8") as fh:
        text = fh.read()
    start = text.find("## Settings")
    if start < 0:
        return ""
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def no_hidden_knobs(root):
    table = settings_section(root)
    if not table:
        return ["docs/ARCHITECTURE.md: no \"## Settings\" section"]
    breaches = []
    for path in c_files(root):
        rel = os.path.relpath(path, root)
        if rel.startswith("bench" + os.sep):
            continue
        with open(path, encoding="utf-8") as fh:
            code = strip_comments(fh.read())
        for name in GETENV.findall(code):
            if f"`{name}`" not in table:
                breaches.append(f"{rel}: reads ${name}, which docs/ARCHITECTURE.md's Settings table does not list")
    with open(os.path.join(root, "kernels", "vk", "vk_tune.c"), encoding="utf-8") as fh:
        for key in re.findall(r'\] = \{"(\w+)", ', fh.read()):
            if f"`{key}`" not in table:
                breaches.append(f"kernels/vk/vk_tune.c: --vk-tune {key} is missing from the Settings table")
    return breaches


TESTING_HEADER = re.compile(r'#include "kernels/(vk/)?\w*_?testing\.h"')


def no_test_hooks(root):
    breaches = []
    for path in c_files(root):
        rel = os.path.relpath(path, root)
        if rel.startswith(("bench" + os.sep, "kernels" + os.sep)):
            continue
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if TESTING_HEADER.search(line):
                    breaches.append(f"{rel}:{n}: includes a testing header (its hooks are for tests)")
    return breaches


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    root = sys.argv[1]
    breaches = one_constructor(root) + arrows_down(root) + one_definition(root) + no_hidden_knobs(root) + no_test_hooks(root)
    for b in breaches:
        print(b)
    if breaches:
        return 1
    print("source rules: ok (one_constructor, arrows_down, one_definition, no_hidden_knobs, no_test_hooks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
