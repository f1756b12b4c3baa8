/* The expert store of a worker without its own copy of the model: experts
 * come from the hub over HTTP (hub/http_weights.c) into a cache directory,
 *
 *   <cache-dir>/<model_hash>/L-E.part   being downloaded (resumed with a Range request)
 *   <cache-dir>/<model_hash>/L-E.bin    complete, its XXH3 equal to the hub's X-MoEx-Hash
 *
 * and are used straight from read-only mappings of those files. A cached
 * file is checked against the hub's hash once per process (a 1-byte range
 * request brings the hash) before it is used. Files of experts no longer
 * assigned stay until the cache outgrows the memory budget; then the least
 * recently assigned go first. A lock file keeps two workers out of one
 * directory. Runs on the compute thread (fetch, trim) after open. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>

#include "worker/download_internal.h"

#define MODEL_JSON_MAX (64u << 20)
#define NET_ATTEMPTS 5          /* tries of one request when the network fails */
#define BACKOFF_MIN_S 0.2
#define BACKOFF_MAX_S 5.0
#define MIB (1024.0 * 1024.0)

typedef struct entry {
    uint8_t *map;          /* the mapped L-E.bin while it is in use */
    uint64_t disk_bytes;   /* size of its .bin or .part */
    bool bin, part;        /* which file is on disk */
    bool verified;         /* the .bin's hash equals the hub's (checked by this process) */
    bool listed;           /* in the assignment being applied */
    double recency;        /* when last assigned (wall clock), from the file's mtime at start */
} entry;

struct moex_worker_store {
    dl_http *http;
    dl_model dm;
    char dir[4096];
    int dir_fd, lock_fd;
    uint64_t budget;
    entry *e;              /* n_layers x n_experts */
    /* the fetch in progress */
    bool (*stop)(void *);
    void *stop_ctx;
    dl_progress progress;
};

/* ---- small helpers ---- */

static entry *entry_at(moex_worker_store *st, int l, int e) {
    return &st->e[(size_t)l * (size_t)st->dm.m.hp.n_expert + (size_t)e];
}

static size_t expected_bytes(const moex_worker_store *st, int l, int e) {
    return st->dm.expert_bytes[(size_t)l * (size_t)st->dm.m.hp.n_expert + (size_t)e];
}

static void file_name(char *buf, size_t cap, int l, int e, const char *ext) { snprintf(buf, cap, "%d-%d.%s", l, e, ext); }

static double wall_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static bool stopped(moex_worker_store *st) { return st->stop && st->stop(st->stop_ctx); }

/* Sleeps s seconds in 100 ms steps; true when stopped meanwhile. */
static bool sleep_unless_stopped(moex_worker_store *st, double s) {
    const struct timespec step = {0, 100 * 1000 * 1000};
    for (double t = 0; t < s; t += 0.1) {
        if (stopped(st)) return true;
        nanosleep(&step, NULL);
    }
    return stopped(st);
}

static uint64_t hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }

/* Maps a cache file read-only; NULL with err when it cannot. */
static uint8_t *map_file(moex_worker_store *st, const char *name, size_t bytes, moex_error *err) {
    int fd = openat(st->dir_fd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        moex_fail(err, "cannot open %s/%s: %s", st->dir, name, strerror(errno));
        return NULL;
    }
    void *p = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        moex_fail(err, "cannot map %s/%s: %s", st->dir, name, strerror(errno));
        return NULL;
    }
    return p;
}

static void remove_file(moex_worker_store *st, int l, int e, const char *ext) {
    char name[64];
    file_name(name, sizeof name, l, e, ext);
    if (unlinkat(st->dir_fd, name, 0) && errno != ENOENT)
        moex_log(MOEX_LOG_WARN, "worker: cannot remove %s/%s: %s", st->dir, name, strerror(errno));
}

