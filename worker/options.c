/* moex-worker's command line. Strict: every number is checked whole and in
 * range, so a typo is an error message rather than a surprising default. */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "worker/worker.h"

void moex_worker_usage(FILE *f) {
    fprintf(f,
            "usage: moex-worker --hub ws[s]://HOST:PORT/ws --token T [--model MODEL.gguf] [options]\n"
            "  --hub URL                the hub: ws://HOST:PORT/ws, or wss:// when it serves TLS (https:// and\n"
            "                           http:// work too; the path defaults to /ws), or tcp://HOST:PORT, the\n"
            "                           hub's --tcp-port: frames without WebSocket's costs (in the clear; needs\n"
            "                           --model)\n"
            "  --ca FILE                wss: trust the hub's certificate FILE (PEM; the one --tls printed), not\n"
            "                           the system's certificate authorities\n"
            "  --insecure               wss: skip certificate verification (anyone on the way can pose as the hub)\n"
            "  --model FILE             the hub's GGUF; without it the assigned experts are downloaded from the hub\n"
            "  --download               download the experts from the hub (the default without --model)\n"
            "  --cache-dir DIR          downloaded experts (default $XDG_CACHE_HOME/moex or ~/.cache/moex)\n"
            "  --threads N              compute threads (default: all cores)\n"
            "  --simd P                 CPU kernels on portable, avx2 or avx512vnni (default: the CPU's best)\n"
            "  --name NAME              name shown by the hub (default worker-<hostname>-<pid>)\n"
            "  --capacity W             placement weight, > 0 (default 1)\n"
            "  --memory-budget BYTES    bytes for experts, suffix K/M/G allowed (default: all the model's);\n"
            "                           downloaded experts no longer assigned stay cached up to it\n"
            "  --backend cpu|vulkan     compute backend (default cpu); vulkan keeps the assigned experts on the GPU\n"
            "  --device N               --backend vulkan: the GPU to use (default: the best; the log names it)\n"
            "  --vk-tune K=V,...        --backend vulkan: kernel choices for a new GPU (the keys:\n"
            "                           docs/ARCHITECTURE.md \"Settings\")\n"
            "  --backlog N              dispatches queued at most, 1..4096 (default 64)\n"
            "  --reconnect-max-s S      give up after S seconds without a connection the hub took (default: never)\n"
            "  --seed S                 seed of the fault injection (default: from time and pid)\n"
            "fault injection, for tests:\n"
            "  --inject-delay-ms D --inject-delay-prob P   sleep D ms before a result, with probability P\n"
            "  --inject-exit-after N    _exit(3) on receiving the N-th DISPATCH\n"
            "  --inject-corrupt-prob P  add noise to a result, with probability P: each value moves by up to\n"
            "                           --inject-corrupt-scale S times the row's RMS (default 10)\n");
}

static int parse_double(const char *flag, const char *s, double lo, double hi, double *out, moex_error *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        return moex_fail(err, "%s: '%s' is not a number in [%g, %g]", flag, s, lo, hi);
    *out = v;
    return 0;
}

static int parse_int(const char *flag, const char *s, long long lo, long long hi, long long *out, moex_error *err) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return moex_fail(err, "%s: '%s' is not an integer in [%lld, %lld]", flag, s, lo, hi);
    *out = v;
    return 0;
}

/* BYTES with an optional K/M/G/T suffix (powers of 1024). */
static int parse_bytes(const char *flag, const char *s, uint64_t *out, moex_error *err) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    unsigned shift = 0;
    if (*end && !end[1]) {
        const char *units = "KMGT", *u = strchr(units, *end >= 'a' ? *end - 32 : *end);
        if (u) shift = 10u * (unsigned)(u - units + 1), end++;
    }
    if (errno || end == s || *end || s[0] == '-' || (shift && v > (UINT64_MAX >> shift)))
        return moex_fail(err, "%s: '%s' is not a byte count (digits, optional K/M/G/T)", flag, s);
    *out = (uint64_t)v << shift;
    return 0;
}

