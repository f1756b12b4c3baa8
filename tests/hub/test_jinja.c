/* serve/jinja.c: the Jinja subset chat templates use.
 *
 * RENDER_CASES and ERROR_CASES: small templates covering whitespace control,
 * loops, scoping, macros, call/filter/generation blocks, arithmetic, Python
 * printing, tests, slices, methods and filters, with the output (or error)
 * Python's jinja2 gives in tests/hub/test_templates.py's environment (that
 * script checks every RENDER_CASES output against jinja2 on each run, so a
 * case added here must be jinja2's bytes). Then bad input by hand: syntax errors name their line,
 * unclosed blocks, unknown filters and tags, output past the cap, unbounded
 * recursion and loops, NaN and huge numbers, invalid UTF-8 passing through,
 * and a parsed template shared by concurrent renders. */
#include <pthread.h>
#include <string.h>

#include "serve/jinja.h"
#include "tests/test_util.h"

enum { NOW = 1700000000 }; /* 2023-11-14 22:13:20 UTC */

/* The context every table case renders with. */
static const char CTX_JSON[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}], \"d\": "
    "{\"b\": 2, \"a\": 1, \"C\": 3}, \"items\": [{\"name\": \"x\", \"type\": \"t\", \"n\": 3}, {\"name\": \"y\", "
    "\"n\": 1}, {\"name\": \"z\", \"type\": \"t\", \"n\": 2}], \"s\": \"  Hello, World  \", \"e\": \"\", \"n\": 0, "
    "\"f\": 2.5, \"u\": \"h\303\251llo \346\227\245\346\234\254 \360\237\230\200\", \"l\": [3, 1, 2]}";

/* Template and the bytes jinja2 3.1.6 renders for it (Hugging Face's
 * environment: tests/hub/test_templates.py make_env, strftime_now at NOW). */
