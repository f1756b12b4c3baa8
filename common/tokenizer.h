/* Tokenizer built from GGUF metadata (tokenizer.ggml.*): byte-level BPE
 * ("gpt2" model; pre-tokenizers qwen2, llama-bpe, gpt-2, gpt-4o, default) and SentencePiece
 * ("llama" model). Part of the common module's API (common/common.h). */
#ifndef MOEX_TOKENIZER_H
#define MOEX_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/error.h"
#include "common/gguf.h"

typedef struct moex_tokenizer moex_tokenizer;

/* Builds the tokenizer; copies what it needs, so g may be closed afterwards. */
moex_tokenizer *moex_tokenizer_load(const moex_gguf *g, moex_error *err);
void moex_tokenizer_free(moex_tokenizer *tok);

int32_t moex_tokenizer_n_vocab(const moex_tokenizer *tok);
int32_t moex_tokenizer_bos(const moex_tokenizer *tok);   /* -1 if none */
int32_t moex_tokenizer_eos(const moex_tokenizer *tok);   /* -1 if none */
/* Whether moex_tokenize(add_bos = true) prepends BOS (tokenizer.ggml.add_bos_token). */
bool moex_tokenizer_adds_bos(const moex_tokenizer *tok);
/* True for end-of-generation tokens (eos, eot, eom, im_end, ...). */
bool moex_tokenizer_is_eog(const moex_tokenizer *tok, int32_t id);

/* Encodes text[0..len). add_bos: prepend BOS when the vocab asks for it
 * (tokenizer.ggml.add_bos_token). parse_special: text like "<|im_end|>" maps
 * to its special token instead of being spelled out.
 * Returns the number of tokens; when it exceeds cap, nothing beyond cap is
 * written and the caller retries with a larger buffer. -1 on error. */
int64_t moex_tokenize(const moex_tokenizer *tok, const char *text, size_t len, bool add_bos,
                      bool parse_special, int32_t *out, int64_t cap, moex_error *err);

/* The bytes token id stands for, as they appear in decoded text (byte tokens
 * become their byte; SPM's U+2581 becomes a space; control tokens are empty
 * unless render_special). Returns the length (may exceed cap: then retry), -1 for a bad id. */
int moex_token_to_piece(const moex_tokenizer *tok, int32_t id, bool render_special, char *buf, int cap);

/* Decodes ids into text; same size contract as moex_tokenize. SPM's leading
 * space of the first piece is removed, as llama.cpp does. */
int64_t moex_detokenize(const moex_tokenizer *tok, const int32_t *ids, int64_t n, bool render_special,
                        char *buf, int64_t cap, moex_error *err);

#endif
