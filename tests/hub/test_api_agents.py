#!/usr/bin/python3
"""What agents use, against a real `moex-hub serve --local` on loopback:

- chat templates run from Jinja: a GGUF's own template (Qwen2's default system
  prompt is there), --chat-template-file, the built-in ChatML for a model
  without one; /apply-template shows the prompt; tools and tool results in
  the rendered prompt;
- constrained output: a GBNF `grammar`, response_format json_object and
  json_schema, forced tool calls (tool_choice "required" / a named function),
  through raw HTTP and the official openai npm client (agents_test.mjs:
  chat.completions.parse with a zod schema, a tool-call round trip whole and
  streamed) on the shipped model;
- bad input: a grammar that does not parse, a schema keyword not enforced, a
  tool_choice naming no tool, tools on a built-in template: 400s naming the field.

usage: test_api_agents.py BIN_DIR VOCAB_DIR WORK_DIR [scenario ...]
Exits 77 when node with the openai package is missing, unless MOEX_REQUIRE_API_TOOLS=1.
"""
import json
import math
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from apilib import NODE_DIR, Serve, error_of, have_node_client, need, request  # noqa: E402
from distlib import check, finish_script, free_port, gen_model, scenario, setup  # noqa: E402

need(have_node_client(), "node or the openai package is missing (run tests/hub/api/setup.sh)")
setup(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:])
import distlib  # noqa: E402  (setup filled in its BIN and WORK)

KEY = "agents-key"
SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "train", "model",
                       "brown-moe-q8_0.gguf")
USER = [{"role": "user", "content": "Hello there"}]


def post(srv, path, body):
    st, _, raw = request(srv.port, "POST", path, body, key=KEY)
    try:
        return st, json.loads(raw)
    except ValueError:
        return st, raw


def chat(srv, body):
    return post(srv, "/v1/chat/completions", {"temperature": 0, "max_tokens": 32, **body})


def bad(srv, body, param, what, path="/v1/chat/completions"):
    st, r = post(srv, path, {"max_tokens": 4, "messages": USER, **body})
    e = error_of(json.dumps(r).encode()) if isinstance(r, dict) else None
    check(f"{what}: 400 naming '{param}'", st == 400 and e and e["param"] == param, f"{st} {str(r)[:300]}")


def prompt_of(srv, body):
    st, r = post(srv, "/apply-template", body)
    return r.get("prompt") if st == 200 and isinstance(r, dict) else None


@scenario
def templates():
    """The GGUF's Jinja template runs (Qwen2's, from llama.cpp's vocab file); --chat-template-file replaces it."""
    model = gen_model("qwen3moe", "q8_0", 11, vocab="ggml-vocab-qwen2.gguf")
    srv = Serve(distlib.BIN, distlib.WORK, model, free_port(), ["--local", "--ctx", "256"], key=KEY)
    try:
        p = prompt_of(srv, {"messages": USER})
        check("the GGUF's template: Qwen2's default system turn, then the user's, then the assistant's opening",
              p == "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello there"
                   "<|im_end|>\n<|im_start|>assistant\n", repr(p))
        st, r = chat(srv, {"messages": USER, "max_tokens": 4})
        check("a chat through it answers", st == 200 and r["usage"]["prompt_tokens"] > 10, f"{st} {str(r)[:200]}")
        bad(srv, {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
            "tools with a template that writes no tool calls")
    finally:
        srv.stop()
    tpl = os.path.join(distlib.WORK, "mine.jinja")
    with open(tpl, "w") as f:
        f.write("{% for m in messages %}[{{ m.role | upper }}] {{ m.content | trim }}\n{% endfor %}"
                "{% if add_generation_prompt %}[ASSISTANT]{% endif %}")
    srv = Serve(distlib.BIN, distlib.WORK, model, free_port(), ["--local", "--ctx", "256", "--chat-template-file",
                                                                 tpl], key=KEY)
    try:
        p = prompt_of(srv, {"messages": [{"role": "system", "content": " Be brief. "}, *USER]})
        check("--chat-template-file: that template renders the chat", p == "[SYSTEM] Be brief.\n[USER] Hello there\n"
              "[ASSISTANT]", repr(p))
    finally:
        srv.stop()
    for args, what in ((["--chat-template-file", os.path.join(distlib.WORK, "none.jinja")], "cannot open"),
                       (["--chat-template-file", tpl, "--chat-template", "chatml"], "pass one")):
        p = subprocess.run([f"{distlib.BIN}/moex-hub", "serve", "-m", model, "--local", "--port", str(free_port()),
                            *args], capture_output=True, text=True, timeout=60)
        check(f"serve {' '.join(args[-2:])}: refused at start ({what})", p.returncode != 0 and what in p.stderr,
              p.stderr[-300:])
    broken = os.path.join(distlib.WORK, "broken.jinja")
    with open(broken, "w") as f:
        f.write("line one\n{% for m in messages %}{{ m.content }}\n")
    p = subprocess.run([f"{distlib.BIN}/moex-hub", "serve", "-m", model, "--local", "--port", str(free_port()),
                        "--chat-template-file", broken], capture_output=True, text=True, timeout=60)
    check("a template that does not parse: refused at start, its line named", p.returncode != 0 and
          "line 2" in p.stderr, p.stderr[-300:])


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                   "required": ["city"], "additionalProperties": False}}}]


