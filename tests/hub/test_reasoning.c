/* A thinking model's answer into reasoning and content (serve/reasoning.c):
 * fixed cases, and every answer fed in random pieces gives what it gives
 * whole (a tag may be cut anywhere between tokens). */
#include <string.h>

#include "serve/reasoning.h"
#include "tests/test_util.h"

typedef struct parts {
    char *reasoning, *content;
    size_t rl, cl;
} parts;

/* text fed in pieces of at most `piece` bytes (0: whole). */
static parts split(const char *text, size_t piece, rng *r) {
    serve_reasoning rs = {0};
    parts p = {0};
    const size_t n = strlen(text);
    for (size_t at = 0; at < n || at == 0;) {
        size_t k = piece ? 1 + (size_t)(rng_next(r) % piece) : n;
        if (k > n - at) k = n - at;
        const bool final = at + k == n;
        CHECK(serve_reasoning_feed(&rs, text + at, k, final, &p.reasoning, &p.rl, &p.content, &p.cl) == 0, "feed");
        at += k;
        if (final) break;
    }
    return p;
}

static void expect(const char *text, const char *reasoning, const char *content, rng *r) {
    for (size_t piece = 0; piece <= 5; piece++) {
        parts p = split(text, piece, r);
        const char *gr = p.reasoning ? p.reasoning : "", *gc = p.content ? p.content : "";
        CHECK(!strcmp(gr, reasoning) && !strcmp(gc, content),
              "'%s' in pieces of %zu: reasoning '%s' (want '%s'), content '%s' (want '%s')", text, piece, gr, reasoning,
              gc, content);
        free(p.reasoning);
        free(p.content);
    }
}

int main(void) {
    rng r = test_rng("test_reasoning");
    expect("<think>\nLet me see.\n</think>\n\nIt is 4.", "Let me see.\n", "It is 4.", &r);
    expect("\n <think>a</think>b", "a", "b", &r);
    expect("Plain answer.", "", "Plain answer.", &r);
    expect("\n\nPlain, after newlines.", "", "\n\nPlain, after newlines.", &r);   /* an ordinary answer: as it is */
    expect("<thin", "", "<thin", &r);                        /* ends inside the tag: text after all */
    expect("<thinking>x</thinking>", "", "<thinking>x</thinking>", &r);
    expect("<think>still thinking", "still thinking", "", &r);   /* cut by max_tokens */
    expect("<think>a </thin b</think>c", "a </thin b", "c", &r);
    expect("x <think>y</think>", "", "x <think>y</think>", &r);   /* not at the start: content */
    expect("                    <think>y</think>z", "", "                    <think>y</think>z", &r);
    expect("", "", "", &r);
    if (g_failures) {
        fprintf(stderr, "test_reasoning: %d failure(s)\n", g_failures);
        return 1;
    }
    printf("test_reasoning: ok\n");
    return 0;
}
