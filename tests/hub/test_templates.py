#!/usr/bin/env python3
"""Chat templates: serve/jinja.c against Python's jinja2, byte for byte.

  test_templates.py JINJA_RENDER TEMPLATES_DIR [--random N] [--only NAME]

Renders every *.jinja under TEMPLATES_DIR (llama.cpp's models/templates,
extracted by tests/peer/setup_peer.sh) with a fixed set of conversations,
once with jinja2 configured as Hugging Face transformers renders chat
templates and once with JINJA_RENDER (tests/hub/jinja_render.c, the C
renderer), and compares the bytes. A conversation the template refuses
(raise_exception, an error) must fail in both, with the same message.
Then: the outputs tests/hub/test_jinja.c's table claims are checked against
jinja2, and random expressions and random templates (whitespace control,
blocks, scoping) are rendered both ways (--random N each, 300 by default;
MOEX_RANDOM_SEED picks another seed than 1234).

Prints a line per template; exits 1 on any disagreement that is not in
KNOWN (below, and in docs/API.md, "Chat templates"), 77 (skip) when the
templates are missing unless MOEX_REQUIRE_PEER=1.
"""
import copy
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

try:
    import jinja2
    import jinja2.ext
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    if os.environ.get("MOEX_REQUIRE_PEER") == "1":
        print("test_templates: python3-jinja2 is not installed (setup.sh installs it); MOEX_REQUIRE_PEER=1")
        sys.exit(1)
    print("test_templates: python3-jinja2 is not installed (setup.sh installs it); skipping")
    sys.exit(77)

NOW = 1700000000  # 2023-11-14 22:13:20 UTC: what strftime_now formats in both renderers

# Templates (file stem) that cannot match, with the reason. Keep in sync with
# docs/API.md, "Chat templates".
KNOWN = {}


# ---- the reference: jinja2 as transformers configures it ----