static int check_name(const char *name, moex_error *err) {
    size_t n = strlen(name);
    if (n == 0 || n > 255) return moex_fail(err, "--name: 1..255 bytes, got %zu", n);
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
            return moex_fail(err, "--name: control characters are not allowed");
    return 0;
}

static void set_defaults(moex_worker_options *o) {
    memset(o, 0, sizeof *o);
    o->capacity = 1.0;
    o->backend = MOEX_BACKEND_CPU;
    o->vk.device = -1;
    o->backlog = 64;
    o->inject_corrupt_scale = 10;
    o->seed = (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid();
}

static const char *const known_flags[] = {
    "--hub", "--token", "--ca", "--model", "--cache-dir", "--name", "--threads", "--capacity", "--memory-budget",
    "--backend", "--device", "--vk-tune", "--simd", "--backlog", "--reconnect-max-s", "--seed", "--inject-delay-ms",
    "--inject-delay-prob",
    "--inject-exit-after", "--inject-corrupt-prob", "--inject-corrupt-scale",
};

static bool is_known_flag(const char *flag) {
    for (size_t i = 0; i < sizeof known_flags / sizeof *known_flags; i++)
        if (!strcmp(flag, known_flags[i])) return true;
    return false;
}

/* One flag with its value; returns 0, or -1 with err. */
static int apply_flag(moex_worker_options *o, const char *flag, const char *val, moex_error *err) {
    long long i = 0;
    double d;
    if (!strcmp(flag, "--hub")) o->hub_url = val;
    else if (!strcmp(flag, "--token")) o->token = val;
    else if (!strcmp(flag, "--ca")) {
        if (!*val) return moex_fail(err, "--ca: empty path");
        o->ca_file = val;
    }
    else if (!strcmp(flag, "--model")) o->model_path = val;
    else if (!strcmp(flag, "--cache-dir")) {
        if (!*val) return moex_fail(err, "--cache-dir: empty path");
        o->cache_dir = val;
    }
    else if (!strcmp(flag, "--name")) {
        if (check_name(val, err)) return -1;
        o->name = val;
    } else if (!strcmp(flag, "--threads")) {
        if (parse_int(flag, val, 1, 1024, &i, err)) return -1;
        o->threads = (int)i;
    } else if (!strcmp(flag, "--capacity")) {
        if (parse_double(flag, val, 0.01, 655.35, &o->capacity, err)) return -1;
    } else if (!strcmp(flag, "--memory-budget")) {
        if (parse_bytes(flag, val, &o->memory_budget, err)) return -1;
    } else if (!strcmp(flag, "--backend")) {
        if (!strcmp(val, "cpu")) o->backend = MOEX_BACKEND_CPU;
        else if (!strcmp(val, "vulkan")) o->backend = MOEX_BACKEND_VULKAN;
        else return moex_fail(err, "--backend: '%s' is not a backend (cpu or vulkan)", val);
    } else if (!strcmp(flag, "--device")) {
        if (parse_int(flag, val, 0, 255, &i, err)) return -1;
        o->vk.device = (int)i;
    } else if (!strcmp(flag, "--simd")) {
        if (moex_kernels_use_simd(val, err)) return -1;
    } else if (!strcmp(flag, "--vk-tune")) {
#if MOEX_HAVE_VULKAN
        if (moex_vk_options_tune(&o->vk, val, err)) return -1;
        o->vk_tuned = true;
#else
        return moex_fail(err, "--vk-tune: this moex-worker was built without Vulkan (-DMOEX_VULKAN=OFF)");
#endif
    } else if (!strcmp(flag, "--backlog")) {
        if (parse_int(flag, val, 1, 4096, &i, err)) return -1;
        o->backlog = (int)i;
    } else if (!strcmp(flag, "--reconnect-max-s")) {
        if (parse_double(flag, val, 0, 1e9, &o->reconnect_max_s, err)) return -1;
    } else if (!strcmp(flag, "--seed")) {
        if (parse_int(flag, val, 0, INT64_MAX, &i, err)) return -1;
        o->seed = (uint64_t)i;
    } else if (!strcmp(flag, "--inject-delay-ms")) {
        if (parse_int(flag, val, 0, 3600000, &i, err)) return -1;
        o->inject_delay_ms = (int)i;
    } else if (!strcmp(flag, "--inject-delay-prob")) {
        if (parse_double(flag, val, 0, 1, &d, err)) return -1;
        o->inject_delay_prob = d;
    } else if (!strcmp(flag, "--inject-exit-after")) {
        if (parse_int(flag, val, 1, INT32_MAX, &i, err)) return -1;
        o->inject_exit_after = (long)i;
    } else if (!strcmp(flag, "--inject-corrupt-prob")) {
        if (parse_double(flag, val, 0, 1, &d, err)) return -1;
        o->inject_corrupt_prob = d;
    } else if (!strcmp(flag, "--inject-corrupt-scale")) {
        if (parse_double(flag, val, 0, 1e6, &d, err)) return -1;
        o->inject_corrupt_scale = d;
    } else {
        return moex_fail(err, "unknown option '%s' (see --help)", flag);
    }
    return 0;
}

static int check_required(const moex_worker_options *o, moex_error *err) {
    if (!o->hub_url) return moex_fail(err, "--hub ws://HOST:PORT/PATH is required");
    const bool tls = !strncmp(o->hub_url, "wss://", 6) || !strncmp(o->hub_url, "https://", 8);
    const bool tcp = !strncmp(o->hub_url, "tcp://", 6);
    if (!tls && !tcp && strncmp(o->hub_url, "ws://", 5) && strncmp(o->hub_url, "http://", 7))
        return moex_fail(err, "--hub: '%s' is not a ws://, wss:// or tcp:// URL", o->hub_url);
    if (tcp && !o->model_path)
        return moex_fail(err, "--hub tcp:// needs --model: the experts download over HTTP, from the hub's ws:// port");
    if (!tls && (o->ca_file || o->insecure))
        return moex_fail(err, "--%s is for a hub that serves TLS: give --hub wss://...", o->ca_file ? "ca" : "insecure");
    if (o->ca_file && o->insecure) return moex_fail(err, "--ca and --insecure exclude each other");
    if (!o->token) return moex_fail(err, "--token is required");
    if (o->model_path && o->download)
        return moex_fail(err, "--model and --download exclude each other (--download fetches the experts from the hub)");
    if (o->model_path && o->cache_dir) return moex_fail(err, "--cache-dir is for downloads: leave out --model");
    if (o->vk.device >= 0 && o->backend != MOEX_BACKEND_VULKAN)
        return moex_fail(err, "--device is for --backend vulkan");
    if (o->vk_tuned && o->backend != MOEX_BACKEND_VULKAN) return moex_fail(err, "--vk-tune is for --backend vulkan");
    if (o->inject_delay_prob > 0 && o->inject_delay_ms <= 0)
        return moex_fail(err, "--inject-delay-prob needs --inject-delay-ms");
    return 0;
}

int moex_worker_parse_args(int argc, char **argv, moex_worker_options *o, moex_error *err) {
    set_defaults(o);
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) return 1;
        if (!strcmp(arg, "--download") || !strcmp(arg, "--insecure")) { /* the flags without a value */
            if (arg[2] == 'd') o->download = true;
            else o->insecure = true;
            continue;
        }
        if (strncmp(arg, "--", 2)) return moex_fail(err, "unexpected argument '%s' (see --help)", arg);
        /* --flag=value or --flag value */
        char flag[64];
        const char *eq = strchr(arg, '='), *val;
        size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
        if (n >= sizeof flag) return moex_fail(err, "unknown option '%s' (see --help)", arg);
        memcpy(flag, arg, n);
        flag[n] = 0;
        if (!is_known_flag(flag)) return moex_fail(err, "unknown option '%s' (see --help)", flag);
        if (eq) {
            val = eq + 1;
        } else {
            if (a + 1 >= argc) return moex_fail(err, "%s needs a value", flag);
            val = argv[++a];
        }
        if (apply_flag(o, flag, val, err)) return -1;
    }
    return check_required(o, err);
}