/* Points the expert's matrices into its mapping (NULL: unbinds). */
static void bind_expert(moex_worker_store *st, int l, int e, const uint8_t *base) {
    moex_expert_weights *w = &st->dm.m.layers[l].experts[e];
    const size_t g = (size_t)w->gate.rows * w->gate.row_bytes, u = (size_t)w->up.rows * w->up.row_bytes;
    w->gate.data = base;
    w->up.data = base ? base + g : NULL;
    w->down.data = base ? base + g + u : NULL;
}

static void unmap_entry(moex_worker_store *st, int l, int e) {
    entry *x = entry_at(st, l, e);
    if (!x->map) return;
    bind_expert(st, l, e, NULL);
    munmap(x->map, expected_bytes(st, l, e));
    x->map = NULL;
}

/* ---- the cache directory ---- */

static int make_dirs(char *path, moex_error *err) {
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        const int rc = mkdir(path, 0755);
        *p = '/';
        if (rc && errno != EEXIST) return moex_fail(err, "cannot create %s: %s", path, strerror(errno));
    }
    if (mkdir(path, 0755) && errno != EEXIST) return moex_fail(err, "cannot create %s: %s", path, strerror(errno));
    return 0;
}

/* --cache-dir, else $XDG_CACHE_HOME/moex, else ~/.cache/moex. */
static int cache_root(const moex_worker_options *o, char *buf, size_t cap, moex_error *err) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (o->cache_dir) n = snprintf(buf, cap, "%s", o->cache_dir);
    else if (xdg && *xdg) n = snprintf(buf, cap, "%s/moex", xdg);
    else if (home && *home) n = snprintf(buf, cap, "%s/.cache/moex", home);
    else return moex_fail(err, "no cache directory: set --cache-dir (neither XDG_CACHE_HOME nor HOME is set)");
    if (n <= 0 || (size_t)n >= cap - 32) return moex_fail(err, "--cache-dir: path too long");
    return 0;
}