class GenerationTag(jinja2.ext.Extension):
    """transformers' {% generation %} ... {% endgeneration %}: marks the
    assistant's tokens for training masks; renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers' override: json.dumps without jinja2's HTML escaping
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(NOW, timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def py_compile(env, source):
    """The compiled template, or ("ERR", message) when jinja2 refuses it."""
    try:
        return env.from_string(source)
    except Exception as e:
        return ("ERR", str(e))


def py_render(template, ctx):
    """("OK", text) or ("ERR", message)."""
    if isinstance(template, tuple):
        return template
    try:
        return "OK", template.render(**ctx)
    except Exception as e:  # the template's own raise_exception, or a runtime error
        return "ERR", str(e)


# ---- the conversations ----

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "City name, e.g. \"Paris\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7, "default": 1},
            "threshold": {"type": "number", "default": 0.5}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "safe": {"type": "boolean"}},
            "required": ["query"]}}},
]

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
BASE = {"bos_token": "<s>", "eos_token": "</s>"}


def conv(name, messages, **extra):
    ctx = dict(BASE)
    ctx.update({"messages": messages, "tools": None, "add_generation_prompt": True})
    ctx.update(extra)
    return name, ctx


CONVERSATIONS = [
    conv("system_user", [SYSTEM, {"role": "user", "content": "Hello!"}]),
    conv("user_only", [{"role": "user", "content": "What is 2+2?"}]),
    conv("multi_turn", [
        SYSTEM,
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am an assistant."},
        {"role": "user", "content": "Tell me a joke."}]),
    conv("multi_turn_no_prompt", [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"}], add_generation_prompt=False),
    conv("tools", [
        SYSTEM,
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temperature\": 21.5}"},
        {"role": "user", "content": "Thanks! And in Tokyo?"}], tools=TOOLS),
    conv("tools_no_system", [
        {"role": "user", "content": "Search for llamas."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_2", "type": "function",
             "function": {"name": "search", "arguments": {"query": "llamas", "tags": ["animals"], "safe": True}}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "Llamas are camelids."}],
        tools=TOOLS, add_generation_prompt=True),
    # arguments as a JSON string and a 9-character id: what Mistral's and DeepSeek-R1-Distill's templates want
    conv("tools_string_args", [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "abcDEF123", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"location\": \"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "name": "get_weather", "content": "-3 C"}],
        tools=TOOLS),
    conv("thinking_on", [
        {"role": "user", "content": "Solve 12*12."},
        {"role": "assistant", "content": "144", "reasoning_content": "12*12 = 144."},
        {"role": "user", "content": "And 13*13?"}], enable_thinking=True),
    conv("thinking_off", [
        {"role": "user", "content": "Solve 12*12."},
        {"role": "assistant", "content": "144", "reasoning_content": "12*12 = 144."},
        {"role": "user", "content": "And 13*13?"}], enable_thinking=False),
    conv("unicode", [
        {"role": "system", "content": "Réponds en français. 日本語も OK 🙂"},
        {"role": "user", "content": "Say \"hi\" and 'bye'\nthen a tab:\there\\n {{ not a tag }} {% raw %}"},
        {"role": "assistant", "content": "«hi» — 'bye' 😀\n\n中文"},
        {"role": "user", "content": "Again."}], add_generation_prompt=True),
]
# no tools key at all (undefined, not None), as a server may pass a plain chat
_no_tools = dict(BASE, messages=[SYSTEM, {"role": "user", "content": "Hello again!"}], add_generation_prompt=True)
CONVERSATIONS.append(("no_tools_key", _no_tools))
# a long chat: 120 turns (quadratic templates, memory)
CONVERSATIONS.append(conv("long_chat", [SYSTEM] + [
    {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "words " * (i % 17)}
    for i in range(119)]))
# OpenAI content parts instead of a string
CONVERSATIONS.append(conv("content_parts", [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}]}]))


# ---- the C side ----

def c_render_all(binary, template_path, ctx_paths):
    """[(status, text)] per context, or a parse failure for all of them."""
    proc = subprocess.run([binary, "--now", str(NOW), "--multi", template_path] + ctx_paths,
                          capture_output=True, timeout=60)
    if proc.returncode == 2:
        msg = proc.stderr.decode("utf-8", "replace").strip()
        return [("ERR", msg)] * len(ctx_paths)
    if proc.returncode != 0:
        raise RuntimeError(f"{binary} failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}")
    out, pos, results = proc.stdout, 0, []
    for _ in ctx_paths:
        nl = out.index(b"\n", pos)
        status, n = out[pos:nl].decode().split()
        n = int(n)
        body = out[nl + 1:nl + 1 + n]
        pos = nl + 1 + n + 1
        results.append((status, body.decode("utf-8", "surrogateescape")))
    return results


LINE_PREFIX = re.compile(r"^line \d+: ")


def agree(py, c):
    if py[0] == "OK" or c[0] == "OK":
        return py == c
    return LINE_PREFIX.sub("", c[1]) == py[1]


def first_diff(a, b):
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return f"at char {i}: python {a[max(0, i - 30):i + 40]!r} vs C {b[max(0, i - 30):i + 40]!r}"


def check_templates(binary, tdir, workdir, only):
    env = make_env()
    ctx_paths = []
    for name, ctx in CONVERSATIONS:
        path = os.path.join(workdir, name + ".json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(ctx, f, ensure_ascii=False)
        ctx_paths.append(path)
    templates = sorted(p for p in os.listdir(tdir) if p.endswith(".jinja"))
    if only:
        templates = [t for t in templates if only in t]

    def one(tname):
        path = os.path.join(tdir, tname)
        with open(path, encoding="utf-8") as f:
            source = f.read()
        c_results = c_render_all(binary, path, ctx_paths)
        compiled = py_compile(env, source)
        problems, ok_renders, both_fail = [], 0, 0
        for (cname, ctx), c in zip(CONVERSATIONS, c_results):
            py = py_render(compiled, ctx)
            if agree(py, c):
                ok_renders += py[0] == "OK"
                both_fail += py[0] == "ERR"
            elif py[0] == "OK" and c[0] == "OK":
                problems.append(f"{cname}: output differs {first_diff(py[1], c[1])}")
            else:
                problems.append(f"{cname}: python {py[0]} {py[1][:150]!r} vs C {c[0]} {c[1][:150]!r}")
        return tname, ok_renders, both_fail, problems

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        results = list(pool.map(one, templates))
    bad = 0
    for tname, ok_renders, both_fail, problems in results:
        stem = tname[:-len(".jinja")]
        if not problems:
            print(f"  match  {tname}: {ok_renders} renders identical, {both_fail} refused by both")
            continue
        tag = "known " if stem in KNOWN else "DIFFER"
        print(f"  {tag} {tname}: {len(problems)} of {len(CONVERSATIONS)} conversations disagree"
              + (f" ({KNOWN[stem]})" if stem in KNOWN else ""))
        for p in problems[:3]:
            print(f"           {p}")
        if stem not in KNOWN:
            bad += 1
    matched = sum(1 for r in results if not r[3])
    print(f"templates: {matched}/{len(results)} byte-identical on all {len(CONVERSATIONS)} conversations; "
          f"{bad} unexplained disagreements")
    return bad


# ---- random expressions ----

ATOMS = ["0", "1", "2", "-3", "7", "2.5", "0.1", "1e3", "'a'", "'Bc d'", "''", "\"x'y\"", "true", "false", "none",
         "'%s|%5.1f'", "'%-3d|%x'", "'long words in a row here'",
         "[1, 2, 3]", "['b', 'a']", "[]", "{'k': 1, 'j': [2]}", "{}", "s", "n", "f", "l", "d", "u", "(1, 'a')"]
BINOPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", ">=", "and", "or", "in", "not in", "**"]
FILTERS = ["length", "string", "upper", "lower", "trim", "list", "first", "last", "tojson", "int", "float", "abs",
           "join(',')", "default('D')", "reverse", "sort", "unique", "items", "dictsort", "min", "max", "sum",
           "capitalize", "title", "replace('a', 'z')", "indent(2)", "selectattr('x')", "map('string')", "wordcount",
           "round", "e", "count", "tojson(indent=2)", "center(9)", "truncate(9, leeway=0)", "truncate(7, true, leeway=1)",
           "format(1, 'x')"]
TESTS = ["defined", "none", "string", "number", "mapping", "iterable", "sequence", "boolean", "true", "false",
         "integer", "float", "divisibleby(2)", "equalto(1)", "odd", "even", "undefined", "lower", "upper"]
METHODS = ["upper()", "lower()", "strip()", "split()", "split('a')", "startswith('a')", "endswith('c')",
           "replace('a', 'bb')", "title()", "find('b')", "count('a')", "get('k')", "keys()", "values()", "items()",
           "splitlines()", "rstrip('d')", "lstrip(' ')", "rsplit(' ', 1)"]
VARS = {"s": "  Hello World a\n b  ", "n": 42, "f": -1.25, "l": [3, 1, 2], "d": {"k": "v", "a": 1}}


def random_expr(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.25:
        return rng.choice(ATOMS)
    if r < 0.45:
        return f"({random_expr(rng, depth + 1)} {rng.choice(BINOPS)} {random_expr(rng, depth + 1)})"
    if r < 0.6:
        return f"({random_expr(rng, depth + 1)} | {rng.choice(FILTERS)})"
    if r < 0.7:
        return f"({random_expr(rng, depth + 1)} is {rng.choice(['', 'not '])}{rng.choice(TESTS)})"
    if r < 0.8:
        return f"{rng.choice(['s', 'd', 'l', repr('a b c')])}.{rng.choice(METHODS)}"
    if r < 0.87:
        return f"({random_expr(rng, depth + 1)} if {random_expr(rng, depth + 1)} else {random_expr(rng, depth + 1)})"
    if r < 0.93:
        return f"{rng.choice(['s', 'l', '[1, 2, 3, 4]', repr('héllo')])}[{rng.choice(['0', '-1', '1:', '::-1', ':2', '1:-1', '5', '::2'])}]"
    return f"not {random_expr(rng, depth + 1)}"


def check_random(binary, workdir, count, seed):
    rng = random.Random(seed)
    env = make_env()
    exprs = [random_expr(rng) for _ in range(count)]
    # one template, each expression in its own guarded slot is not possible in
    # jinja2 (an error aborts the render), so batch: one template per expression
    # would be slow; instead render each through the C helper in groups.
    ctx_path = os.path.join(workdir, "random_ctx.json")
    with open(ctx_path, "w") as f:
        json.dump(VARS, f)
    bad = 0
    paths = []
    for i, e in enumerate(exprs):
        p = os.path.join(workdir, f"rand{i}.jinja")
        with open(p, "w", encoding="utf-8") as f:
            f.write("{{ " + e + " }}")
        paths.append(p)

    def one(i):
        e = exprs[i]
        # a fresh copy each time: jinja2's indent filter extends a list it is given
        py = py_render(py_compile(env, "{{ " + e + " }}"), copy.deepcopy(VARS))
        proc = subprocess.run([binary, paths[i], ctx_path], capture_output=True, timeout=30)
        if proc.returncode == 0:
            c = ("OK", proc.stdout.decode("utf-8", "surrogateescape"))
        else:
            c = ("ERR", proc.stderr.decode("utf-8", "replace").strip())
        if py[0] == "ERR" and c[0] == "ERR":
            return None  # both refuse: messages may word Python's exceptions differently
        if py[0] == "OK" and re.search(r" at 0x[0-9a-f]+", py[1], re.I):
            return None  # Python printed an object's address (a generator): nothing can match it
        if py != c:
            return f"{{{{ {e} }}}}: python {py} vs C {c}"
        return None

    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        for msg in pool.map(one, range(count)):
            if msg:
                bad += 1
                if bad <= 15:
                    print("  random: " + msg)
    print(f"random expressions: {count - bad}/{count} agree")
    return bad


# ---- test_jinja.c's table, checked against jinja2 ----

C_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"')
C_STRINGS = re.compile(r'(?:"(?:[^"\\]|\\.)*"\s*)+')  # adjacent literals: one string in C


def c_strings(text):
    """The C strings in text, adjacent literals joined."""
    return ["".join(c_literal(m) for m in C_STRING.findall(group.group(0))) for group in C_STRINGS.finditer(text)]


def c_literal(body):
    """The bytes of a C string literal's body as test_jinja.c writes them."""
    out, i = bytearray(), 0
    simple = {"n": 10, "t": 9, '"': 34, "\\": 92, "?": 63}
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode()
            i += 1
        elif body[i + 1] in simple:
            out.append(simple[body[i + 1]])
            i += 2
        else:
            out.append(int(body[i + 1:i + 4], 8))
            i += 4
    return out.decode("utf-8")


