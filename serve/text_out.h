/* Private to serve/: a completion's text between the tokens' pieces and the
 * client. Text is released only when no stop sequence can begin in it and it
 * ends on a whole UTF-8 sequence; a stop sequence ends the text before it;
 * what goes out has every invalid part replaced by U+FFFD (clients parse it
 * as JSON strings). Apart from batching (scheduler.c), which calls it per
 * sampled token. */
#ifndef MOEX_SERVE_TEXT_OUT_H
#define MOEX_SERVE_TEXT_OUT_H

#include <stdbool.h>
#include <stddef.h>

typedef struct serve_text_out {
    char *const *stop;          /* the request's stop sequences (it owns them) */
    int n_stop;
    char *held;                 /* text not yet released */
    size_t held_len, held_cap;
} serve_text_out;

/* Appends a token's piece; -1 when out of memory. */
int serve_text_out_add(serve_text_out *t, const char *piece, size_t n);
/* How many bytes at t->held may go out now (final: the text ends here, all
 * of it); true when a stop sequence was found: those bytes end before it
 * and the completion is finished. */
bool serve_text_out_release(serve_text_out *t, bool final, size_t *n_out);
/* Drops the first n bytes (the ones that went out). */
void serve_text_out_consume(serve_text_out *t, size_t n);
void serve_text_out_free(serve_text_out *t);
/* s[0..n) with each invalid part replaced by U+FFFD into out (3 n bytes). */
size_t serve_text_out_sanitize(const char *s, size_t n, char *out);

#endif
