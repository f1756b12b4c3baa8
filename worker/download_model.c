/* The hub's GET /v1/model (hub/http_weights.c) turned into a model skeleton:
 * the shape the session needs and, per expert, its three matrices' types and
 * shapes, so that a downloaded file only has to be pointed at. The JSON comes
 * over the network: every field is checked, and the matrices must fit the
 * shapes the expert kernels assume. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "worker/download_internal.h"

#define MAX_DIM (1 << 20)

/* A whole number in [lo, hi] under key, or -1 with err. */
static int get_int(const cJSON *o, const char *key, int64_t lo, int64_t hi, int64_t *out, const char *where,
                   moex_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo ||
        v->valuedouble > (double)hi)
        return moex_fail(err, "/v1/model: %s%s\"%s\" is missing or not an integer in [%lld, %lld]", where,
                         *where ? ": " : "", key, (long long)lo, (long long)hi);
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* {"type": "q4_K", "rows": R, "cols": C, "bytes": B} with the expected shape. */
static int parse_matrix(const cJSON *o, const char *name, int64_t rows, int64_t cols, moex_matrix *m, const char *where,
                        moex_error *err) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(o, name);
    char at[96];
    snprintf(at, sizeof at, "%s, %s", where, name);
    if (!cJSON_IsObject(j)) return moex_fail(err, "/v1/model: %s: missing", at);
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "type");
    const int type = cJSON_IsString(t) ? moex_type_from_name(t->valuestring) : -1;
    const moex_type_traits *tt = type >= 0 ? moex_type_get(type) : NULL;
    if (!tt || !tt->is_weight_type)
        return moex_fail(err, "/v1/model: %s: type %s is not a weight type this worker knows", at,
                         cJSON_IsString(t) ? t->valuestring : "(missing)");
    int64_t r = 0, c = 0, bytes = 0;
    if (get_int(j, "rows", 1, MAX_DIM, &r, at, err) || get_int(j, "cols", 1, MAX_DIM, &c, at, err) ||
        get_int(j, "bytes", 1, INT64_C(1) << 50, &bytes, at, err))
        return -1;
    if (r != rows || c != cols)
        return moex_fail(err, "/v1/model: %s is %lld x %lld, expected %lld x %lld", at, (long long)r, (long long)c,
                         (long long)rows, (long long)cols);
    const size_t row_bytes = moex_row_bytes((moex_type)type, c);
    if (!row_bytes || (int64_t)row_bytes * r != bytes)
        return moex_fail(err, "/v1/model: %s: %lld bytes do not match %lld rows of %lld %s values", at,
                         (long long)bytes, (long long)r, (long long)c, tt->name);
    *m = (moex_matrix){.type = (moex_type)type, .rows = r, .cols = c, .row_bytes = row_bytes, .data = NULL};
    return 0;
}

static size_t bytes_of(const moex_expert_weights *w) {
    return (size_t)w->gate.rows * w->gate.row_bytes + (size_t)w->up.rows * w->up.row_bytes +
           (size_t)w->down.rows * w->down.row_bytes;
}

/* gate, up, down and expert_bytes of a layer or of one of its experts. */
static int parse_expert(const cJSON *o, const moex_hparams *hp, moex_expert_weights *w, const char *where,
                        moex_error *err) {
    int64_t total = 0;
    if (parse_matrix(o, "gate", hp->n_ff_exp, hp->n_embd, &w->gate, where, err) ||
        parse_matrix(o, "up", hp->n_ff_exp, hp->n_embd, &w->up, where, err) ||
        parse_matrix(o, "down", hp->n_embd, hp->n_ff_exp, &w->down, where, err) ||
        get_int(o, "expert_bytes", 1, INT64_C(1) << 52, &total, where, err))
        return -1;
    if ((size_t)total != bytes_of(w))
        return moex_fail(err, "/v1/model: %s: expert_bytes %lld is not the sum of its matrices (%zu)", where,
                         (long long)total, bytes_of(w));
    return 0;
}

static int parse_layer(dl_model *dm, const cJSON *jl, int l, moex_error *err) {
    const moex_hparams *hp = &dm->m.hp;
    char where[48];
    snprintf(where, sizeof where, "layer %d", l);
    if (!cJSON_IsObject(jl)) return moex_fail(err, "/v1/model: %s is not an object", where);
    moex_expert_weights common;
    if (parse_expert(jl, hp, &common, where, err)) return -1;
    moex_layer *L = &dm->m.layers[l];
    const cJSON *per = cJSON_GetObjectItemCaseSensitive(jl, "experts");
    if (per && (!cJSON_IsArray(per) || cJSON_GetArraySize(per) != hp->n_expert))
        return moex_fail(err, "/v1/model: %s: \"experts\" must list all %d experts", where, hp->n_expert);
    for (int e = 0; e < hp->n_expert; e++) {
        L->experts[e] = common;
        if (per) {
            snprintf(where, sizeof where, "layer %d expert %d", l, e);
            if (parse_expert(cJSON_GetArrayItem(per, e), hp, &L->experts[e], where, err)) return -1;
        }
        dm->expert_bytes[(size_t)l * hp->n_expert + e] = bytes_of(&L->experts[e]);
    }
    return 0;
}