def check_unit_table(path):
    """RENDER_CASES in test_jinja.c: the outputs written there are jinja2's."""
    with open(path, encoding="utf-8") as f:
        src = f.read()
    at = src.index("CTX_JSON[] =")
    ctx = json.loads(c_strings(src[at:src.index(";", at)])[0])
    table = src[src.index("} RENDER_CASES[] = {"):src.index("} ERROR_CASES[] = {")]
    literals = c_strings(table)
    env, bad = make_env(), 0
    for tpl, want in zip(literals[0::2], literals[1::2]):
        got = py_render(py_compile(env, tpl), copy.deepcopy(ctx))
        if got != ("OK", want):
            bad += 1
            print(f"  test_jinja.c table: {tpl!r}: jinja2 gives {got!r}, the table says {want!r}")
    print(f"test_jinja.c table: {len(literals) // 2 - bad}/{len(literals) // 2} cases are what jinja2 renders")
    return bad


# ---- random templates: whitespace control and statements ----

TEXTS = ["", " ", "  ", "\n", "\n  ", "x", " y ", "\t", "\n\n", "a\n", "\n \n", "  \n  "]


def tag(rng, open_, body, close, var=False):
    left = rng.choice(["", "", "-", "+"])
    right = rng.choice(["", "", "-"] if var else ["", "", "-", "+"])
    return f"{open_}{left} {body} {right}{close}"


