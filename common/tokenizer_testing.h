/* Test hooks into the tokenizer, for tests/common/test_tokenizer.c (not part
 * of the common module's API, common/common.h): the pre-tokenizer's word
 * boundaries, which the API only shows through the token ids they produce. */
#ifndef MOEX_TOKENIZER_TESTING_H
#define MOEX_TOKENIZER_TESTING_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Splits UTF-8 text into the words BPE merges within, with the pre-tokenizer
 * that tokenizer.ggml.pre names (e.g. "default", "llama3", "qwen2", "gpt-2");
 * invalid bytes count as one code point each (U+FFFD), as when encoding.
 * Writes the end of each word, counted in code points, to ends[0..cap) and
 * returns the number of words (which may exceed cap), or -1 with err. */
int64_t moex_tokenizer_split_words(const char *pre, const char *text, size_t len, int32_t *ends, size_t cap,
                                   moex_error *err);

#endif