static const struct {
    const char *tpl, *want;
} RENDER_CASES[] = {
    {"{% if true %}\n  yes\n{% endif %}\nafter", "  yes\nafter"},
    {"  {% if true %}a{% endif %}  \n  {%+ if true %}b{% endif %}", "a  \n  b"},
    {"x  {%- if true -%}  y  {%- endif -%}  z", "xyz"},
    {"a {{- ' b ' -}} c", "a b c"},
    {"{# comment #}\n{#- c -#}  x\n", "x"},
    {"line1\n{% for i in [1, 2] %}\n  item {{ i }}\n{% endfor %}\nend\n", "line1\n  item 1\n  item 2\nend"},
    {"{% raw %}{{ not evaluated }}{% endraw %}", "{{ not evaluated }}"},
    {"{% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ "
     "loop.revindex }}{{ loop.revindex0 }}|{% endfor %}",
     "10TrueFalse332|21FalseFalse321|32FalseTrue310|"},
    {"{% for x in [1, 2, 3] %}{% if not loop.first %}{{ loop.previtem }}{% endif %}>{{ x }}<{% if not loop.last %}{{ "
     "loop.nextitem }}{% endif %},{% endfor %}",
     ">1<2,1>2<3,2>3<,"},
    {"{% for x in [] %}x{% else %}empty{% endfor %}", "empty"},
    {"{% for x in [1, 2, 3, 4, 5, 6] if x is odd %}{{ x }}{{ loop.length }}{% endfor %}", "133353"},
    {"{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% "
     "endfor %}",
     "0134"},
    {"{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "b=2;a=1;C=3;"},
    {"{% for k, v in d | dictsort %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;C=3;"},
    {"{% for c in 'h\303\251llo' %}[{{ c }}]{% endfor %}", "[h][\303\251][l][l][o]"},
    {"{% for k in d %}{{ k }}{% endfor %}", "baC"},
    {"{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = 5 %}{{ x }}{% endfor %}{{ x }}", "1515151"},
    {"{% set ns = namespace(count=0, found=false) %}{% for m in messages %}{% set ns.count = ns.count + 1 %}{% if "
     "m.role == 'user' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }}",
     "2 True"},
    {"{% set x %}block {{ 1 + 1 }}{% endset %}[{{ x }}]", "[block 2]"},
    {"{% set a, b = 1, 2 %}{{ a }}{{ b }}", "12"},
    {"{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ "
     "greet('Ann') }} {{ greet('Bob', 'Hi') }} {{ greet(name='Cy', punct='\?') }}",
     "Hello, Ann! Hi, Bob! Hello, Cy\?"},
    {"{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}inner{% endcall %}", "<inner>"},
    {"{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }}",
     "120"},
    {"{% filter upper %}shout {{ 'this' }}{% endfilter %}", "SHOUT THIS"},
    {"{%- filter trim -%}\n  padded  \n{%- endfilter -%}", "padded"},
    {"{% generation %}gen {{ 1 }}{% endgeneration %}", "gen 1"},
    {"{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 / 2 }} {{ 4 / 2 }} {{ 3 * "
     "'ab' }} {{ 1 + 2.5 }} {{ 7.5 // 2 }} {{ 7.5 % 2 }} {{ true + 1 }}",
     "3 -4 -2 2 1024 0.5 0.5 2.0 ababab 3.5 3.0 1.5 2"},
    {"{{ 1.0 }} {{ 1e-5 }} {{ 1e16 }} {{ 1e15 }} {{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ -0.0 }} {{ 123456789.123 }} {{ 2.5e-7 "
     "}} {{ 1e300 * 1e300 }} {{ 100.0 }} {{ 0.0001 }}",
     "1.0 1e-05 1e+16 1000000000000000.0 0.30000000000000004 0.3333333333333333 -0.0 123456789.123 2.5e-07 inf 100.0 "
     "0.0001"},
    {"{{ {'a': 1, 'b': [true, none, \"it's\", 'q\"'], 'c': {'d': 1.5}} }} {{ (1, 'a') }} {{ (1,) }} {{ [] }} {{ {} }}",
     "{'a': 1, 'b': [True, None, \"it's\", 'q\"'], 'c': {'d': 1.5}} (1, 'a') (1,) [] {}"},
    {"{{ 'a' ~ 1 ~ none ~ true ~ 2.0 ~ [1] }}", "a1NoneTrue2.0[1]"},
    {"{{ 'multi' 'part' }} {{ 'esc\\n\\t\\\\' }} {{ \"\\u00e9\\x41\" }}", "multipart esc\n\t\\ \303\251A"},
    {"{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'a' in "
     "'cat' }} {{ 2 not in [1, 3] }} {{ 'b' in d }}",
     "True False True True True True True True True"},
    {"{{ 1 and 2 }} {{ 0 and 2 }} {{ 0 or 'x' }} {{ not 0 }} {{ 'y' if n else 'z' }} {{ 'y' if f }}|",
     "2 0 x True z y|"},
    {"{{ x is defined }} {{ n is defined }} {{ none is none }} {{ s is string }} {{ d is mapping }} {{ l is iterable "
     "}} {{ s is sequence }} {{ n is number }} {{ true is boolean }} {{ true is true }} {{ 0 is false }} {{ 6 is "
     "divisibleby 3 }} {{ 3 is equalto 3 }} {{ 'x' is not none }} {{ x is undefined }} {{ f is float }} {{ n is "
     "integer }} {{ 3 is odd }} {{ 'abc' is lower }} {{ d is iterable }} {{ 1 is sameas 1 }}",
     "False True True True True True True True True True False True True True True True True True True True True"},
    {"{{ 'hello'[::-1] }} {{ [1, 2, 3][1:] }} {{ u[-2:] }} {{ u[1] }} {{ [1, 2, 3][-1] }} {{ l[::2] }} {{ "
     "'abcdef'[1:-1:2] }} {{ [1, 2, 3][5] }}|{{ d['a'] }} {{ d.a }} {{ messages[1].content }} {{ messages[-1]['role'] "
     "}}",
     "olleh [2, 3]  \360\237\230\200 \303\251 3 [3, 2] bd |1 1 hi user"},
    {"{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ 'a,b,,c'.split(',') }}|{{ 'a b  c "
     "'.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ ' a b '.rsplit(None, 1) }}",
     "Hello, World|Hello, World  |  Hello, World|hi|['a', 'b', '', 'c']|['a', 'b', 'c']|['a', 'b,c']|['a,b', 'c']|[' "
     "a', 'b']"},
    {"{{ s.startswith('  H') }} {{ s.endswith(('x', '  ')) }} {{ 'aBc dEf'.upper() }} {{ 'aBc'.lower() }} {{ \"they're "
     "bill's\".title() }} {{ 'abcabc'.replace('b', 'X') }} {{ 'abcabc'.replace('b', 'X', 1) }} {{ 'abc'.find('c') }} "
     "{{ 'abc'.find('z') }} {{ 'aaa'.count('a') }} {{ 'a\\nb\\r\\nc'.splitlines() }} {{ '{} and {}'.format(1, 'two') "
     "}} {{ '{0}{0}'.format('x') }} {{ u.upper() }} {{ '-'.join(['a', 'b']) }} {{ 'hello world'.capitalize() }}",
     "True True ABC DEF abc They'Re Bill'S aXcaXc aXcabc 2 -1 3 ['a', 'b', 'c'] 1 and two xx H\303\211LLO "
     "\346\227\245\346\234\254 \360\237\230\200 a-b Hello world"},
    {"{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ d.keys() | list }} {{ d.values() | list }} {{ "
     "d.items() | list }}",
     "1 None dflt ['b', 'a', 'C'] [2, 1, 3] [('b', 2), ('a', 1), ('C', 3)]"},
    {"{{ messages | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ u | tojson }}|{{ u | "
     "tojson(ensure_ascii=true) }}|{{ d | tojson(separators=(',', ':')) }}|{{ [] | tojson(indent=2) }}|{{ "
     "'a\"b\\n\\u0001' | tojson }}|{{ 1.5 | tojson }}|{{ none | tojson }}",
     "[{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"}]|{\n  \"b\": 2,\n  "
     "\"a\": 1,\n  \"C\": 3\n}|{\"C\": 3, \"a\": 1, \"b\": 2}|\"h\303\251llo \346\227\245\346\234\254 "
     "\360\237\230\200\"|\"h\\u00e9llo \\u65e5\\u672c "
     "\\ud83d\\ude00\"|{\"b\":2,\"a\":1,\"C\":3}|[]|\"a\\\"b\\n\\u0001\"|1.5|null"},
    {"{{ s | trim }}|{{ 'ab' | upper }}|{{ 'AB' | lower }}|{{ 'hello big-world (x)' | title }}|{{ 'hELLO' | capitalize "
     "}}|{{ s | length }}|{{ u | length }}|{{ l | count }}|{{ l | first }}|{{ l | last }}|{{ l | join(', ') }}|{{ s | "
     "replace('l', 'L') }}",
     "Hello, World|AB|ab|Hello Big-World (X)|Hello|16|10|3|3|2|3, 1, 2|  HeLLo, WorLd  "},
    {"{{ x | default('dflt') }}|{{ e | default('dflt') }}|{{ e | default('dflt', true) }}|{{ x | d('D') }}|{{ 'ab' | "
     "list }}|{{ d | items | list }}|{{ d | dictsort }}|{{ d | dictsort(by='value', reverse=true) }}",
     "dflt||dflt|D|['a', 'b']|[('b', 2), ('a', 1), ('C', 3)]|[('a', 1), ('b', 2), ('C', 3)]|[('C', 3), ('b', 2), ('a', "
     "1)]"},
    {"{{ items | selectattr('type') | map(attribute='name') | join }}|{{ items | rejectattr('type', 'equalto', 't') | "
     "map(attribute='name') | list }}|{{ [1, 2, 3, 4] | select('odd') | list }}|{{ [1, 2, 3, 4] | reject('even') | "
     "list }}|{{ items | selectattr('type', 'defined') | list | length }}|{{ ['a', 'b'] | map('upper') | list }}",
     "xz|['y']|[1, 3]|[1, 3]|2|['A', 'B']"},
    {"{{ ['a', 'A', 'b', 'a'] | unique | list }}|{{ '42' | int }}|{{ 'x' | int }}|{{ 3.9 | int }}|{{ '2.5' | float "
     "}}|{{ 3 | float }}|{{ 7 | string }}|{{ '<b>' | safe }}|{{ '<b>&\"' | e }}|{{ '<b>' | escape }}",
     "['a', 'b']|42|0|3|2.5|3.0|7|<b>|&lt;b&gt;&amp;&#34;|&lt;b&gt;"},
    {"{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(4, first=true) }}|{{ 'a\\n\\nb' | indent(2, blank=true) "
     "}}|{{ 'one two  three' | wordcount }}|{{ 2.567 | round(2) }}|{{ 2.5 | round }}|{{ 3 | round }}|{{ -3 | abs }}|{{ "
     "l | sum }}|{{ items | sum(attribute='n') }}|{{ l | min }}|{{ l | max }}|{{ ['b', 'A', 'c'] | sort }}|{{ l | "
     "sort(reverse=true) }}|{{ items | sort(attribute='n') | map(attribute='name') | join }}|{{ l | reverse | list "
     "}}|{{ 'abc' | reverse }}",
     "a\n  b\n\n  c|    a\n    b|a\n  \n  b|3|2.57|2.0|3|3|6|6|1|3|['A', 'b', 'c']|[3, 2, 1]|yzx|[2, 1, 3]|cba"},
    {"{{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(5, 0, -2) | list }} {{ dict(a=1, b='x') }} {{ "
     "strftime_now('%Y-%m-%d %H:%M') }}",
     "[0, 1, 2] [1, 4, 7] [5, 3, 1] {'a': 1, 'b': 'x'} 2023-11-14 22:13"},
    {"[{{ x }}]{{ x is defined }}[{{ d.missing }}][{{ messages[5] }}]{{ x | length }}{% for a in x %}no{% endfor %}{{ "
     "'a' in x }}",
     "[]False[][]0False"},
    {"{% set w %}{% set z = 1 %}{% endset %}{% filter upper %}{% set y = 2 %}{% endfilter %}[{{ z }}{{ y }}]{% if true "
     "%}{% set q = 3 %}{% endif %}{{ q }}",
     "[]3"},
    {"{% set z = 5 %}{% macro m() %}{{ z }}{% endmacro %}{% set z = 6 %}{{ m() }}{% macro k() %}[{{ v }}]{% endmacro "
     "%}{% for i in [1] %}{% set v = 7 %}{{ k() }}{% endfor %}",
     "6[]"},
    {"{% for i in range(5) %}{{ loop.cycle('a', 'b', 'c') }}{% endfor %} {{ '%s-%d %.2f %%' % ('x', 3, 2.5) }} {{ "
     "'%(a)s' % {'a': 1} }}",
     "abcab x-3 2.50 % 1"},
    {"{{ messages | selectattr('role', 'equalto', 'user') | list | length }} {{ [] | selectattr('x') | list }} {% if "
     "[] | select %}gen-true{% endif %} {{ none | map('string') | list }} {{ (d | items | list)[0] }}",
     "1 [] gen-true [] ('b', 2)"},
    {"{% for i in [1, 2] %}{% filter upper %}a{% break %}{% endfilter %}{{ i }}{% endfor %}|{% for i in [1, 2, 3] %}{% "
     "set x %}{% if i == 2 %}{% continue %}{% endif %}{% endset %}{{ i }}{% endfor %}",
     "|13"},
    {"{% for i in [1, 2, 3] if i > 1 %}[{{ i }}{% if i == 2 %}{% break %}{% endif %}]{% else %}E{% endfor %}|{% for i "
     "in [1, 2] %}{% for j in [] %}{% else %}{% if i == 2 %}{% break %}{% endif %}{% endfor %}{{ i }}{% endfor %}|{% "
     "for i in [1, 2] %}{% continue %}{% else %}all continued{% endfor %}",
     "[2E|1|all continued"},
    {"{{ '<p>' | safe + '<i>' }}|{{ '<i>' + '<p>' | safe }}|{{ ('<p>' | safe) ~ '<i>' }}|{{ '<p>' | safe | upper + '&' "
     "}}",
     "<p>&lt;i&gt;|&lt;i&gt;<p>|<p><i>|<P>&amp;"},
};