def random_block(rng, depth=0, in_loop=False):
    out = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        out.append(rng.choice(TEXTS))
        if in_loop and rng.random() < 0.1:
            out.append(tag(rng, "{%", rng.choice(["if i == 2", "if i == 1"]), "%}"))
            out.append(tag(rng, "{%", rng.choice(["break", "continue"]), "%}"))
            out.append(tag(rng, "{%", "endif", "%}"))
        elif r < 0.2 or depth > 2:
            out.append(tag(rng, "{{", rng.choice(["'v'", "loop.index if loop is defined else 0", "z | default(3)"]), "}}", var=True))
        elif r < 0.3:
            out.append(tag(rng, "{#", "c", "#}"))
        elif r < 0.55:
            out.append(tag(rng, "{%", rng.choice(["if true", "if false", "if z is defined"]), "%}"))
            out.append(random_block(rng, depth + 1, in_loop))
            if rng.random() < 0.5:
                out.append(tag(rng, "{%", "else", "%}"))
                out.append(random_block(rng, depth + 1, in_loop))
            out.append(tag(rng, "{%", "endif", "%}"))
        elif r < 0.75:
            out.append(tag(rng, "{%", rng.choice(["for i in [1, 2]", "for i in []", "for i in [1, 2, 3] if i > 1"]), "%}"))
            out.append(random_block(rng, depth + 1, True))
            if rng.random() < 0.3:
                out.append(tag(rng, "{%", "else", "%}"))
                out.append(random_block(rng, depth + 1, in_loop))
            out.append(tag(rng, "{%", "endfor", "%}"))
        elif r < 0.85:
            out.append(tag(rng, "{%", "set z = 1", "%}"))
        elif r < 0.92:
            out.append(tag(rng, "{%", "set w", "%}"))
            out.append(random_block(rng, depth + 1, in_loop))
            out.append(tag(rng, "{%", "endset", "%}"))
            out.append("[{{ w }}]")
        else:
            out.append(tag(rng, "{%", "macro m(a=1)", "%}"))
            out.append(random_block(rng, depth + 1))
            out.append(tag(rng, "{%", "endmacro", "%}"))
            out.append("<{{ m() }}>")
        out.append(rng.choice(TEXTS))
    return "".join(out)


