/* The common module: what hub, worker and tools share — errors and logging,
 * the thread pool, tensor types and block layouts, GGUF files, model
 * architectures, the tokenizer, the sampler, chat templates, the splitmix64 generator,
 * a binary heap, a text buffer (with Prometheus lines) and nearest-rank quantiles. */
#ifndef MOEX_COMMON_H
#define MOEX_COMMON_H

#include "common/error.h"
#include "common/pool.h"
#include "common/types.h"
#include "common/gguf.h"
#include "common/arch.h"
#include "common/tokenizer.h"
#include "common/sampler.h"
#include "common/rng.h"
#include "common/heap.h"
#include "common/chat.h"
#include "common/text.h"
#include "common/quantile.h"
#include "common/wire_rows.h"
#include "common/le.h"

#endif
