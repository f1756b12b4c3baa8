/* Private to serve/: a thinking model's answer split into its reasoning and
 * its content (OpenAI-compatible servers' message.reasoning_content). A
 * completion that starts with "<think>" (after blank space) is reasoning up to
 * "</think>" and content after it (the newlines each begins with dropped);
 * any other completion is content, as it is. Streaming: text goes in as it comes and comes
 * out as the two parts, holding back only what may still be one of the tags. */
#ifndef MOEX_SERVE_REASONING_H
#define MOEX_SERVE_REASONING_H

#include <stdbool.h>
#include <stddef.h>

typedef enum serve_think_state { THINK_UNDECIDED, THINK_IN, THINK_DONE, THINK_NONE } serve_think_state;

typedef struct serve_reasoning {
    serve_think_state state;
    char held[32];              /* bytes that may still be the start of a tag, or blank space before it */
    size_t n_held;
    bool reasoning_started, content_started;   /* each part's leading newlines dropped until its first other byte */
} serve_reasoning;

/* Feeds text[0..n) (final: the completion ends after it). Appends what is
 * decided to *reasoning / *content (malloc'd strings, grown; NULL when
 * nothing): returns -1 when out of memory. */
int serve_reasoning_feed(serve_reasoning *r, const char *text, size_t n, bool final, char **reasoning,
                         size_t *reasoning_len, char **content, size_t *content_len);

#endif