def check_random_templates(binary, workdir, count, seed):
    rng = random.Random(seed)
    env = make_env()
    sources = [random_block(rng) + rng.choice(["", "\n"]) for _ in range(count)]
    ctx_path = os.path.join(workdir, "empty_ctx.json")
    with open(ctx_path, "w") as f:
        f.write("{}")

    def one(i):
        path = os.path.join(workdir, f"tmpl{i}.jinja")
        with open(path, "w", encoding="utf-8") as f:
            f.write(sources[i])
        py = py_render(py_compile(env, sources[i]), {})
        proc = subprocess.run([binary, path, ctx_path], capture_output=True, timeout=30)
        c = ("OK", proc.stdout.decode("utf-8", "surrogateescape")) if proc.returncode == 0 else ("ERR", "")
        if py[0] == "ERR" and c[0] == "ERR":
            return None
        return None if py == c else f"{sources[i]!r}: python {py!r} vs C {c!r}"

    bad = 0
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        for msg in pool.map(one, range(count)):
            if msg:
                bad += 1
                if bad <= 10:
                    print("  random template: " + msg)
    print(f"random templates: {count - bad}/{count} agree")
    return bad


def main():
    args = sys.argv[1:]
    count, only = 300, None
    if "--random" in args:
        i = args.index("--random")
        count = int(args[i + 1])
        del args[i:i + 2]
    if "--only" in args:
        i = args.index("--only")
        only = args[i + 1]
        del args[i:i + 2]
    if len(args) != 2:
        print(__doc__)
        return 2
    binary, tdir = args
    if not os.path.isdir(tdir) or not any(p.endswith(".jinja") for p in os.listdir(tdir)):
        msg = f"test_templates: no templates in {tdir} (tests/peer/setup_peer.sh extracts them)"
        if os.environ.get("MOEX_REQUIRE_PEER") == "1":
            print(msg + "; MOEX_REQUIRE_PEER=1")
            return 1
        print(msg + "; skipping")
        return 77
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="moex-templates-") as workdir:
        bad = check_templates(binary, tdir, workdir, only)
        unit = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_jinja.c")
        if not only and os.path.exists(unit):
            bad += check_unit_table(unit)
        if count and not only:
            seed = int(os.environ.get("MOEX_RANDOM_SEED", "1234"))
            bad += check_random(binary, workdir, count, seed=seed)
            bad += check_random_templates(binary, workdir, count, seed=seed)
    print(f"test_templates: {time.time() - t0:.1f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