/* Templates jinja2 refuses, with its message (NULL: a parse error, any message). */
static const struct {
    const char *tpl, *want;
} ERROR_CASES[] = {
    {"{{ x.y }}", "'x' is undefined"},
    {"{{ raise_exception('bad role') }}", "bad role"},
    {"{{ d.missing.deeper }}", "'dict object' has no attribute 'missing'"},
    {"{{ 1 + 'a' }}", "unsupported operand type(s) for +: 'int' and 'str'"},
    {"{{ 'a' + 1 }}", "can only concatenate str (not \"int\") to str"},
    {"{{ 1 / 0 }}", "division by zero"},
    {"{% for a, b in [[1]] %}{% endfor %}", "not enough values to unpack (expected 2, got 1)"},
    {"{% set l2 = [] %}{{ l2.append(1) }}", "access to attribute 'append' of 'list' object is unsafe."},
    {"{{ d.pop('a') }}", "access to attribute 'pop' of 'dict' object is unsafe."},
    {"{{ range(200000) | length }}", "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000)."},
    {"{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "macro 'm' takes not more than 1 argument(s)"},
    {"{% macro m(a) %}{% endmacro %}{{ m(b=2) }}", "macro 'm' takes no keyword argument 'b'"},
    {"{{ none | tojson }}{{ x | tojson }}", "Object of type Undefined is not JSON serializable"},
    {"{{ 1 < 'a' }}", "'<' not supported between instances of 'int' and 'str'"},
    {"{% if false %}{{ x | from_json }}{% endif %}{{ y | from_json }}", NULL},
    {"a{% break %}b", NULL},
    {"{% for i in [1] %}{% macro m() %}{% continue %}{% endmacro %}{% endfor %}", NULL},
};

/* Parses and renders tpl with the JSON context ctx_json; the text (malloc'd)
 * or NULL with err. */
static char *render(const char *tpl, const char *ctx_json, size_t max_out, moex_error *err) {
    moex_jinja *t = moex_jinja_parse(tpl, strlen(tpl), err);
    if (!t) return NULL;
    cJSON *ctx = ctx_json ? cJSON_Parse(ctx_json) : NULL;
    char *out = moex_jinja_render(t, ctx, NOW, max_out, NULL, err);
    cJSON_Delete(ctx);
    moex_jinja_free(t);
    return out;
}

static void test_table(void) {
    for (size_t i = 0; i < sizeof RENDER_CASES / sizeof RENDER_CASES[0]; i++) {
        moex_error err = {{0}};
        char *out = render(RENDER_CASES[i].tpl, CTX_JSON, 0, &err);
        CHECK(out && strcmp(out, RENDER_CASES[i].want) == 0, "case %zu %s\n  want [%s]\n  got  [%s]", i,
              RENDER_CASES[i].tpl, RENDER_CASES[i].want, out ? out : err.msg);
        free(out);
    }
    for (size_t i = 0; i < sizeof ERROR_CASES / sizeof ERROR_CASES[0]; i++) {
        moex_error err = {{0}};
        char *out = render(ERROR_CASES[i].tpl, CTX_JSON, 0, &err);
        const char *want = ERROR_CASES[i].want;
        /* runtime errors carry "line N: " before jinja2's message; raise_exception's do not */
        const char *msg =
            strncmp(err.msg, "line ", 5) == 0 && strstr(err.msg, ": ") ? strstr(err.msg, ": ") + 2 : err.msg;
        CHECK(!out && (!want || strcmp(msg, want) == 0), "error case %zu %s: want [%s] got [%s]", i, ERROR_CASES[i].tpl,
              want ? want : "(a parse error)", out ? out : err.msg);
        free(out);
    }
}

/* Fails with a message that contains want. */
static void expect_error(const char *tpl, const char *ctx, size_t max_out, const char *want) {
    moex_error err = {{0}};
    char *out = render(tpl, ctx, max_out, &err);
    CHECK(!out && strstr(err.msg, want), "%.60s: want an error with [%s], got [%s]", tpl, want,
          out ? "(rendered)" : err.msg);
    free(out);
}

static void expect_output(const char *tpl, const char *ctx, const char *want) {
    moex_error err = {{0}};
    char *out = render(tpl, ctx, 0, &err);
    CHECK(out && strcmp(out, want) == 0, "%.60s: want [%s] got [%s]", tpl, want, out ? out : err.msg);
    free(out);
}

static void test_syntax_errors(void) {
    expect_error("a\nb\n{{ 1 + }}", NULL, 0, "line 3:");
    expect_error("x\n{% if true %}\nfoo", NULL, 0, "Unexpected end of template");
    expect_error("{% for x in y %}{% endif %}", NULL, 0, "Encountered unknown tag 'endif'");
    expect_error("{% frobnicate %}", NULL, 0, "line 1: Encountered unknown tag 'frobnicate'.");
    expect_error("\n\n{{ x | nosuchfilter }}", NULL, 0, "line 3: No filter named 'nosuchfilter'.");
    expect_error("{{ x is nosuchtest }}", NULL, 0, "No test named 'nosuchtest'.");
    expect_error("{% if x %}{{ x | nosuchfilter }}{% endif %}", "{\"x\": 1}", 0,
                 "No filter named 'nosuchfilter' found.");
    expect_output("{% if x %}{{ x | nosuchfilter }}{% endif %}ok", "{\"x\": 0}", "ok"); /* only fails when it runs */
    expect_error("{{ 'unterminated }}", NULL, 0, "line 1:");
    expect_error("{# never closed", NULL, 0, "Missing end of comment tag");
    expect_error("{{ (1 + 2 }}", NULL, 0, "line 1:");
    expect_error("{{ 1 ]] }}", NULL, 0, "line 1:");
    expect_error("{{ x[] }}", NULL, 0, "line 1: expected an expression");
    expect_error("{{ 99999999999999999999 }}", NULL, 0, "integer literal too large");
    expect_error("{% macro m(a=1, b) %}{% endmacro %}", NULL, 0, "non-default argument");
    /* nesting bounded at parse time */
    char deep[4200];
    size_t n = 0;
    n += (size_t)sprintf(deep, "{{ ");
    for (int i = 0; i < 2000; i++) deep[n++] = '(';
    deep[n++] = '1';
    for (int i = 0; i < 2000; i++) deep[n++] = ')';
    strcpy(deep + n, " }}");
    expect_error(deep, NULL, 0, "nest");
    char ifs[20000] = "";
    for (int i = 0; i < 1000; i++) strcat(ifs, "{% if 1 %}");
    expect_error(ifs, NULL, 0, "nests deeper");
}

static void test_bounds(void) {
    /* output past the cap */
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxxxxxxxx{% endfor %}{% endfor %}",
                 NULL, 1 << 20, "output exceeds 1048576 bytes");
    expect_error("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 NULL, 1 << 20, "exceeds"); /* a captured string is bounded like the output */
    /* every allocation counts against the render's memory bound (8 * max_out + 64 MiB) */
    expect_error("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}{% endfor %}",
                 NULL, 1 << 20, "template needs more than 72 MiB of memory");
    expect_error("{{ 'ab' * 100000000000 }}", NULL, 1 << 20, "too large");
    /* unbounded recursion and loops stop */
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", NULL, 0, "deep");
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", NULL, 1 << 20,
                 "memory"); /* each range() is a list of 100000 */
    expect_error(
        "{% set l = range(1000) | list %}{% for a in l %}{% for b in l %}{% for c in l %}{% endfor %}{% endfor %}"
        "{% endfor %}",
        NULL, 0, "more than 10000000 loop iterations");
    /* numbers: NaN and infinities print as Python does; big ints fail instead of wrapping */
    expect_output("{{ 1e308 * 10 }} {{ -1e308 * 10 }} {{ (1e308 * 10) - (1e308 * 10) }} {{ [1e308 * 10] | tojson }}",
                  NULL, "inf -inf nan [Infinity]");
    expect_output("{{ 9223372036854775807 }} {{ -9223372036854775807 - 1 }}", NULL,
                  "9223372036854775807 -9223372036854775808");
    expect_error("{{ 9223372036854775807 + 1 }}", NULL, 0, "integer overflow");
    expect_error("{{ 2 ** 64 }}", NULL, 0, "integer overflow");
    expect_output("{{ x }} {{ x | tojson }} {{ y }}", "{\"x\": 1e300, \"y\": 3}", "1e+300 1e+300 3");
    /* values sharing parts compare in linear time (l = l + [l], 60 times: exponential without the identity rule) */
    const double t0 = moex_time_s();
    expect_output("{% set ns = namespace(l=[]) %}{% for i in range(60) %}{% set ns.l = ns.l + [ns.l] %}{% endfor %}"
                  "{{ ns.l == ns.l + [] }} {{ [ns.l] | unique | list | length }} {{ ns.l in [ns.l] }}",
                  NULL, "True 1 True");
    CHECK(moex_time_s() - t0 < 5.0, "comparing shared values took %.1f s", moex_time_s() - t0);
    /* range() near the ends of int64: no signed overflow (UBSan), the sandbox's size limit */
    expect_output("{{ range(9223372036854775800, 9223372036854775807, 3) | list }}", NULL,
                  "[9223372036854775800, 9223372036854775803, 9223372036854775806]");
    expect_output("{{ range(-9223372036854775807 - 1, 9223372036854775807, 4611686018427387904) | list | length }}",
                  NULL, "4");
    /* a context object of 60,000 keys converts in linear time */
    {
        const int n = 60000;
        char *ctx = malloc((size_t)n * 24 + 64);
        size_t at = (size_t)sprintf(ctx, "{\"d\": {");
        for (int i = 0; i < n; i++) at += (size_t)sprintf(ctx + at, "%s\"k%d\": %d", i ? ", " : "", i, i);
        sprintf(ctx + at, "}}");
        const double t1 = moex_time_s();
        expect_output("{{ d | length }} {{ d.k59999 }}", ctx, "60000 59999");
        CHECK(moex_time_s() - t1 < 5.0, "a 60,000-key object took %.1f s", moex_time_s() - t1);
        free(ctx);
    }
}