static int parse_hash(const cJSON *root, uint64_t *hash, moex_error *err) {
    const cJSON *h = cJSON_GetObjectItemCaseSensitive(root, "model_hash");
    char *end = NULL;
    if (cJSON_IsString(h) && strlen(h->valuestring) == 16) *hash = strtoull(h->valuestring, &end, 16);
    if (!end || *end) return moex_fail(err, "/v1/model: \"model_hash\" is missing or not 16 hex digits");
    return 0;
}

int dl_model_hash(const char *json, size_t len, uint64_t *hash, moex_error *err) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    const int rc = cJSON_IsObject(root) ? parse_hash(root, hash, err)
                                        : moex_fail(err, "/v1/model: the hub's answer is not a JSON object");
    cJSON_Delete(root);
    return rc;
}

static int parse_identity(dl_model *dm, const cJSON *root, moex_error *err) {
    if (parse_hash(root, &dm->model_hash, err)) return -1;
    snprintf(dm->hash_hex, sizeof dm->hash_hex, "%016llx", (unsigned long long)dm->model_hash);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "arch");
    if (!cJSON_IsString(a) || !a->valuestring[0] || strlen(a->valuestring) >= sizeof dm->m.hp.arch_name)
        return moex_fail(err, "/v1/model: \"arch\" is missing or too long");
    snprintf(dm->m.hp.arch_name, sizeof dm->m.hp.arch_name, "%s", a->valuestring);
    return 0;
}

static int parse_shape(dl_model *dm, const cJSON *root, moex_error *err) {
    moex_hparams *hp = &dm->m.hp;
    int64_t nl = 0, ne = 0, nu = 0, d = 0, f = 0;
    if (get_int(root, "n_layers", 1, 65535, &nl, "", err) || get_int(root, "n_experts", 1, 65535, &ne, "", err) ||
        get_int(root, "n_expert_used", 1, ne, &nu, "", err) || get_int(root, "n_embd", 1, 65535, &d, "", err) ||
        get_int(root, "n_ff_exp", 1, MAX_DIM, &f, "", err))
        return -1;
    hp->n_layer = (int32_t)nl;
    hp->n_expert = (int32_t)ne;
    hp->n_expert_used = (int32_t)nu;
    hp->n_embd = (int32_t)d;
    hp->n_ff_exp = (int32_t)f;
    return 0;
}

static int alloc_layers(dl_model *dm, moex_error *err) {
    const moex_hparams *hp = &dm->m.hp;
    dm->m.layers = calloc((size_t)hp->n_layer, sizeof *dm->m.layers);
    dm->expert_bytes = calloc((size_t)hp->n_layer * (size_t)hp->n_expert, sizeof *dm->expert_bytes);
    if (!dm->m.layers || !dm->expert_bytes) return moex_fail(err, "out of memory");
    for (int l = 0; l < hp->n_layer; l++)
        if (!(dm->m.layers[l].experts = calloc((size_t)hp->n_expert, sizeof *dm->m.layers[l].experts)))
            return moex_fail(err, "out of memory");
    return 0;
}

int dl_model_parse(dl_model *dm, const char *json, size_t len, moex_error *err) {
    memset(dm, 0, sizeof *dm);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return moex_fail(err, "/v1/model: the hub's answer is not a JSON object");
    }
    int rc = parse_identity(dm, root, err) || parse_shape(dm, root, err) || alloc_layers(dm, err) ? -1 : 0;
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(root, "layers");
    if (!rc && (!cJSON_IsArray(layers) || cJSON_GetArraySize(layers) != dm->m.hp.n_layer))
        rc = moex_fail(err, "/v1/model: \"layers\" must list all %d layers", dm->m.hp.n_layer);
    for (int l = 0; !rc && l < dm->m.hp.n_layer; l++) rc = parse_layer(dm, cJSON_GetArrayItem(layers, l), l, err);
    cJSON_Delete(root);
    if (rc) dl_model_free(dm);
    return rc;
}

void dl_model_free(dl_model *dm) {
    if (dm->m.layers)
        for (int l = 0; l < dm->m.hp.n_layer; l++) free(dm->m.layers[l].experts);
    free(dm->m.layers);
    free(dm->expert_bytes);
    memset(dm, 0, sizeof *dm);
}
