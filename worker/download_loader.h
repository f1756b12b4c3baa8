/* The download thread of a worker without its own copy of the model
 * (download_loader.c). It sits between the session and the compute thread:
 * an ASSIGN goes to it first; once the store holds every listed expert it
 * hands the assignment on (assign_pending), waits for the compute thread to
 * apply it, then trims the cache. Shares the session's mutex. */
#ifndef MOEX_WORKER_DOWNLOAD_LOADER_H
#define MOEX_WORKER_DOWNLOAD_LOADER_H

#include "worker/session_internal.h"

typedef struct dl_loader dl_loader;

/* Starts the thread for s->store. */
int dl_loader_start(session *s, moex_error *err);
void dl_loader_stop(session *s);
/* Called with mu held by on_assign: s->assign_list awaits its downloads. */
void dl_loader_post(session *s);
/* lws thread: true (with the reason) once a download failed for good. */
bool dl_loader_failed(session *s, moex_error *err);

#endif
