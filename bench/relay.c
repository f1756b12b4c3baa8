/* moex-relay: a userspace LAN emulator for tests and benchmarks on one
 * machine (which has no netem). It listens on a port and relays every
 * connection to a target, delaying each direction by RTT/2 plus optional
 * jitter, and optionally capping the bandwidth of each direction.
 *
 *   moex-relay --listen PORT --to HOST:PORT --rtt-ms R [--jitter-ms J] [--mbps B] [--seed S]
 *
 * Each direction of a connection is a reader thread (timestamps what it reads)
 * and a writer thread (delivers each chunk at its due time). Due times never
 * go backwards, so the byte stream keeps its order as TCP's does; with a
 * bandwidth cap a chunk also waits for the link to carry the ones before it.
 * It prints the port it listens on ("relay listening on PORT") once ready. */
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/rng.h"

#define CHUNK (64 * 1024)

typedef struct options {
    int listen_port;
    char host[256];
    int port;
    double one_way_s, jitter_s, bytes_per_s;
    uint64_t seed;
} options;

typedef struct chunk {
    struct chunk *next;
    double due;
    size_t len;
    uint8_t data[];
} chunk;

/* One direction of one connection. */
typedef struct pipe_dir {
    const options *o;
    int from, to;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    chunk *head, *tail;
    bool eof;
    double last_due, link_free;
    uint64_t rng;
    struct pipe_dir *other;
} pipe_dir;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t) {
    struct timespec ts = {.tv_sec = (time_t)t, .tv_nsec = (long)((t - (double)(time_t)t) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

/* When a chunk read at t arrives at the other side. */
static double due_time(pipe_dir *p, double t, size_t len) {
    double due = t + p->o->one_way_s + p->o->jitter_s * moex_rand01(&p->rng);
    if (p->o->bytes_per_s > 0) { /* the link carries one chunk after the other */
        const double start = fmax(t, p->link_free);
        p->link_free = start + (double)len / p->o->bytes_per_s;
        due = fmax(due, p->link_free + p->o->one_way_s);
    }
    if (due < p->last_due) due = p->last_due;
    p->last_due = due;
    return due;
}

static void *reader(void *arg) {
    pipe_dir *p = arg;
    for (;;) {
        chunk *c = malloc(sizeof *c + CHUNK);
        if (!c) break;
        const ssize_t n = read(p->from, c->data, CHUNK);
        if (n <= 0) {
            free(c);
            break;
        }
        c->next = NULL;
        c->len = (size_t)n;
        pthread_mutex_lock(&p->mu);
        c->due = due_time(p, now_s(), c->len);
        if (p->tail) p->tail->next = c;
        else p->head = c;
        p->tail = c;
        pthread_cond_signal(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_lock(&p->mu);
    p->eof = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static bool write_all(int fd, const uint8_t *b, size_t n) {
    while (n) {
        const ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        b += w;
        n -= (size_t)w;
    }
    return true;
}

static void *writer(void *arg) {
    pipe_dir *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->head && !p->eof) pthread_cond_wait(&p->cv, &p->mu);
        chunk *c = p->head;
        if (c) {
            p->head = c->next;
            if (!p->head) p->tail = NULL;
        }
        pthread_mutex_unlock(&p->mu);
        if (!c) break; /* eof and drained */
        sleep_until(c->due);
        const bool ok = write_all(p->to, c->data, c->len);
        free(c);
        if (!ok) break;
    }
    /* one side closed (or failed): the whole relayed connection ends, so the
     * other direction's reader wakes up too */
    shutdown(p->to, SHUT_RDWR);
    shutdown(p->from, SHUT_RDWR);
    return NULL;
}

static int connect_target(const options *o) {
    char port[16];
    snprintf(port, sizeof port, "%d", o->port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(o->host, port, &hints, &res)) return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

typedef struct relay_conn {
    pipe_dir up, down;
    int a, b;
} relay_conn;

static void *serve_conn(void *arg) {
    relay_conn *rc = arg;
    pthread_t t[4];
    pthread_create(&t[0], NULL, reader, &rc->up);
    pthread_create(&t[1], NULL, writer, &rc->up);
    pthread_create(&t[2], NULL, reader, &rc->down);
    pthread_create(&t[3], NULL, writer, &rc->down);
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    close(rc->a);
    close(rc->b);
    free(rc);
    return NULL;
}

static void init_dir(pipe_dir *p, const options *o, int from, int to, uint64_t seed) {
    memset(p, 0, sizeof *p);
    p->o = o;
    p->from = from;
    p->to = to;
    p->rng = seed;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
}

static int usage(void) {
    fprintf(stderr, "usage: moex-relay --listen PORT --to HOST:PORT --rtt-ms R [--jitter-ms J] [--mbps B] [--seed S]\n"
                    "  each direction is delayed by R/2 ms plus a uniform 0..J ms; --mbps caps each direction\n");
    return 2;
}

static int parse(int argc, char **argv, options *o) {
    *o = (options){.seed = 1};
    double rtt_ms = -1, jitter_ms = 0, mbps = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return -1;
        i++;
        if (!strcmp(a, "--listen")) o->listen_port = atoi(v);
        else if (!strcmp(a, "--to")) {
            const char *colon = strrchr(v, ':');
            if (!colon || colon == v || (size_t)(colon - v) >= sizeof o->host) return -1;
            memcpy(o->host, v, (size_t)(colon - v));
            o->host[colon - v] = 0;
            o->port = atoi(colon + 1);
        } else if (!strcmp(a, "--rtt-ms")) rtt_ms = atof(v);
        else if (!strcmp(a, "--jitter-ms")) jitter_ms = atof(v);
        else if (!strcmp(a, "--mbps")) mbps = atof(v);
        else if (!strcmp(a, "--seed")) o->seed = strtoull(v, NULL, 10);
        else return -1;
    }
    if (o->port <= 0 || o->port > 65535 || o->listen_port < 0 || o->listen_port > 65535 || rtt_ms < 0 ||
        jitter_ms < 0 || mbps < 0)
        return -1;
    o->one_way_s = rtt_ms / 2000.0;
    o->jitter_s = jitter_ms / 1000.0;
    o->bytes_per_s = mbps * 1e6 / 8.0;
    return 0;
}

int main(int argc, char **argv) {
    options o;
    if (parse(argc, argv, &o)) return usage();
    signal(SIGPIPE, SIG_IGN);
    const int ls = socket(AF_INET, SOCK_STREAM, 0);
    const int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o.listen_port),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (ls < 0 || bind(ls, (struct sockaddr *)&addr, sizeof addr) || listen(ls, 64)) {
        fprintf(stderr, "moex-relay: cannot listen on port %d: %s\n", o.listen_port, strerror(errno));
        return 1;
    }
    socklen_t al = sizeof addr;
    getsockname(ls, (struct sockaddr *)&addr, &al);
    printf("relay listening on %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    for (uint64_t n = 0;; n++) {
        const int a = accept(ls, NULL, NULL);
        if (a < 0) {
            if (errno == EINTR) continue;
            break;
        }
        const int b = connect_target(&o);
        if (b < 0) {
            close(a);
            continue;
        }
        setsockopt(a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        setsockopt(b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        relay_conn *rc = malloc(sizeof *rc);
        if (!rc) {
            close(a);
            close(b);
            continue;
        }
        rc->a = a;
        rc->b = b;
        init_dir(&rc->up, &o, a, b, o.seed * 2 + n * 7919);
        init_dir(&rc->down, &o, b, a, o.seed * 2 + 1 + n * 7919);
        pthread_t t;
        if (pthread_create(&t, NULL, serve_conn, rc) == 0) pthread_detach(t);
    }
    return 1;
}
