/* Unicode lookups over the generated tables, UTF-8 coding, GPT-2 bytes. */
#include <stdbool.h>
#include <string.h>

#include "common/unicode.h"

uint8_t moex_unicode_flags(uint32_t cp) {
    if (cp < 128) return moex_unicode_ascii_flags[cp];
    if (cp >= MOEX_UNICODE_MAX) return 0;
    /* Last range whose start <= cp. */
    int lo = 0, hi = moex_unicode_n_ranges - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (moex_unicode_ranges[mid].start <= cp) lo = mid;
        else hi = mid - 1;
    }
    return moex_unicode_ranges[lo].flags;
}

uint32_t moex_unicode_tolower(uint32_t cp) {
    if (cp < 128) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
    int lo = 0, hi = moex_unicode_n_lower - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        uint32_t from = moex_unicode_lower[mid].from;
        if (from == cp) return moex_unicode_lower[mid].to;
        if (from < cp) lo = mid + 1;
        else hi = mid - 1;
    }
    return cp;
}

size_t moex_utf8_seq_len(uint8_t lead) {
    static const uint8_t lookup[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return lookup[lead >> 4];
}

static int is_cont(const char *s, size_t i) { return ((uint8_t)s[i] & 0xC0) == 0x80; }

uint32_t moex_utf8_decode(const char *s, size_t len, size_t *adv) {
    const uint8_t b0 = (uint8_t)s[0];
    *adv = 1;
    if (b0 < 0x80) return b0;
    if (b0 < 0xC0) return MOEX_UNICODE_REPLACEMENT;  /* stray continuation */
    if (b0 < 0xE0) {
        if (len < 2 || !is_cont(s, 1)) return MOEX_UNICODE_REPLACEMENT;
        *adv = 2;
        return ((uint32_t)(b0 & 0x1F) << 6) | ((uint8_t)s[1] & 0x3F);
    }
    if (b0 < 0xF0) {
        if (len < 3 || !is_cont(s, 1) || !is_cont(s, 2)) return MOEX_UNICODE_REPLACEMENT;
        *adv = 3;
        return ((uint32_t)(b0 & 0x0F) << 12) | ((uint32_t)((uint8_t)s[1] & 0x3F) << 6) | ((uint8_t)s[2] & 0x3F);
    }
    if (b0 < 0xF8) {
        if (len < 4 || !is_cont(s, 1) || !is_cont(s, 2) || !is_cont(s, 3)) return MOEX_UNICODE_REPLACEMENT;
        uint32_t cp = ((uint32_t)(b0 & 0x07) << 18) | ((uint32_t)((uint8_t)s[1] & 0x3F) << 12) |
                      ((uint32_t)((uint8_t)s[2] & 0x3F) << 6) | ((uint8_t)s[3] & 0x3F);
        /* Beyond U+10FFFF llama.cpp would throw while re-encoding: treat as invalid. */
        if (cp >= MOEX_UNICODE_MAX) return MOEX_UNICODE_REPLACEMENT;
        *adv = 4;
        return cp;
    }
    return MOEX_UNICODE_REPLACEMENT;
}

size_t moex_utf8_valid_len(const char *s, size_t len) {
    const uint8_t *u = (const uint8_t *)s;
    if (!len) return 0;
    if (u[0] < 0x80) return 1;
    size_t n;
    uint32_t min;
    if (u[0] >= 0xC2 && u[0] <= 0xDF) n = 2, min = 0x80;
    else if (u[0] >= 0xE0 && u[0] <= 0xEF) n = 3, min = 0x800;
    else if (u[0] >= 0xF0 && u[0] <= 0xF4) n = 4, min = 0x10000;
    else return 0;
    if (len < n) return 0;
    uint32_t cp = u[0] & (0x7Fu >> n);
    for (size_t i = 1; i < n; i++) {
        if (!is_cont(s, i)) return 0;
        cp = cp << 6 | (u[i] & 0x3Fu);
    }
    if (cp < min || cp >= MOEX_UNICODE_MAX || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

size_t moex_utf8_sanitize(const char *s, size_t len, char *out, size_t cap) {
    size_t o = 0, i = 0;
    while (i < len) {
        size_t n = moex_utf8_valid_len(s + i, len - i);
        const bool control = n == 1 && ((uint8_t)s[i] < 0x20 || s[i] == 0x7F);
        const char *src = s + i;
        if (!n || control) src = "?", n = 1;
        if (o + n + 1 > cap) break;
        memcpy(out + o, src, n);
        o += n;
        i += src == s + i ? n : 1;
    }
    out[o] = 0;
    return o;
}

int moex_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | ((cp >> 18) & 0x07));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Bytes that are printable Latin-1 stand for themselves; the other 68
 * (0x00-0x20, 0x7F-0xA0, 0xAD) take U+0100.. in byte order. */
static int gpt2_is_self(uint32_t b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t moex_gpt2_byte_to_cp(uint8_t byte) {
    if (gpt2_is_self(byte)) return byte;
    if (byte <= 0x20) return 256u + byte;               /* n = 0..32 */
    if (byte >= 0x7F && byte <= 0xA0) return 256u + 33u + (byte - 0x7Fu);  /* n = 33..66 */
    return 256u + 67u;                                  /* 0xAD */
}

int moex_gpt2_cp_to_byte(uint32_t cp) {
    if (cp < 256) return gpt2_is_self(cp) ? (int)cp : -1;
    if (cp <= 256 + 32) return (int)(cp - 256);
    if (cp <= 256 + 66) return (int)(0x7F + (cp - 256 - 33));
    if (cp == 256 + 67) return 0xAD;
    return -1;
}
