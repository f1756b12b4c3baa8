/* A completion's text on its way out (text_out.h): pieces held back while
 * they may still begin a stop sequence or end inside a UTF-8 sequence. */
#include <stdlib.h>
#include <string.h>

#include "serve/text_out.h"

/* Bytes at the end of s[0..n) that begin a UTF-8 sequence not yet complete. */
static size_t utf8_incomplete_tail(const char *s, size_t n) {
    for (size_t back = 1; back <= 4 && back <= n; back++) {
        const unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? back : 0;
    }
    return 0;
}

/* The longest suffix of s[0..n) that is a proper prefix of a stop sequence. */
static size_t stop_prefix_tail(const serve_text_out *t, const char *s, size_t n) {
    size_t keep = 0;
    for (int i = 0; i < t->n_stop; i++) {
        const size_t k = strlen(t->stop[i]);
        for (size_t len = k - 1 < n ? k - 1 : n; len > keep; len--)
            if (!memcmp(s + n - len, t->stop[i], len)) {
                keep = len;
                break;
            }
    }
    return keep;
}

/* The first stop sequence in s[0..n): its offset, or -1. */
static long find_stop(const serve_text_out *t, const char *s, size_t n) {
    long best = -1;
    for (int i = 0; i < t->n_stop; i++) {
        const size_t k = strlen(t->stop[i]);
        for (size_t at = 0; at + k <= n; at++)
            if (!memcmp(s + at, t->stop[i], k)) {
                if (best < 0 || (long)at < best) best = (long)at;
                break;
            }
    }
    return best;
}

/* The bytes at s[0..n) that begin a UTF-8 sequence: *valid says whether
 * they are a whole, valid one; otherwise they are its longest valid prefix
 * (at least one byte), which one U+FFFD replaces, as the Unicode standard
 * recommends (browsers, Python and TextDecoder do the same). */
static size_t utf8_span(const unsigned char *s, size_t n, bool *valid) {
    const unsigned char c = s[0];
    *valid = c < 0x80;
    if (c < 0x80) return 1;
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) need = 3, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4) need = 4, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    else return 1;
    size_t k = 1;
    for (; k < need && k < n; k++) {
        const unsigned char b = s[k];
        if (k == 1 ? b < lo || b > hi : (b & 0xC0) != 0x80) break;
    }
    *valid = k == need;
    return k;
}

size_t serve_text_out_sanitize(const char *s, size_t n, char *out) {
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        bool valid;
        const size_t k = utf8_span((const unsigned char *)s + i, n - i, &valid);
        if (valid) {
            memcpy(out + o, s + i, k);
            o += k;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
        i += k;
    }
    return o;
}

int serve_text_out_add(serve_text_out *t, const char *piece, size_t n) {
    if (t->held_len + n > t->held_cap) {
        size_t cap = t->held_cap ? t->held_cap : 64;
        while (cap < t->held_len + n) cap *= 2;
        char *grown = realloc(t->held, cap);
        if (!grown) return -1;
        t->held = grown;
        t->held_cap = cap;
    }
    memcpy(t->held + t->held_len, piece, n);
    t->held_len += n;
    return 0;
}

bool serve_text_out_release(serve_text_out *t, bool final, size_t *n_out) {
    const long at = find_stop(t, t->held, t->held_len);
    if (at >= 0) {
        *n_out = (size_t)at;
        return true;
    }
    size_t keep = final ? 0 : stop_prefix_tail(t, t->held, t->held_len);
    if (!final) keep += utf8_incomplete_tail(t->held, t->held_len - keep);
    *n_out = t->held_len - keep;
    return false;
}

void serve_text_out_consume(serve_text_out *t, size_t n) {
    memmove(t->held, t->held + n, t->held_len - n);
    t->held_len -= n;
}

void serve_text_out_free(serve_text_out *t) {
    free(t->held);
    *t = (serve_text_out){0};
}

