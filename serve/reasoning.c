/* A thinking model's answer into reasoning and content (reasoning.h): a
 * byte-at-a-time state machine, so that text split anywhere (between tokens,
 * inside a tag) gives the same parts as the whole. */
#include <stdlib.h>
#include <string.h>

#include "serve/reasoning.h"

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

static int put(char **s, size_t *len, const char *add, size_t n) {
    if (!n) return 0;
    char *grown = realloc(*s, *len + n + 1);
    if (!grown) return -1;
    memcpy(grown + *len, add, n);
    *len += n;
    grown[*len] = '\0';
    *s = grown;
    return 0;
}

static bool blank(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

/* A part's text, its leading newlines dropped until its first other byte. */
static int put_part(bool *started, char **c, size_t *cl, const char *s, size_t n) {
    while (!*started && n && (*s == '\n' || *s == '\r')) s++, n--;
    if (n) *started = true;
    return put(c, cl, s, n);
}

/* Content: after "</think>" its leading newlines dropped; an ordinary answer as it is. */
static int put_content(serve_reasoning *r, char **c, size_t *cl, const char *s, size_t n) {
    return r->state == THINK_DONE ? put_part(&r->content_started, c, cl, s, n) : put(c, cl, s, n);
}

int serve_reasoning_feed(serve_reasoning *r, const char *text, size_t n, bool final, char **reasoning,
                         size_t *reasoning_len, char **content, size_t *content_len) {
    for (size_t i = 0; i < n; i++) {
        const char ch = text[i];
        switch (r->state) {
        case THINK_UNDECIDED: {   /* blank space, then "<think>" or not */
            r->held[r->n_held++] = ch;
            size_t k = 0;
            while (k < r->n_held && blank(r->held[k])) k++;
            const size_t tag = r->n_held - k;
            if (k == 16 || (tag && strncmp(r->held + k, OPEN, tag < 7 ? tag : 7) != 0)) {
                r->state = THINK_NONE;   /* an ordinary answer: what was held is content */
                if (put_content(r, content, content_len, r->held, r->n_held)) return -1;
                r->n_held = 0;
            } else if (tag == sizeof OPEN - 1) {
                r->state = THINK_IN;
                r->n_held = 0;
            }
            break;
        }
        case THINK_IN: {   /* reasoning until "</think>"; a partial tag is held */
            r->held[r->n_held++] = ch;
            if (r->n_held == sizeof CLOSE - 1 && !memcmp(r->held, CLOSE, r->n_held)) {
                r->state = THINK_DONE;
                r->n_held = 0;
                break;
            }
            size_t keep = r->n_held;   /* the longest held suffix that may begin "</think>" */
            while (keep && memcmp(r->held + r->n_held - keep, CLOSE, keep)) keep--;
            const size_t out = r->n_held - keep;
            if (put_part(&r->reasoning_started, reasoning, reasoning_len, r->held, out)) return -1;
            memmove(r->held, r->held + out, keep);
            r->n_held = keep;
            break;
        }
        case THINK_DONE:
        case THINK_NONE:
            if (put_content(r, content, content_len, &text[i], n - i)) return -1;
            i = n;
            break;
        }
    }
    if (final && r->n_held) {   /* the end: a held partial tag is text after all */
        if (r->state == THINK_IN ? put_part(&r->reasoning_started, reasoning, reasoning_len, r->held, r->n_held)
                                 : put_content(r, content, content_len, r->held, r->n_held))
            return -1;
        r->n_held = 0;
    }
    return 0;
}
