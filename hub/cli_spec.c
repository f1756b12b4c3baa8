/* Speculative decoding's drafters for both commands (cli.h): --lookup needs
 * nothing; --draft-model is loaded, checked to share the model's vocabulary
 * and opened on this process's backend with every expert here (a draft runs
 * on the hub, never on the workers), one KV slot per sequence that drafts. */
#include <string.h>

#include "hub/cli.h"

/* Whether two tokenizers give the same pieces (a draft model must propose ids that mean what the model reads). */
static bool same_vocab(const moex_model *a, const moex_model *b) {
    if (a->hp.n_vocab != b->hp.n_vocab || !a->tok != !b->tok) return false;
    if (!a->tok) return true;
    for (int32_t id = 0; id < a->hp.n_vocab; id += 1 + a->hp.n_vocab / 997) {
        char pa[64], pb[64];
        const int na = moex_token_to_piece(a->tok, id, true, pa, sizeof pa),
                  nb = moex_token_to_piece(b->tok, id, true, pb, sizeof pb);
        if (na != nb || (na > 0 && na <= (int)sizeof pa && memcmp(pa, pb, (size_t)na))) return false;
    }
    return true;
}

int hub_cli_drafts_open(hub_cli_drafts *d, const hub_cli_engine *e, const char *prog, const moex_model *m,
                        moex_pool *pool, int64_t n_ctx, int n_seq) {
    *d = (hub_cli_drafts){.e = e};
    if (!e->draft_model) return 0;
    moex_error err = {0};
    if (!(d->dm = moex_model_load(e->draft_model, &err))) {
        fprintf(stderr, "%s: cannot load the draft model %s: %s\n", prog, e->draft_model, err.msg);
        return -1;
    }
    if (!same_vocab(m, d->dm)) {
        fprintf(stderr, "%s: the draft model %s has another vocabulary (%d tokens, the model %d): a draft model must "
                        "share the model's tokenizer\n", prog, e->draft_model, d->dm->hp.n_vocab, m->hp.n_vocab);
        return -1;
    }
    moex_engine_options eo = hub_cli_engine_options(e, pool, NULL, n_ctx, 64);
    eo.n_seq = n_seq;
    eo.batched = n_seq > 1;
    if (moex_engine_open(d->dm, &eo, &d->deng, &err)) {
        fprintf(stderr, "%s: the draft model: %s\n", prog, err.msg);
        return -1;
    }
    moex_log(MOEX_LOG_INFO, "draft model %s: %d layers, %d slot(s), on %s", e->draft_model, d->dm->hp.n_layer, n_seq,
             moex_engine_backend_name(&d->deng));
    return 0;
}

moex_drafter *hub_cli_drafter(hub_cli_drafts *d, int slot, const moex_sampler_params *sp) {
    /* before a draft model, a lookup of 2 or 3 tokens only: one token's next occurrence guesses worse than it */
    moex_drafter *lookup = d->e->lookup ? moex_drafter_lookup(d->dm ? 2 : 1, 3) : NULL;
    if (d->e->lookup && !lookup) return NULL;
    if (!d->dm) return lookup;
    moex_drafter *model = moex_drafter_model(d->dm, &d->deng, slot, sp);
    if (!model) {
        moex_drafter_free(lookup);
        return NULL;
    }
    return lookup ? moex_drafter_chain(lookup, model) : model;
}

void hub_cli_drafts_close(hub_cli_drafts *d) {
    moex_engine_close(&d->deng);
    moex_model_free(d->dm);
    d->dm = NULL;
}
