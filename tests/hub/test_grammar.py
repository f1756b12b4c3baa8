#!/usr/bin/env python3
"""Differential test of the grammar matcher (serve/grammar.c) and the JSON
schema compiler (serve/json_schema.c), through tests/hub/grammar_check.c.

JSON: random JSON texts (random nesting, unicode, escapes, numbers with
exponents, random whitespace) and one-character mutations of them (delete,
insert, replace); the matcher's verdict on the any-value schema {} must equal
json.loads' (NaN/Infinity refused) within the grammar's stated bounds
(whitespace runs and number lengths).

Schemas: ~20 Pydantic / OpenAI-style schemas (nested models, lists, enums,
optional fields, $defs recursion, tuples, formats, patterns, bounds); random
conforming and non-conforming instances and text mutations; the verdict must
equal a small validator written here, which states the grammar's deliberate
strictness: properties in the schema's order, no additional properties unless
the schema allows them, integers written as integers, canonical spellings.

usage: test_grammar.py GRAMMAR_CHECK [--seed N]"""
import decimal
import json
import os
import random
import re
import subprocess
import sys
import tempfile

CHECK = None

# ---------------------------------------------------------------- running


def verdicts(mode, path, texts, refused_ok=False):
    """The matcher's verdict on each text (True: a whole sentence); None when
    refused_ok and the schema is refused (an unsupported construct)."""
    data = "".join(json.dumps(t) + "\n" for t in texts).encode()
    out = subprocess.run([CHECK, mode, path], input=data, capture_output=True, timeout=110)
    if out.returncode == 3 and refused_ok:
        return None
    if out.returncode != 0:
        raise SystemExit(f"grammar_check {mode} {path}: rc {out.returncode}: {out.stdout[-500:]!r} {out.stderr[-500:]!r}")
    lines = out.stdout.decode().split()
    assert len(lines) == len(texts), (len(lines), len(texts))
    return [x == "1" for x in lines]


# ---------------------------------------------------------------- lexical bounds of the grammar

WS_RE = re.compile(r"[ \t\r]{0,2}(\n[ \t]{0,20})?\Z")
NUM_RE = re.compile(r"-?(0|[1-9][0-9]{0,19})(\.[0-9]{1,20})?([eE][-+]?[0-9]{1,4})?\Z")
TOKEN_RE = re.compile(r'"(?:[^"\\]|\\.)*"|[-+0-9.eE]+|[ \t\n\r]+|.', re.S)


def lexically_bounded(text):
    """Whitespace runs and numbers within the grammar's bounds (text is valid JSON)."""
    for m in TOKEN_RE.finditer(text):
        t = m.group()
        if t[0] in " \t\n\r" and not WS_RE.match(t):
            return False
        if t[0] in "-0123456789" and not NUM_RE.match(t):
            return False
    return True


class Int(int):
    """An integer literal, keeping its text ("-0")."""


class Float(float):
    """A number literal with a fraction or exponent."""


def lit_int(n, text=None):
    v = Int(n)
    v.text = str(n) if text is None else text
    return v


def lit_float(x, text=None):
    v = Float(x)
    v.text = repr(float(x)) if text is None else text
    return v


def no_constant(name):
    raise ValueError(name)