static int open_cache(moex_worker_store *st, const moex_worker_options *o, moex_error *err) {
    char root[sizeof st->dir - 32];
    if (cache_root(o, root, sizeof root, err)) return -1;
    snprintf(st->dir, sizeof st->dir, "%s/%s", root, st->dm.hash_hex);
    if (make_dirs(st->dir, err)) return -1;
    if ((st->dir_fd = open(st->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return moex_fail(err, "cannot open %s: %s", st->dir, strerror(errno));
    if ((st->lock_fd = openat(st->dir_fd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0644)) < 0)
        return moex_fail(err, "cannot create %s/lock: %s", st->dir, strerror(errno));
    if (flock(st->lock_fd, LOCK_EX | LOCK_NB))
        return moex_fail(err, "cache directory %s is in use by another worker; give each worker its own --cache-dir",
                         st->dir);
    return 0;
}

/* "L-E.bin" / "L-E.part" with ids in range -> the entry and whether it is a .bin. */
static entry *parse_cache_name(moex_worker_store *st, const char *name, bool *is_bin, int *lo, int *eo) {
    int l, e, n = 0;
    char ext[8] = "";
    if (sscanf(name, "%d-%d.%7[a-z]%n", &l, &e, ext, &n) != 3 || name[n] || l < 0 || e < 0 ||
        l >= st->dm.m.hp.n_layer || e >= st->dm.m.hp.n_expert)
        return NULL;
    char canon[64];
    file_name(canon, sizeof canon, l, e, ext);
    if (strcmp(canon, name) || (strcmp(ext, "bin") && strcmp(ext, "part"))) return NULL;
    *is_bin = !strcmp(ext, "bin");
    *lo = l, *eo = e;
    return entry_at(st, l, e);
}

/* What a previous run left: complete files and partial downloads. */
static void scan_cache(moex_worker_store *st) {
    DIR *d = fdopendir(dup(st->dir_fd));
    if (!d) return;
    int n_bin = 0, n_part = 0;
    for (struct dirent *de; (de = readdir(d));) {
        bool is_bin;
        int l, e;
        entry *x = parse_cache_name(st, de->d_name, &is_bin, &l, &e);
        struct stat sb;
        if (!x || fstatat(st->dir_fd, de->d_name, &sb, 0) || !S_ISREG(sb.st_mode)) continue;
        if (is_bin && x->part) remove_file(st, l, e, "part"), x->part = false; /* the .bin wins */
        if (!is_bin && x->bin) {
            remove_file(st, l, e, "part");
            continue;
        }
        x->bin = is_bin;
        x->part = !is_bin;
        x->disk_bytes = (uint64_t)sb.st_size;
        x->recency = (double)sb.st_mtim.tv_sec + sb.st_mtim.tv_nsec * 1e-9;
        is_bin ? n_bin++ : n_part++;
    }
    closedir(d);
    if (n_bin || n_part)
        moex_log(MOEX_LOG_INFO, "worker: cache %s: %d experts, %d partial downloads", st->dir, n_bin, n_part);
}

/* ---- requests with retries ---- */

typedef int (*request_fn)(moex_worker_store *st, int l, int e, moex_error *err);

/* Runs fn, retrying with backoff while the network fails. 0, 1 (stopped),
 * 2 (the network kept failing) or -1. */
static int with_retries(moex_worker_store *st, request_fn fn, int l, int e, moex_error *err) {
    double backoff = BACKOFF_MIN_S;
    for (int attempt = 1;; attempt++) {
        const int rc = fn(st, l, e, err);
        if (rc == DL_OK) return 0;
        if (rc == DL_STOPPED) return 1;
        if (rc != DL_NETWORK) return -1;
        if (attempt == NET_ATTEMPTS) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            moex_fail(err, "expert (%d, %d): %d attempts failed; last: %s", l, e, attempt, why);
            return 2;
        }
        moex_log(MOEX_LOG_WARN, "worker: expert (%d, %d): %s; retrying in %.1f s", l, e, err->msg, backoff);
        if (sleep_unless_stopped(st, backoff)) return 1;
        backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : backoff * 2;
    }
}

static int http_status_error(const dl_response *r, const char *path, moex_error *err) {
    size_t n = strlen(r->text);
    while (n && (r->text[n - 1] == '\n' || r->text[n - 1] == '\r')) n--;
    return moex_fail(err, "GET %s: HTTP %d%s%.*s", path, r->status, n ? ": " : "", (int)n, r->text);
}

/* ---- checking a cached file against the hub ---- */

static bool fetch_stop(void *ctx) { return stopped(ctx); }

/* The hub's hash of an expert: a 1-byte range brings the header. */
static int probe_hash(moex_worker_store *st, int l, int e, uint64_t *hash, moex_error *err) {
    char path[64];
    snprintf(path, sizeof path, "/v1/expert/%d/%d", l, e);
    dl_request req = {.path = path, .range_first = 0, .range_last = 0, .stop = fetch_stop, .ctx = st};
    dl_response r;
    const int rc = dl_http_get(st->http, &req, &r, err);
    if (rc) return rc;
    if (r.status >= 300) return http_status_error(&r, path, err); /* DL_FAILED */
    if (!r.has_hash) return moex_fail(err, "GET %s: no X-MoEx-Hash header", path);
    *hash = r.hash;
    return DL_OK;
}

/* A cached .bin: used when it has the right size and the hub's hash, else removed. */
static int verify_cached(moex_worker_store *st, int l, int e, moex_error *err) {
    entry *x = entry_at(st, l, e);
    const size_t bytes = expected_bytes(st, l, e);
    if (x->disk_bytes != bytes) {
        moex_log(MOEX_LOG_WARN, "worker: cached expert (%d, %d) has %llu bytes, not %zu: downloading it again", l, e,
                 (unsigned long long)x->disk_bytes, bytes);
        remove_file(st, l, e, "bin");
        x->bin = false;
        return DL_OK;
    }
    uint64_t hub_hash = 0;
    const int rc = probe_hash(st, l, e, &hub_hash, err);
    if (rc) return rc;
    char name[64];
    file_name(name, sizeof name, l, e, "bin");
    uint8_t *p = map_file(st, name, bytes, err);
    if (!p) return DL_FAILED;
    const uint64_t local = hash_bytes(p, bytes);
    if (local == hub_hash) {
        x->map = p;
        x->verified = true;
        return DL_OK;
    }
    munmap(p, bytes);
    moex_log(MOEX_LOG_WARN, "worker: cached expert (%d, %d) does not match the hub's (%016llx, hub %016llx): downloading it again",
             l, e, (unsigned long long)local, (unsigned long long)hub_hash);
    remove_file(st, l, e, "bin");
    x->bin = false;
    return DL_OK;
}

/* ---- downloading one expert ---- */

typedef struct transfer {
    moex_worker_store *st;
    int fd;
    const char *path;
    uint64_t from, bytes, written;
    uint64_t hub_hash;
} transfer;

static int on_expert_head(void *ctx, const dl_response *r, moex_error *err) {
    transfer *t = ctx;
    if (r->status == 200 && t->from > 0) { /* the range was ignored: start over */
        if (ftruncate(t->fd, 0)) return moex_fail(err, "cannot truncate %s: %s", t->path, strerror(errno));
        dl_progress_grow(&t->st->progress, t->from);
        t->from = 0;
    } else if (r->status == 206) {
        if (r->range_first != (int64_t)t->from || r->range_total != (int64_t)t->bytes)
            return moex_fail(err, "GET %s: the hub sent range %lld of %lld bytes, asked for %llu of %llu", t->path,
                             (long long)r->range_first, (long long)r->range_total, (unsigned long long)t->from,
                             (unsigned long long)t->bytes);
    } else if (r->status != 200) {
        return moex_fail(err, "GET %s: unexpected HTTP %d", t->path, r->status);
    }
    if (r->content_length != (int64_t)(t->bytes - t->from))
        return moex_fail(err, "GET %s: %lld bytes announced, expected %llu", t->path, (long long)r->content_length,
                         (unsigned long long)(t->bytes - t->from));
    if (!r->has_hash) return moex_fail(err, "GET %s: no X-MoEx-Hash header", t->path);
    t->hub_hash = r->hash;
    return 0;
}

static int on_expert_body(void *ctx, const void *data, size_t len, moex_error *err) {
    transfer *t = ctx;
    if (t->from + t->written + len > t->bytes) return moex_fail(err, "GET %s: more bytes than announced", t->path);
    for (const uint8_t *p = data; len;) {
        const ssize_t n = write(t->fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return moex_fail(err, "cannot write %s/%s: %s", t->st->dir, t->path, strerror(errno));
        p += n, len -= (size_t)n, t->written += (uint64_t)n;
        dl_progress_add(&t->st->progress, (uint64_t)n);
    }
    return 0;
}

/* One GET into L-E.part, from where the file ends. DL_OK when complete. */
static int transfer_part(moex_worker_store *st, int l, int e, transfer *t, moex_error *err) {
    entry *x = entry_at(st, l, e);
    char name[64], path[64];
    file_name(name, sizeof name, l, e, "part");
    snprintf(path, sizeof path, "/v1/expert/%d/%d", l, e);
    *t = (transfer){.st = st, .path = path, .bytes = expected_bytes(st, l, e), .from = x->part ? x->disk_bytes : 0};
    if (t->from >= t->bytes) t->from = 0; /* too long to be a prefix: start over */
    t->fd = openat(st->dir_fd, name, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | (t->from ? 0 : O_TRUNC), 0644);
    if (t->fd < 0) return moex_fail(err, "cannot create %s/%s: %s", st->dir, name, strerror(errno));
    x->part = true;
    if (t->from)
        moex_log(MOEX_LOG_INFO, "worker: resuming expert (%d, %d) at byte %llu of %llu", l, e,
                 (unsigned long long)t->from, (unsigned long long)t->bytes);
    dl_request req = {.path = path, .range_first = t->from ? (int64_t)t->from : -1, .range_last = -1,
                      .on_head = on_expert_head, .on_body = on_expert_body, .stop = fetch_stop, .ctx = t};
    dl_response r;
    int rc = dl_http_get(st->http, &req, &r, err);
    struct stat sb;
    x->disk_bytes = fstat(t->fd, &sb) ? 0 : (uint64_t)sb.st_size;
    close(t->fd);
    if (rc == DL_OK && r.status >= 400) return http_status_error(&r, path, err);
    if (rc == DL_OK && x->disk_bytes != t->bytes) { /* cut short: resumable */
        moex_fail(err, "GET %s: %llu of %llu bytes", path, (unsigned long long)x->disk_bytes,
                  (unsigned long long)t->bytes);
        return DL_NETWORK;
    }
    return rc;
}

/* The complete .part against the hub's hash: renamed to .bin and mapped, or
 * removed. 1 when it did not match. */
static int finish_part(moex_worker_store *st, int l, int e, uint64_t hub_hash, uint64_t *got, moex_error *err) {
    entry *x = entry_at(st, l, e);
    const size_t bytes = expected_bytes(st, l, e);
    char part[64], bin[64];
    file_name(part, sizeof part, l, e, "part");
    file_name(bin, sizeof bin, l, e, "bin");
    uint8_t *p = map_file(st, part, bytes, err);
    if (!p) return -1;
    *got = hash_bytes(p, bytes);
    if (*got != hub_hash) {
        munmap(p, bytes);
        remove_file(st, l, e, "part");
        x->part = false;
        return 1;
    }
    if (renameat(st->dir_fd, part, st->dir_fd, bin)) {
        munmap(p, bytes);
        return moex_fail(err, "cannot rename %s/%s: %s", st->dir, part, strerror(errno));
    }
    x->part = false;
    x->bin = x->verified = true;
    x->map = p;
    return 0;
}

/* Downloads (or resumes) an expert and verifies it; a mismatch is downloaded
 * once more from scratch, then it is an error. */
static int download_expert(moex_worker_store *st, int l, int e, moex_error *err) {
    for (int fresh = 0;; fresh++) {
        transfer t;
        const int rc = transfer_part(st, l, e, &t, err);
        if (rc) return rc;
        uint64_t got;
        const int m = finish_part(st, l, e, t.hub_hash, &got, err);
        if (m <= 0) return m ? DL_FAILED : DL_OK;
        if (fresh == 1)
            return moex_fail(err, "expert (%d, %d): downloaded twice and the XXH3 differs from the hub's both times "
                             "(%016llx, hub %016llx): the data is corrupted on the way or the hub's file is changing",
                             l, e, (unsigned long long)got, (unsigned long long)t.hub_hash);
        moex_log(MOEX_LOG_WARN, "worker: expert (%d, %d): XXH3 %016llx differs from the hub's %016llx; downloading it again",
                 l, e, (unsigned long long)got, (unsigned long long)t.hub_hash);
        dl_progress_grow(&st->progress, expected_bytes(st, l, e));
    }
}

/* ---- assignments ---- */

static void mark_listed(moex_worker_store *st, const moex_proto_expert *list, uint32_t n) {
    const size_t total = (size_t)st->dm.m.hp.n_layer * (size_t)st->dm.m.hp.n_expert;
    for (size_t i = 0; i < total; i++) st->e[i].listed = false;
    for (uint32_t i = 0; i < n; i++)
        if (list[i].layer < st->dm.m.hp.n_layer && list[i].expert < st->dm.m.hp.n_expert)
            entry_at(st, list[i].layer, list[i].expert)->listed = true;
}

/* Assigned now: most recent for eviction, on disk too (the mtime) for the next run. */
static void touch_listed(moex_worker_store *st, const moex_proto_expert *list, uint32_t n) {
    const double now = wall_s();
    for (uint32_t i = 0; i < n; i++) {
        entry *x = entry_at(st, list[i].layer, list[i].expert);
        x->recency = now;
        char name[64];
        file_name(name, sizeof name, list[i].layer, list[i].expert, x->bin ? "bin" : "part");
        if (x->bin || x->part) (void)utimensat(st->dir_fd, name, NULL, 0);
    }
}

/* Checks the cached, not yet verified experts of the list. */
static int verify_listed(moex_worker_store *st, const moex_proto_expert *list, uint32_t n, moex_error *err) {
    int checked = 0, dropped = 0;
    for (uint32_t i = 0; i < n; i++) {
        const int l = list[i].layer, e = list[i].expert;
        entry *x = entry_at(st, l, e);
        if (!x->bin || x->verified) continue;
        const int rc = with_retries(st, verify_cached, l, e, err);
        if (rc) return rc;
        checked++;
        dropped += !x->bin;
    }
    if (checked)
        moex_log(MOEX_LOG_INFO, "worker: %d cached experts checked against the hub: %d good, %d stale", checked,
                 checked - dropped, dropped);
    return 0;
}

static int download_listed(moex_worker_store *st, const moex_proto_expert *list, uint32_t n, moex_error *err) {
    uint64_t total = 0;
    int n_missing = 0, n_resumed = 0;
    for (uint32_t i = 0; i < n; i++) {
        const entry *x = entry_at(st, list[i].layer, list[i].expert);
        if (x->bin) continue;
        const uint64_t bytes = expected_bytes(st, list[i].layer, list[i].expert);
        const bool resumable = x->part && x->disk_bytes < bytes;
        total += bytes - (resumable ? x->disk_bytes : 0);
        n_missing++;
        n_resumed += resumable && x->disk_bytes > 0;
    }
    if (!n_missing) return 0;
    dl_progress_start(&st->progress, total, n_missing);
    int rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        if (entry_at(st, list[i].layer, list[i].expert)->bin) continue;
        rc = with_retries(st, download_expert, list[i].layer, list[i].expert, err);
        if (!rc) dl_progress_item_done(&st->progress);
    }
    dl_progress_end(&st->progress);
    const double dt = moex_time_s() - st->progress.t0;
    moex_log(MOEX_LOG_INFO, "worker: downloaded %d experts, %llu bytes (%.1f MiB, %d resumed) in %.2f s, %.1f MB/s%s",
             st->progress.n_done, (unsigned long long)st->progress.done, (double)st->progress.done / MIB, n_resumed,
             dt, dt > 0 ? (double)st->progress.done / dt / 1e6 : 0, rc > 0 ? " (interrupted)" : "");
    return rc;
}

static int map_listed(moex_worker_store *st, const moex_proto_expert *list, uint32_t n, moex_error *err) {
    for (uint32_t i = 0; i < n; i++) {
        const int l = list[i].layer, e = list[i].expert;
        entry *x = entry_at(st, l, e);
        if (!x->map) {
            char name[64];
            file_name(name, sizeof name, l, e, "bin");
            if (!(x->map = map_file(st, name, expected_bytes(st, l, e), err))) return -1;
        }
        bind_expert(st, l, e, x->map);
    }
    return 0;
}

int moex_worker_store_fetch(moex_worker_store *st, const moex_proto_expert *list, uint32_t n, bool (*stop)(void *),
                            void *stop_ctx, moex_error *err) {
    for (uint32_t i = 0; i < n; i++)
        if (list[i].layer >= st->dm.m.hp.n_layer || list[i].expert >= st->dm.m.hp.n_expert)
            return moex_fail(err, "expert (%u, %u) is outside the model (%d layers x %d experts)", list[i].layer,
                             list[i].expert, st->dm.m.hp.n_layer, st->dm.m.hp.n_expert);
    st->stop = stop;
    st->stop_ctx = stop_ctx;
    mark_listed(st, list, n);
    touch_listed(st, list, n);
    int rc = verify_listed(st, list, n, err);
    if (!rc) rc = download_listed(st, list, n, err);
    if (!rc) rc = map_listed(st, list, n, err);
    st->stop = NULL;
    return rc;
}

/* ---- eviction ---- */

static int by_recency(const void *a, const void *b) {
    const entry *x = *(entry *const *)a, *y = *(entry *const *)b;
    return x->recency < y->recency ? -1 : x->recency > y->recency;
}

void moex_worker_store_trim(moex_worker_store *st, const moex_proto_expert *list, uint32_t n) {
    const int nl = st->dm.m.hp.n_layer, ne = st->dm.m.hp.n_expert;
    mark_listed(st, list, n);
    uint64_t on_disk = 0;
    int n_old = 0;
    for (int l = 0; l < nl; l++)
        for (int e = 0; e < ne; e++) {
            entry *x = entry_at(st, l, e);
            if (!x->listed) unmap_entry(st, l, e);
            if (x->bin || x->part) on_disk += x->disk_bytes, n_old += !x->listed;
        }
    if (on_disk <= st->budget || !n_old) return;
    entry **old = malloc((size_t)n_old * sizeof *old);
    if (!old) return;
    n_old = 0;
    for (size_t i = 0; i < (size_t)nl * ne; i++)
        if ((st->e[i].bin || st->e[i].part) && !st->e[i].listed) old[n_old++] = &st->e[i];
    qsort(old, (size_t)n_old, sizeof *old, by_recency);
    int evicted = 0;
    uint64_t freed = 0;
    for (int i = 0; i < n_old && on_disk > st->budget; i++) {
        const size_t idx = (size_t)(old[i] - st->e);
        const int l = (int)(idx / (size_t)ne), e = (int)(idx % (size_t)ne);
        remove_file(st, l, e, old[i]->bin ? "bin" : "part");
        on_disk -= old[i]->disk_bytes;
        freed += old[i]->disk_bytes;
        old[i]->bin = old[i]->part = old[i]->verified = false;
        old[i]->disk_bytes = 0;
        evicted++;
    }
    free(old);
    moex_log(MOEX_LOG_INFO, "worker: cache over the memory budget: evicted %d experts (%.1f MiB); %.1f MiB cached, budget %.1f MiB",
             evicted, (double)freed / MIB, (double)on_disk / MIB, (double)st->budget / MIB);
}

/* ---- opening: the hub's model description ---- */

/* The JSON being received, and main's stop flag. */
typedef struct json_fetch {
    char *data;
    size_t len, cap;
    volatile sig_atomic_t *stop;
} json_fetch;

static int on_json(void *ctx, const void *data, size_t len, moex_error *err) {
    json_fetch *b = ctx;
    if (b->len + len > MODEL_JSON_MAX) return moex_fail(err, "/v1/model: larger than %u bytes", MODEL_JSON_MAX);
    if (b->len + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 16384;
        while (cap < b->len + len + 1) cap *= 2;
        char *p = realloc(b->data, cap);
        if (!p) return moex_fail(err, "out of memory");
        b->data = p, b->cap = cap;
    }
    memcpy(b->data + b->len, data, len);
    b->len += len;
    return 0;
}

static bool json_stop(void *ctx) {
    const json_fetch *b = ctx;
    return b->stop && *b->stop;
}

/* GET /v1/model, retrying while the hub is unreachable (up to --reconnect-max-s). */
static int fetch_model_json(moex_worker_store *st, const moex_worker_options *o, json_fetch *b, moex_error *err) {
    const double t0 = moex_time_s();
    double backoff = BACKOFF_MIN_S;
    for (;;) {
        b->len = 0;
        dl_request req = {.path = "/v1/model", .range_first = -1, .range_last = -1, .on_body = on_json,
                          .stop = json_stop, .ctx = b};
        dl_response r;
        const int rc = dl_http_get(st->http, &req, &r, err);
        if (rc == DL_OK && r.status == 403)
            return moex_fail(err, "the hub at %s refused the token (HTTP 403): check --token", dl_http_base(st->http));
        if (rc == DL_OK && r.status != 200) return http_status_error(&r, "/v1/model", err);
        if (rc == DL_OK) return 0;
        if (rc == DL_STOPPED) return moex_fail(err, "interrupted while asking the hub for its model");
        if (rc != DL_NETWORK) return -1;
        const double max = o->reconnect_max_s;
        if (max > 0 && moex_time_s() - t0 >= max) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            return moex_fail(err, "no answer from the hub for %.1f s (last: %s); giving up", moex_time_s() - t0, why);
        }
        moex_log(MOEX_LOG_INFO, "worker: %s; retrying in %.1f s", err->msg, backoff);
        const struct timespec step = {0, 100 * 1000 * 1000};
        for (double t = 0; t < backoff; t += 0.1) {
            if (json_stop(b)) return moex_fail(err, "interrupted while asking the hub for its model");
            nanosleep(&step, NULL);
        }
        backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : backoff * 2;
    }
}

static uint64_t all_expert_bytes(const dl_model *dm) {
    uint64_t total = 0;
    for (size_t i = 0; i < (size_t)dm->m.hp.n_layer * dm->m.hp.n_expert; i++) total += dm->expert_bytes[i];
    return total;
}

/* The hub's model and its cache directory into st (empty, or closed by close_model). */
static int open_model(moex_worker_store *st, const moex_worker_options *o, volatile sig_atomic_t *stop, moex_error *err) {
    st->dir_fd = st->lock_fd = -1;
    json_fetch b = {.stop = stop};
    int rc = fetch_model_json(st, o, &b, err);
    if (!rc) rc = dl_model_parse(&st->dm, b.data, b.len, err);
    free(b.data);
    if (!rc && !(st->e = calloc((size_t)st->dm.m.hp.n_layer * st->dm.m.hp.n_expert, sizeof *st->e)))
        rc = moex_fail(err, "out of memory");
    if (!rc) rc = open_cache(st, o, err);
    if (rc) return -1;
    scan_cache(st);
    st->budget = o->memory_budget ? o->memory_budget : all_expert_bytes(&st->dm);
    moex_log(MOEX_LOG_INFO, "worker: model %s from the hub at %s: %s, %d layers x %d experts, hidden %d, %.1f MiB of experts; cache %s",
             st->dm.hash_hex, dl_http_base(st->http), st->dm.m.hp.arch_name, st->dm.m.hp.n_layer, st->dm.m.hp.n_expert,
             st->dm.m.hp.n_embd, (double)all_expert_bytes(&st->dm) / MIB, st->dir);
    return 0;
}

/* Unmaps the experts, releases the cache directory and forgets the model. */
static void close_model(moex_worker_store *st) {
    if (st->e)
        for (int l = 0; l < st->dm.m.hp.n_layer; l++)
            for (int e = 0; e < st->dm.m.hp.n_expert; e++) unmap_entry(st, l, e);
    free(st->e);
    st->e = NULL;
    dl_model_free(&st->dm);
    memset(&st->dm, 0, sizeof st->dm);
    if (st->lock_fd >= 0) close(st->lock_fd);
    if (st->dir_fd >= 0) close(st->dir_fd);
    st->lock_fd = st->dir_fd = -1;
}

moex_worker_store *moex_worker_store_open(const moex_worker_options *o, volatile sig_atomic_t *stop, moex_error *err) {
    moex_worker_store *st = calloc(1, sizeof *st);
    if (!st) {
        moex_fail(err, "out of memory");
        return NULL;
    }
    st->dir_fd = st->lock_fd = -1;
    if (!(st->http = dl_http_create(o, err)) || open_model(st, o, stop, err)) {
        moex_worker_store_close(st);
        return NULL;
    }
    return st;
}

int moex_worker_store_reopen(moex_worker_store *st, const moex_worker_options *o, volatile sig_atomic_t *stop,
                             moex_error *err) {
    const uint64_t old = st->dm.model_hash;
    close_model(st);
    if (open_model(st, o, stop, err)) return -1;
    if (st->dm.model_hash == old)
        return moex_fail(err, "the hub at %s reports a model mismatch but still describes model %016llx, this "
                         "worker's: a hub bug, or its file changed twice; restart the worker", dl_http_base(st->http),
                         (unsigned long long)old);
    return 0;
}

void moex_worker_store_close(moex_worker_store *st) {
    if (!st) return;
    close_model(st);
    dl_http_free(st->http);
    free(st);
}

const moex_model *moex_worker_store_model(const moex_worker_store *st) { return &st->dm.m; }

uint64_t moex_worker_store_model_hash(const moex_worker_store *st) { return st->dm.model_hash; }

const char *moex_worker_store_source(const moex_worker_store *st) { return dl_http_base(st->http); }