static void test_bytes_pass_through(void) {
    /* invalid UTF-8 in the template and in context strings comes out as it went in */
    expect_output("\xff{{ s }}\xfe|{{ s | length }}|{{ s | upper }}", "{\"s\": \"a\xc3(b\"}",
                  "\xff"
                  "a\xc3(b\xfe|4|A\xc3(B");
    expect_output("{{ s[1] }}|{{ s[::-1] }}", "{\"s\": \"\xe6\x97\xa5\xe6\x9c\xac\"}",
                  "\xe6\x9c\xac|\xe6\x9c\xac\xe6\x97\xa5");
    /* CRLF is normalized, one trailing newline dropped, as jinja2 does */
    expect_output("a\r\nb\rc\n", NULL, "a\nb\nc");
    expect_output("", NULL, "");
    /* a NULL context: every name undefined */
    expect_output("[{{ messages }}]{{ messages is defined }}", NULL, "[]False");
}

/* A parsed template is immutable: renders on several threads at once agree. */
typedef struct shared_render {
    const moex_jinja *t;
    cJSON *ctx;
    char *out;
} shared_render;

static void *render_thread(void *arg) {
    shared_render *s = arg;
    moex_error err;
    for (int i = 0; i < 50; i++) {
        free(s->out);
        s->out = moex_jinja_render(s->t, s->ctx, NOW, 0, NULL, &err);
    }
    return NULL;
}

static void test_threads(void) {
    const char *tpl = RENDER_CASES[17].tpl;
    moex_error err;
    moex_jinja *t = moex_jinja_parse(tpl, strlen(tpl), &err);
    CHECK(t != NULL, "parse: %s", err.msg);
    if (!t) return;
    shared_render s[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        s[i] = (shared_render){t, cJSON_Parse(CTX_JSON), NULL};
        pthread_create(&th[i], NULL, render_thread, &s[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(s[i].out && strcmp(s[i].out, RENDER_CASES[17].want) == 0, "thread %d: %s", i,
              s[i].out ? s[i].out : "NULL");
        free(s[i].out);
        cJSON_Delete(s[i].ctx);
    }
    moex_jinja_free(t);
}

int main(void) {
    test_table();
    test_syntax_errors();
    test_bounds();
    test_bytes_pass_through();
    test_threads();
    if (g_failures) {
        fprintf(stderr, "test_jinja: %d failures\n", g_failures);
        return 1;
    }
    printf("test_jinja: ok (%zu render cases, %zu error cases)\n", sizeof RENDER_CASES / sizeof RENDER_CASES[0],
           sizeof ERROR_CASES / sizeof ERROR_CASES[0]);
    return 0;
}