def parse(text):
    """(ok, value): json.loads with literals kept, NaN/Infinity refused, duplicate keys flagged."""
    dup = []

    def pairs(items):
        keys = [k for k, _ in items]
        if len(set(keys)) != len(keys):
            dup.append(True)
        return items  # a list of pairs: keeps the order for the validator

    try:
        v = json.loads(text, parse_int=lambda t: lit_int(int(t), t), parse_float=lambda t: lit_float(float(t), t), parse_constant=no_constant, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return False, None, False
    return True, v, bool(dup)


# ---------------------------------------------------------------- random JSON

PIECES = ["a", "Z", "0", " ", "~", '"', "\\", "/", "\b", "\f", "\n", "\r", "\t", "\x01", "\x1f", "é", "日本", "😀", "\x7f",
          "key", "{", "]", ":", ","]


def rand_string(r, n=None):
    n = r.randrange(8) if n is None else n
    return "".join(r.choice(PIECES) for _ in range(n))


def rand_number_text(r):
    s = "-" if r.random() < 0.3 else ""
    s += "0" if r.random() < 0.25 else str(r.randrange(1, 10)) + "".join(str(r.randrange(10)) for _ in range(r.randrange(10)))
    if r.random() < 0.5:
        s += "." + "".join(str(r.randrange(10)) for _ in range(1 + r.randrange(8)))
    if r.random() < 0.3:
        s += r.choice("eE") + r.choice(["", "+", "-"]) + "".join(str(r.randrange(10)) for _ in range(1 + r.randrange(3)))
    return s


def rand_ws(r):
    return r.choice(["", "", "", " ", "\n  ", "\t", "\r\n", "\n"])


def rand_json_text(r, depth=0):
    k = r.randrange(5 if depth > 3 else 7)
    if k == 0:
        return json.dumps(rand_string(r), ensure_ascii=r.random() < 0.5)
    if k == 1:
        return rand_number_text(r)
    if k in (2, 3, 4):
        return ["true", "false", "null"][k - 2]
    obj = k == 5
    parts = []
    for _ in range(r.randrange(4)):
        v = rand_json_text(r, depth + 1)
        if obj:
            v = json.dumps(rand_string(r), ensure_ascii=r.random() < 0.5) + rand_ws(r) + ":" + rand_ws(r) + v
        parts.append(rand_ws(r) + v + rand_ws(r))
    body = ",".join(parts) if parts else rand_ws(r)
    return ("{" if obj else "[") + body + ("}" if obj else "]")


MUTANTS = list('{}[]",:-+.eE0123456789 \n\t\\/aulntrfx') + ["\x01", "é", "\x7f"]


def mutate(r, text):
    if not text:
        return r.choice(MUTANTS)
    i = r.randrange(len(text))
    op = r.randrange(3)
    if op == 0:
        return text[:i] + text[i + 1:]
    if op == 1:
        return text[:i] + r.choice(MUTANTS) + text[i:]
    return text[:i] + r.choice(MUTANTS) + text[i + 1:]


def json_expected(text):
    ok, _, dup = parse(text)
    return ok and lexically_bounded(text)


# ---------------------------------------------------------------- the validator (with the grammar's strictness)

DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
TIME = r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
FORMATS = {"date": DATE, "time": TIME, "date-time": DATE + "T" + TIME,
           "uuid": r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"}


class Obj(list):
    """A parsed JSON object: its (key, value) pairs in order."""


def parse_objs(text):
    dup = []

    def pairs(items):
        if len({k for k, _ in items}) != len(items):
            dup.append(True)
        return Obj(items)

    try:
        v = json.loads(text, parse_int=lambda t: lit_int(int(t), t), parse_float=lambda t: lit_float(float(t), t), parse_constant=no_constant, object_pairs_hook=pairs)
    except (ValueError, RecursionError):
        return False, None, False
    return True, v, bool(dup)


def json_type(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, Obj):
        return "object"
    if isinstance(v, list):
        return "array"
    if isinstance(v, str):
        return "string"
    if isinstance(v, Float):
        return "number"
    if isinstance(v, int):
        return "integer"
    return "number"


def has_type(v, t):
    jt = json_type(v)
    return jt == t or (t == "number" and jt == "integer")


def canonical(v):
    """The compact JSON spelling (const/enum values match only as written so)."""
    if isinstance(v, Obj):
        return "{" + ",".join(json.dumps(k, ensure_ascii=False) + ":" + canonical(x) for k, x in v) + "}"
    if isinstance(v, list):
        return "[" + ",".join(canonical(x) for x in v) + "]"
    if isinstance(v, (Int, Float)):
        return v.text
    return json.dumps(v, ensure_ascii=False)


def resolve(root, ref):
    node = root
    for seg in ref[2:].split("/") if ref != "#" else []:
        node = node[seg.replace("~1", "/").replace("~0", "~")]
    return node


def valid(s, v, root):
    if s is True or s == {} or s is None:
        return True
    if "nullable" in s and s["nullable"]:
        if v is None:
            return True
        s = {k: x for k, x in s.items() if k != "nullable"}
    if "$ref" in s:
        return valid(resolve(root, s["$ref"]), v, root)
    if "allOf" in s:  # object schemas merge: one object with every property (extra ones only if all allow them)
        parts = [{k: x for k, x in s.items() if k != "allOf"}] + [resolve(root, x["$ref"]) if "$ref" in x else x
                                                                 for x in s["allOf"]]
        merged = {"type": "object", "properties": {}, "required": []}
        for p in parts:
            merged["properties"].update(p.get("properties", {}))
            merged["required"] += [k for k in p.get("required", []) if k not in merged["required"]]
        addl = [p["additionalProperties"] for p in parts if "additionalProperties" in p]
        merged["additionalProperties"] = bool(addl) and all(addl)
        return valid(merged, v, root)
    for key in ("anyOf", "oneOf"):
        if key in s:
            return any(valid(x, v, root) for x in s[key])
    if "const" in s or "enum" in s:
        values = [s["const"]] if "const" in s else s["enum"]
        text = canonical(v)
        types = s.get("type")
        types = [types] if isinstance(types, str) else types
        return any(json.dumps(x, ensure_ascii=False, separators=(",", ":")) == text for x in values
                   if types is None or any(has_type(to_val(x), t) for t in types))
    t = s.get("type")
    types = [t] if isinstance(t, str) else t
    if types is None:
        types = [implied(s)] if implied(s) else None
    if types is not None and not any(has_type(v, x) and typed_ok(s, x, v, root) for x in types):
        return False
    return True


def to_val(x):
    """A schema's Python value as parse() would give it (for type checks)."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return x
    if isinstance(x, int):
        return lit_int(x)
    if isinstance(x, float):
        return lit_float(x)
    if isinstance(x, dict):
        return Obj((k, to_val(y)) for k, y in x.items())
    return [to_val(y) for y in x]


def implied(s):
    for k, t in (("properties", "object"), ("required", "object"), ("additionalProperties", "object"),
                 ("items", "array"), ("prefixItems", "array"), ("minItems", "array"), ("maxItems", "array"),
                 ("minLength", "string"), ("maxLength", "string"), ("pattern", "string"), ("format", "string"),
                 ("minimum", "number"), ("maximum", "number")):
        if k in s:
            return t
    return None


def typed_ok(s, t, v, root):
    if t == "integer":
        if json_type(v) != "integer":
            return False
        lo, hi = s.get("minimum"), s.get("maximum")
        if "exclusiveMinimum" in s:
            lo = max(lo if lo is not None else -10**30, s["exclusiveMinimum"] + 1)
        if "exclusiveMaximum" in s:
            hi = min(hi if hi is not None else 10**30, s["exclusiveMaximum"] - 1)
        if lo is not None or hi is not None:
            if v.text == "-0":  # bounded integers are spelled without "-0"
                return False
            if lo is not None and v < lo or hi is not None and v > hi:
                return False
        return True
    if t == "number":  # exact decimal values: 1e-400 is positive though a float makes it 0
        neg, x = v.text.startswith("-"), decimal.Decimal(v.text)
        if "minimum" in s:
            return not neg
        if "exclusiveMinimum" in s:
            return not neg and x > 0
        if "maximum" in s:
            return x < 0 or (x == 0 and not neg)
        if "exclusiveMaximum" in s:
            return x < 0
        return True
    if t == "string":
        if "format" in s:
            return re.fullmatch(FORMATS[s["format"]], v) is not None
        if "pattern" in s:
            return re.search(s["pattern"], v) is not None
        return s.get("minLength", 0) <= len(v) <= s.get("maxLength", 10**9)
    if t == "array":
        prefix = s.get("prefixItems", [])
        items = s.get("items", True)
        if not s.get("minItems", 0) <= len(v) <= s.get("maxItems", 10**9):
            return False
        if items is False and len(v) > len(prefix):
            return False
        return all(valid(prefix[i] if i < len(prefix) else items, x, root) for i, x in enumerate(v))
    if t == "object":
        props = s.get("properties", {})
        names = list(props) + [k for k in s.get("required", []) if k not in props]
        addl = s.get("additionalProperties", "properties" not in s and "required" not in s)
        keys = [k for k, _ in v]
        listed = [k for k in keys if k in names]
        extra_at = [i for i, k in enumerate(keys) if k not in names]
        # listed ones in the schema's order, all before any extra one
        if listed != [k for k in names if k in listed]:
            return False
        if extra_at and (addl is False or extra_at[0] < len(listed)):
            return False
        if any(not plain_key(keys[i]) for i in extra_at):
            return False
        if any(k not in listed for k in s.get("required", [])):
            return False
        for k, x in v:
            sub = props.get(k, True) if k in names else (addl if addl is not True else True)
            if not valid(sub, x, root):
                return False
        return True
    return True


# ---------------------------------------------------------------- instances


def gen(s, r, root, depth=0):
    """A random instance meant to conform (the validator has the last word)."""
    if s is True or s == {} or s is None:
        return rand_value(r, depth)
    if s.get("nullable") and r.random() < 0.3:
        return None
    if "$ref" in s:
        return gen(resolve(root, s["$ref"]), r, root, depth + 1)
    if "allOf" in s:
        out = Obj()
        for sub in s["allOf"]:
            part = gen(resolve(root, sub["$ref"]) if "$ref" in sub else sub, r, root, depth + 1)
            out.extend(part)
        return out
    for key in ("anyOf", "oneOf"):
        if key in s:
            options = s[key]
            if depth > 4:  # prefer a leaf to end recursion
                options = [o for o in options if "$ref" not in o] or options
            return gen(r.choice(options), r, root, depth + 1)
    if "const" in s:
        return to_val(s["const"])
    if "enum" in s:
        return to_val(r.choice(s["enum"]))
    t = s.get("type") or implied(s) or "string"
    if isinstance(t, list):
        t = r.choice(t)
    if t == "null":
        return None
    if t == "boolean":
        return r.random() < 0.5
    if t == "integer":
        lo = s.get("minimum", s.get("exclusiveMinimum", -10**6 - 1) + 1)
        hi = s.get("maximum", s.get("exclusiveMaximum", 10**6 + 1) - 1)
        return lit_int(r.randint(lo, hi))
    if t == "number":
        x = r.choice([r.uniform(-1e4, 1e4), 0.0, r.uniform(0, 1e-3), float(r.randrange(100))])
        if "minimum" in s or "exclusiveMinimum" in s:
            x = abs(x)
        if "maximum" in s or "exclusiveMaximum" in s:
            x = -abs(x)
        text = repr(x) if r.random() < 0.7 else (str(int(x)) if x == int(x) and abs(x) < 1e15 else repr(x))
        return lit_float(x, "0" if text in ("0.0", "-0.0", "-0") and r.random() < 0.5 else text.replace("-0.0", "0.0"))
    if t == "string":
        if "format" in s:
            return {"date": "2024-02-29", "time": "12:34:56.789+02:00", "date-time": "1999-12-31T23:59:59Z",
                    "uuid": "123e4567-e89b-12d3-a456-426614174000"}[s["format"]]
        if "pattern" in s:
            return r.choice(s.get("examples", ["x"]))
        lo, hi = s.get("minLength", 0), s.get("maxLength", 12)
        return rand_string(r, r.randint(lo, hi))
    if t == "array":
        prefix = s.get("prefixItems", [])
        items = s.get("items", True)
        lo, hi = s.get("minItems", 0), s.get("maxItems", len(prefix) + (0 if items is False else 3))
        if depth > 5:
            hi = max(lo, len(prefix) if lo > 0 else 0)
            hi = lo if hi > lo else hi
        n = r.randint(lo, max(lo, hi))
        return [gen(prefix[i] if i < len(prefix) else items, r, root, depth + 1) for i in range(n)]
    if t == "object":
        props = s.get("properties", {})
        req = s.get("required", [])
        out = Obj()
        for k, sub in props.items():
            if k in req or r.random() < 0.6:
                out.append((k, gen(sub, r, root, depth + 1)))
        addl = s.get("additionalProperties", "properties" not in s and "required" not in s)
        if addl is not False and r.random() < 0.5:
            out.append(("extra_" + str(r.randrange(100)), gen(addl, r, root, depth + 1)))
        return out
    raise AssertionError(t)


def rand_value(r, depth):
    k = r.randrange(4 if depth > 3 else 6)
    if k == 0:
        return rand_string(r)
    if k == 1:
        return lit_int(r.randrange(-1000, 1000))
    if k == 2:
        return r.choice([True, False, None])
    if k == 3:
        return lit_float(r.uniform(-10, 10))
    if k == 4:
        return [rand_value(r, depth + 1) for _ in range(r.randrange(3))]
    return Obj((rand_string(r, 3), rand_value(r, depth + 1)) for _ in range(r.randrange(3)))


def break_value(v, r):
    """A changed copy: a dropped or added key, a wrong type, a stretched string or number."""
    if isinstance(v, Obj) and v and r.random() < 0.7:
        out = Obj(v)
        op = r.randrange(4)
        i = r.randrange(len(out))
        if op == 0:
            del out[i]
        elif op == 1:
            out.insert(r.randrange(len(out) + 1), ("unexpected", lit_int(1)))
        elif op == 2:
            out[i] = (out[i][0], break_value(out[i][1], r))
        else:
            out.reverse()
        return out
    if isinstance(v, list) and not isinstance(v, Obj) and v and r.random() < 0.7:
        out = list(v)
        op = r.randrange(3)
        i = r.randrange(len(out))
        if op == 0:
            del out[i]
        elif op == 1:
            out.append(out[i])
        else:
            out[i] = break_value(out[i], r)
        return out
    choices = ["text", None, True, 12345678, -7, 3.5, "", "x" * 40, [], Obj()]
    c = r.choice(choices)
    if isinstance(c, int) and not isinstance(c, bool):
        return lit_int(c)
    if isinstance(c, float):
        return lit_float(c)
    return c


def dump(v, r, style):
    """JSON text in one of three styles: compact, spaced (", " and ": "), indented."""
    if style == "indent":
        return dump_indent(v, 0)
    sep, colon = (",", ":") if style == "compact" else (", ", ": ")
    if isinstance(v, Obj):
        return "{" + sep.join(json.dumps(k, ensure_ascii=False) + colon + dump(x, r, style) for k, x in v) + "}"
    if isinstance(v, list):
        return "[" + sep.join(dump(x, r, style) for x in v) + "]"
    if isinstance(v, (Int, Float)):
        return v.text
    return json.dumps(v, ensure_ascii=False)


def dump_indent(v, level):
    pad = "\n" + "  " * (level + 1)
    if isinstance(v, Obj):
        if not v:
            return "{}"
        return "{" + ",".join(pad + json.dumps(k, ensure_ascii=False) + ": " + dump_indent(x, level + 1) for k, x in v) + \
            "\n" + "  " * level + "}"
    if isinstance(v, list):
        if not v:
            return "[]"
        return "[" + ",".join(pad + dump_indent(x, level + 1) for x in v) + "\n" + "  " * level + "]"
    if isinstance(v, (Int, Float)):
        return v.text
    return json.dumps(v, ensure_ascii=False)


# ---------------------------------------------------------------- schemas

ADDRESS = {"type": "object", "title": "Address",
           "properties": {"street": {"type": "string", "title": "Street"}, "city": {"type": "string"},
                          "zip": {"type": "string", "pattern": "^[0-9]{5}$", "examples": ["75002", "10115"]}},
           "required": ["street", "city"]}

SCHEMAS = {
    "user": {"title": "User", "type": "object",
             "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 20},
                            "age": {"type": "integer", "minimum": 0, "maximum": 150},
                            "email": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}},
             "required": ["name", "age"]},
    "order": {"$defs": {"Item": {"type": "object", "properties": {
        "sku": {"type": "string", "format": "uuid"}, "qty": {"type": "integer", "exclusiveMinimum": 0, "maximum": 99},
        "price": {"type": "number"}}, "required": ["sku", "qty", "price"], "additionalProperties": False},
        "Status": {"enum": ["pending", "shipped", "delivered"], "type": "string"}},
        "type": "object", "properties": {"id": {"type": "integer"}, "items": {"type": "array", "items": {"$ref": "#/$defs/Item"},
                                                                               "minItems": 1, "maxItems": 4},
                                         "status": {"$ref": "#/$defs/Status"}, "placed": {"type": "string", "format": "date-time"}},
        "required": ["id", "items", "status"], "additionalProperties": False},
    "tree": {"$defs": {"Node": {"type": "object", "properties": {"value": {"type": "integer"},
                                                                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                                "required": ["value"]}}, "$ref": "#/$defs/Node"},
    "linked": {"$defs": {"L": {"type": "object", "properties": {"v": {"type": "string", "maxLength": 3},
                                                               "next": {"anyOf": [{"$ref": "#/$defs/L"}, {"type": "null"}]}},
                               "required": ["v", "next"], "additionalProperties": False}}, "$ref": "#/$defs/L"},
    "tuple": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"}],
              "items": False, "minItems": 2},
    "tuple_rest": {"type": "array", "prefixItems": [{"const": "head"}], "items": {"type": "integer", "minimum": -3, "maximum": 3},
                   "maxItems": 4},
    "nullable_list": {"type": ["string", "null", "integer"]},
    "enum_mixed": {"enum": ["a", 1, True, None, "b c"]},
    "const": {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "number"}},
              "required": ["kind", "r"], "additionalProperties": False},
    "lengths": {"type": "object", "properties": {"code": {"type": "string", "minLength": 2, "maxLength": 4},
                                                 "note": {"type": "string", "maxLength": 6}}, "required": ["code"]},
    "formats": {"type": "object", "properties": {"d": {"type": "string", "format": "date"},
                                                 "t": {"type": "string", "format": "time"},
                                                 "u": {"type": "string", "format": "uuid"}}, "required": ["d", "t", "u"]},
    "pattern": {"type": "object", "properties": {"ref": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2,4}$",
                                                         "examples": ["ABC-12", "XYZ-1234"]},
                                                 "word": {"type": "string", "pattern": "(cat|dog)s?",
                                                          "examples": ["cat", "hotdogs!", "a cat"]}},
                "required": ["ref"]},
    "ranges": {"type": "array", "items": {"type": "integer", "minimum": -120, "exclusiveMaximum": 1000}, "maxItems": 5},
    "open": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"], "additionalProperties": True},
    "map": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}},
    "merged": {"$defs": {"Base": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
               "allOf": [{"$ref": "#/$defs/Base"}, {"type": "object", "properties": {"label": {"type": "string"}},
                                                    "required": ["label"]}]},
    "optional_all": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
                                                      "c": {"type": "array", "items": {"type": "string"}},
                                                      "d": {"type": "object", "properties": {"e": {"type": "integer"}}}}},
    "definitions": {"definitions": {"Address": ADDRESS},
                    "type": "object", "properties": {"home": {"$ref": "#/definitions/Address"},
                                                     "work": {"anyOf": [{"$ref": "#/definitions/Address"}, {"type": "null"}]}},
                    "required": ["home"]},
    "tagged": {"oneOf": [{"type": "object", "properties": {"type": {"const": "cat"}, "lives": {"type": "integer"}},
                          "required": ["type", "lives"], "additionalProperties": False},
                         {"type": "object", "properties": {"type": {"const": "dog"}, "good": {"type": "boolean"}},
                          "required": ["type", "good"], "additionalProperties": False}]},
    "strict": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": ["string", "null"],
                                                                                      "enum": ["c", "f", None]},
                                                "days": {"type": "integer"}},
               "required": ["city", "unit", "days"], "additionalProperties": False},
    "signs": {"type": "object", "properties": {"price": {"type": "number", "exclusiveMinimum": 0},
                                               "discount": {"type": "number", "minimum": 0},
                                               "delta": {"type": "number", "exclusiveMaximum": 0},
                                               "loss": {"type": "number", "maximum": 0}}},
    "any": {},
    "bare_object": {"type": "object", "properties": {"meta": {"type": "object"}, "list": {"type": "array"}},
                    "required": ["meta"]},
    "openapi_nullable": {"type": "object", "properties": {"n": {"type": "integer", "nullable": True}}, "required": ["n"]},
}


# ---------------------------------------------------------------- the tests


def check_json(r, work):
    path = os.path.join(work, "any.json")
    with open(path, "w") as f:
        f.write("{}")
    texts = []
    for _ in range(1500):
        t = rand_json_text(r)
        if r.random() < 0.2:
            t = rand_ws(r) + t + rand_ws(r)
        texts.append(t)
        for _ in range(3):
            texts.append(mutate(r, t))
    texts += ["NaN", "Infinity", "-Infinity", "[1,]", "{\"a\" 1}", "01", "1.", ".5", "-", "\"\\x\"", "\"\t\"", "1e400",
              "[" * 50 + "]" * 50, "\"\\ud800\"", "{\"a\":1,\"a\":2}", "", " ", "true false"]
    got = verdicts("schema", path, texts)
    bad = [(t, g) for t, g in zip(texts, got) if g != json_expected(t)]
    n_yes = sum(got)
    print(f"json: {len(texts)} texts, {n_yes} accepted, {len(bad)} disagreements")
    for t, g in bad[:10]:
        print(f"  matcher {'accepts' if g else 'refuses'} {t!r}; json.loads {'refuses' if g else 'accepts'}")
    return not bad


STRING_RE = re.compile(r'"((?:[^"\\]|\\.)*)"([ \t\n\r]*:)?', re.S)
ESCAPED_KEYS = set()  # keys of the text being checked that are spelled with escapes


def expected_for_schema(schema, text):
    ok, v, dup = parse_objs(text)
    if not ok or dup:
        return None if dup else False  # duplicate keys: invalid JSON objects to most, skipped
    ESCAPED_KEYS.clear()
    for m in STRING_RE.finditer(text):
        if m.group(2) and "\\" in m.group(1):
            ESCAPED_KEYS.add(json.loads('"' + m.group(1) + '"'))
    return lexically_bounded(text) and valid(schema, v, schema)


def plain_key(k):
    """An additional property's key must be spelled without escapes."""
    return k not in ESCAPED_KEYS and not any(c in '"\\' or ord(c) < 0x20 for c in k)


def check_schema(name, schema, r, work):
    path = os.path.join(work, name + ".json")
    with open(path, "w") as f:
        json.dump(schema, f)
    texts = []
    for _ in range(100):
        v = gen(schema, r, schema)
        for style in ("compact", "spaced", "indent"):
            texts.append(dump(v, r, style))
        w = break_value(v, r)
        texts.append(dump(w, r, r.choice(["compact", "spaced"])))
        texts.append(mutate(r, texts[-2 - r.randrange(3)]))
    expect = [expected_for_schema(schema, t) for t in texts]
    keep = [(t, e) for t, e in zip(texts, expect) if e is not None]
    got = verdicts("schema", path, [t for t, _ in keep])
    bad = [(t, g) for (t, e), g in zip(keep, got) if g != e]
    n_yes = sum(e for _, e in keep)
    print(f"schema {name}: {len(keep)} texts, {n_yes} valid, {len(bad)} disagreements")
    for t, g in bad[:6]:
        print(f"  matcher {'accepts' if g else 'refuses'}, validator {'refuses' if g else 'accepts'}: {t!r}")
    if n_yes < 60:
        print(f"  too few valid instances ({n_yes}): the generator misses the schema")
        return False
    return not bad


PATTERN_PIECES = ["a", "b", "c", "x", "1", "é", " ", "[a-c]", "[^b]", "[bx1]", ".", "\\d", "\\w", "\\s", "\\D",
                  "*", "+", "?", "{1,2}", "{2}", "{0,}", "|", "(", ")", "(?:"]


def rand_pattern(r):
    p = "".join(r.choice(PATTERN_PIECES) for _ in range(1 + r.randrange(7)))
    return ("^" if r.random() < 0.4 else "") + p + ("$" if r.random() < 0.4 else "")


def check_patterns(r, work):
    """Random regular expressions (the supported subset) against Python's re.search, on plain strings."""
    tested = disagreements = 0
    for i in range(80):
        p = rand_pattern(r)
        try:
            rx = re.compile(p, re.ASCII)
        except re.error:
            continue
        path = os.path.join(work, f"pattern{i}.json")
        with open(path, "w") as f:
            json.dump({"type": "string", "pattern": p}, f)
        texts = ["".join(r.choice("abcx1é ") for _ in range(r.randrange(6))) for _ in range(40)]
        got = verdicts("schema", path, [json.dumps(t, ensure_ascii=False) for t in texts], refused_ok=True)
        if got is None:  # refused (an unsupported construct): fine, it says so
            continue
        tested += 1
        for t, g in zip(texts, got):
            if g != (rx.search(t) is not None):
                disagreements += 1
                if disagreements <= 6:
                    print(f"  pattern {p!r} on {t!r}: matcher {g}, re.search {not g}")
    print(f"patterns: {tested} compiled, {disagreements} disagreements")
    return disagreements == 0 and tested >= 15


def main():
    global CHECK
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    CHECK = sys.argv[1]
    seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else random.randrange(1 << 30)
    seed = int(os.environ.get("MOEX_TEST_SEED", seed))
    print(f"test_grammar.py: seed {seed} (--seed or MOEX_TEST_SEED to replay)")
    r = random.Random(seed)
    ok = True
    with tempfile.TemporaryDirectory() as work:
        ok &= check_json(r, work)
        ok &= check_patterns(r, work)
        for name, schema in SCHEMAS.items():
            ok &= check_schema(name, schema, r, work)
    print("test_grammar.py:", "ok" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
