/* Constrained sampling: a GBNF grammar (the notation llama.cpp writes:
 * rules, literals, character classes, groups, alternatives, * + ? {m,n})
 * parsed once, a matcher per sequence that says which tokens may come next,
 * and JSON schemas compiled to GBNF (response_format json_schema, tool calls).
 * Private to the serve module.
 *
 * Threads: a grammar and a vocabulary never change once made; share them. A
 * state belongs to one sequence: allows and mask take it const but fill its
 * private caches, so one thread at a time per state.
 *
 * A sampler, per step of a constrained sequence:
 *   pick a token from the logits as usual;
 *   if (!serve_grammar_allows(st, voc, pick)) {          about 0.1-1 us
 *       serve_grammar_mask(st, voc, allowed);            0.01-1 ms on 152k tokens
 *       set the logits of tokens with allowed[i] == 0 to -inf and pick again
 *       (0 allowed: the grammar is stuck; end the sequence with an error) }
 *   serve_grammar_accept(st, voc, pick, &err);           before the next step
 * and the sequence ends on an EOG token (allowed only where the grammar may
 * end) or when serve_grammar_must_end says nothing else fits. */
#ifndef MOEX_SERVE_GRAMMAR_H
#define MOEX_SERVE_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/error.h"

typedef struct serve_grammar serve_grammar;          /* parsed rules: immutable, shareable */
typedef struct serve_grammar_vocab serve_grammar_vocab; /* every token's bytes, indexed for matching; one per model */
typedef struct serve_grammar_state serve_grammar_state; /* one sequence's position in the grammar */

/* Parses GBNF text; `root` names the start rule (NULL: "root"). NULL with err
 * ("line 3, column 7: expected ::=", "rule 'value' is used but not defined",
 * left recursion) on a bad grammar. */
serve_grammar *serve_grammar_parse(const char *gbnf, const char *root, moex_error *err);
void serve_grammar_free(serve_grammar *g);
/* The bytes of caches each matcher made from g from now on may hold before it rebuilds them (0: the default,
 * 64 MiB): memory stays bounded whatever the grammar. Set before sharing g (tests make it tiny). */
void serve_grammar_set_cache_budget(serve_grammar *g, size_t bytes);

/* The vocabulary: token i's text is bytes[i] (len[i] bytes, may be 0: such a
 * token is never allowed), eog[i] true for end-of-generation tokens (allowed
 * exactly when the grammar may end). The arrays are copied. */
serve_grammar_vocab *serve_grammar_vocab_create(int32_t n_vocab, const char *const *bytes, const uint32_t *len,
                                                const bool *eog, moex_error *err);
void serve_grammar_vocab_free(serve_grammar_vocab *v);

/* A matcher at the grammar's start. Memory stays bounded (an ambiguous grammar
 * fails with err instead of growing without end; the caches are rebuilt past
 * 64 MiB). A clone is at the same place with caches of its own (empty). */
serve_grammar_state *serve_grammar_state_create(const serve_grammar *g, moex_error *err);
serve_grammar_state *serve_grammar_state_clone(const serve_grammar_state *s, moex_error *err);
void serve_grammar_state_free(serve_grammar_state *s);

/* Whether token id may come next (a cheap check of one token: a sampler tries
 * its pick first and masks the whole vocabulary only when the pick is refused).
 * A token that stops inside a UTF-8 character is allowed when some completion
 * of the character fits; invalid UTF-8 never is. */
bool serve_grammar_allows(const serve_grammar_state *s, const serve_grammar_vocab *v, int32_t id);
/* Every token that may come next: allowed[i] = 1 or 0 for i in [0, n_vocab).
 * Returns the number allowed (0: the grammar is stuck: nothing, not even EOG,
 * fits; or the state is past its memory bound, which accept then reports).
 * allowed[i] == serve_grammar_allows(s, v, i) for every i. */
int32_t serve_grammar_mask(const serve_grammar_state *s, const serve_grammar_vocab *v, uint8_t *allowed);
/* Advances past token id. -1 with err when the grammar does not allow it
 * (the state is then unchanged). An EOG token is accepted when the grammar may end. */
int serve_grammar_accept(serve_grammar_state *s, const serve_grammar_vocab *v, int32_t id, moex_error *err);
/* True when the text so far is a whole sentence of the grammar (it may end here). */
bool serve_grammar_can_end(const serve_grammar_state *s);
/* True when nothing but the end may follow (a sampler stops the sequence).
 * Grammars from serve_json_schema_gbnf allow a few trailing blanks, so they
 * rarely must end: such a sequence ends on EOG. */
bool serve_grammar_must_end(const serve_grammar_state *s);

/* GBNF for the JSON values a JSON schema allows (type, properties, required,
 * additionalProperties, items, prefixItems, minItems/maxItems, enum, const,
 * anyOf/oneOf/allOf, $ref to $defs/definitions, string formats and
 * minLength/maxLength, pattern where it can, integer/number). Its first rule
 * is named `name`; helper rules are named `name`-... so several schemas can
 * share one grammar. Objects put properties in the schema's order, required
 * ones always, optional ones allowed. The empty schema {} (and a NULL schema)
 * means any JSON value. Returns malloc'd text, or NULL with err naming the
 * unsupported keyword and where it is ("properties.age: 'if' is not supported").
 * Never looser than the schema; stricter on purpose in places: properties in
 * the schema's order, no properties beyond the listed ones unless
 * additionalProperties allows them (absent: none when properties are listed;
 * their keys are spelled without escapes and are none of the listed names),
 * const/enum values in their compact spelling, pattern characters in their
 * plain JSON spelling, whitespace between tokens bounded (a model must not be
 * able to emit blanks forever), numbers of at most 20 digits. oneOf is taken
 * as anyOf (exclusivity is not checked). */
char *serve_json_schema_gbnf(const cJSON *schema, const char *name, moex_error *err);

#endif