@scenario
def shipped():
    """The shipped model (no template in its GGUF: ChatML with Hermes tool calls): constrained answers."""
    srv = Serve(distlib.BIN, distlib.WORK, SHIPPED, free_port(), ["--local", "--ctx", "1024", "--parallel", "2"],
                key=KEY)
    try:
        p = prompt_of(srv, {"messages": USER})
        check("no template in the GGUF: ChatML", p == "<|im_start|>user\nHello there<|im_end|>\n"
              "<|im_start|>assistant\n", repr(p))
        call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}
        p = prompt_of(srv, {"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                                         {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
                            "tools": TOOLS})
        check("tools, a call and its result in the prompt (the call's arguments as a JSON object)",
              p is not None and '"name": "get_weather"' in p and '<tool_call>\n{"name": "get_weather", "arguments": '
              '{"city": "Oslo"}}\n</tool_call>' in p and "<tool_response>\nsunny\n</tool_response>" in p, repr(p))
        st, r = chat(srv, {"messages": USER, "grammar": 'root ::= "yes" | "no"'})
        check("grammar: the answer is one of its sentences, finish 'stop'", st == 200 and
              r["choices"][0]["message"]["content"] in ("yes", "no") and r["choices"][0]["finish_reason"] == "stop",
              f"{st} {str(r)[:300]}")
        st, r = chat(srv, {"messages": USER, "grammar": 'root ::= "yes" | "no"', "logprobs": True, "top_logprobs": 5})
        lp = r["choices"][0]["logprobs"]["content"] if st == 200 else []
        first = lp[0]["top_logprobs"] if lp else []
        ok = first and all(isinstance(t["logprob"], float) for t in first)
        mass = sum(math.exp(t["logprob"]) for t in first) if ok else 0
        check("logprobs under a grammar: of the distribution it leaves (the first token's alternatives are numbers and "
              "start 'yes' or 'no', their probabilities sum to 1)", ok and all(
                  "yes".startswith(t["token"]) or "no".startswith(t["token"]) for t in first) and abs(mass - 1) < 1e-3,
              f"{st} {str(first)[:300]} mass {mass}")
        st, r = post(srv, "/v1/completions", {"prompt": "The number is", "max_tokens": 40, "temperature": 1.0,
                                              "seed": 3, "grammar": 'root ::= " " [1-9] [0-9]{0,3} "."'})
        text = r["choices"][0]["text"] if st == 200 else ""
        check("grammar on /v1/completions, sampling: the text follows it", st == 200 and text.startswith(" ") and
              text.endswith(".") and text[1:-1].isdigit() and len(text) <= 6, f"{st} {str(r)[:300]}")
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer",
                  "minimum": 0, "maximum": 99}, "word": {"type": "string", "enum": ["alpha", "beta"]}},
                  "required": ["ok", "n", "word"], "additionalProperties": False}
        for stream in (False, True):
            body = {"messages": USER, "max_tokens": 400, "response_format": {"type": "json_schema", "json_schema": {
                "name": "t", "schema": schema, "strict": True}}, "stream": stream}
            if stream:
                st, _, raw = request(srv.port, "POST", "/v1/chat/completions", {"temperature": 0, **body}, key=KEY)
                text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                               for line in raw.decode().splitlines() if line.startswith("data: {"))
            else:
                st, r = chat(srv, body)
                text = r["choices"][0]["message"]["content"] if st == 200 else ""
            try:
                obj = json.loads(text)
            except ValueError:
                obj = None
            check(f"response_format json_schema ({'streamed' if stream else 'whole'}): valid for the schema",
                  isinstance(obj, dict) and set(obj) == {"ok", "n", "word"} and isinstance(obj["ok"], bool) and
                  isinstance(obj["n"], int) and 0 <= obj["n"] <= 99 and obj["word"] in ("alpha", "beta"),
                  f"{st} {text[:300]!r}")
        st, r = chat(srv, {"messages": USER, "tools": TOOLS, "tool_choice": "required", "parallel_tool_calls": False,
                           "max_tokens": 400})
        msg = r["choices"][0]["message"] if st == 200 else {}
        calls = msg.get("tool_calls") or []
        args = json.loads(calls[0]["function"]["arguments"]) if calls else None
        check("tool_choice required (raw HTTP): a call, content null, finish 'tool_calls'",
              calls and calls[0]["function"]["name"] == "get_weather" and isinstance(args, dict) and
              set(args) == {"city"} and msg.get("content") is None and
              r["choices"][0]["finish_reason"] == "tool_calls", f"{st} {str(r)[:400]}")
        # bad input
        bad(srv, {"grammar": "root ::= item+"}, "grammar", "a grammar that does not parse (a rule not defined)")
        bad(srv, {"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar",
            "grammar and response_format together")
        huge = "root ::= " + " ".join(f"r{i}" for i in range(15)) + "\n" + "".join(
            f"r{i} ::= [a-z]{{0,65536}}\n" for i in range(15))
        t0 = time.time()
        bad(srv, {"grammar": huge, "n": 4}, "grammar", "a 400-byte grammar that expands to a million elements")
        check("  ... refused at once (no 80 MB parse per choice)", time.time() - t0 < 10, f"{time.time() - t0:.1f} s")
        bad(srv, {"tools": [{"type": "function", "function": {"name": 'a"b'}}], "tool_choice": "required"}, "tools",
            "a tool name outside OpenAI's [a-zA-Z0-9_-]{1,64}")
        bad(srv, {"chat_template_kwargs": {f"k{i}": i for i in range(100)}}, "chat_template_kwargs",
            "chat_template_kwargs with 100 members")
        bad(srv, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "if": {"type": "object"}}}}}, "response_format", "a schema keyword not enforced ('if')")
        bad(srv, {"response_format": {"type": "xml"}}, "response_format", "an unknown response_format type")
        bad(srv, {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
            "a tool_choice naming no tool")
        bad(srv, {"tools": [{"type": "function"}]}, "tools", "a tool without a function")
        bad(srv, {"messages": [*USER, {"role": "tool", "content": "x"}]}, "messages", "a tool message without its id")
        bad(srv, {"messages": [{"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "f", "arguments": "{not json"}}]}]}, "messages", "tool-call arguments that are not JSON")
        bad(srv, {"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs",
            "chat_template_kwargs overriding what the server sets")
        st, r = chat(srv, {"messages": USER, "max_tokens": 4})
        check("after all that, the server still answers", st == 200, f"{st} {str(r)[:200]}")
        # the official client: chat.completions.parse, JSON mode, the tool round trip
        cfg_path = os.path.join(distlib.WORK, "agents.json")
        with open(cfg_path, "w") as f:
            json.dump({"base": srv.base, "key": KEY, "model": "brown-moe-q8_0"}, f)
        p = subprocess.run(["node", os.path.join(NODE_DIR, "agents_test.mjs"), cfg_path], capture_output=True,
                           text=True, timeout=600)
        lines = p.stdout.splitlines()
        for line in lines:
            if line.startswith("ok") or line.startswith("FAIL"):
                check(f"[openai client] {line[5:]}", line.startswith("ok"), line)
        check("[openai client] ran to the end", p.returncode == 0 or any(x.startswith("FAIL") for x in lines),
              f"rc={p.returncode} {p.stderr[-1500:]}")
    finally:
        srv.stop()
    srv = Serve(distlib.BIN, distlib.WORK, SHIPPED, free_port(), ["--local", "--ctx", "256", "--chat-template",
                                                                   "chatml"], key=KEY)
    try:
        bad(srv, {"tools": TOOLS}, "tools", "tools with a built-in template (--chat-template)")
    finally:
        srv.stop()


@scenario
def vulkan():
    """On Vulkan a greedy row under a grammar stays on the GPU unless the grammar refuses its argmax; then it is
    read back alone. The answers equal those of rows always read back (a zero logit_bias), and rows were read."""
    p = subprocess.run([f"{distlib.BIN}/moex-hub", "--list-devices"], capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        print("     (no Vulkan device: skipped)")
        return
    srv = Serve(distlib.BIN, distlib.WORK, SHIPPED, free_port(), ["--local", "--backend", "vulkan", "--ctx", "512"],
                key=KEY)
    try:
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                  "n": {"type": "integer", "minimum": 0, "maximum": 999}}, "required": ["name", "n"]}
        base = {"messages": USER, "max_tokens": 120, "response_format": {"type": "json_schema", "json_schema": {
            "name": "t", "schema": schema}}}
        def masked():
            st, _, body = request(srv.port, "GET", "/metrics", key=KEY)
            return sum(float(line.split()[1]) for line in body.decode().splitlines()
                       if line.startswith("moex_grammar_masked_tokens_total"))
        m0 = masked()
        st1, lazy = chat(srv, base)
        m1 = masked()
        st2, full = chat(srv, {**base, "logit_bias": {"0": 0}})
        a = lazy["choices"][0]["message"]["content"] if st1 == 200 else None
        b = full["choices"][0]["message"]["content"] if st2 == 200 else None
        check("vulkan: a grammar answer with rows read only when refused equals one with every row read",
              a is not None and a == b and json.loads(a)["n"] >= 0, f"{st1} {a!r} vs {st2} {b!r}")
        check("vulkan: the grammar refused some argmax (rows were read back alone)", m1 > m0, f"{m0} -> {m1}")
    finally:
        srv.stop()


finish_script()
