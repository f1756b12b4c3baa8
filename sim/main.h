/* Private to the moex-sim binary: argument parsing and the subcommands. */
#ifndef MOEX_SIM_MAIN_H
#define MOEX_SIM_MAIN_H

#include <stdbool.h>

#include "sim/sim.h"

#define MOEX_SIM_MAX_LIST 64
#define MOEX_SIM_USAGE_ERROR 2

/* Command-line cursor: flags are "--name value" or "--name" (switches). */
typedef struct args {
    int argc, i;
    char **argv;
} args;

/* The next flag name (without "--"), or NULL at the end; fails on a
 * positional argument. */
int args_next_flag(args *a, const char **name, moex_error *err);
int args_value(args *a, const char *flag, const char **out, moex_error *err);
int args_int(args *a, const char *flag, long lo, long hi, long *out, moex_error *err);
int args_double(args *a, const char *flag, double lo, double hi, double *out, moex_error *err);
/* Comma-separated lists; at most MOEX_SIM_MAX_LIST entries. */
int args_int_list(args *a, const char *flag, long lo, long hi, long *out, int *n, moex_error *err);
int args_double_list(args *a, const char *flag, double lo, double hi, double *out, int *n, moex_error *err);
int parse_double_text(const char *s, const char *what, double lo, double hi, double *out, moex_error *err);
int parse_long_text(const char *s, const char *what, long lo, long hi, long *out, moex_error *err);

enum { FORMAT_TABLE, FORMAT_CSV };
int args_format(args *a, int *format, moex_error *err);

/* Subcommands: return the process exit status. */
int sim_cmd_hedging(int argc, char **argv);
int sim_cmd_token(int argc, char **argv);
int sim_cmd_placement(int argc, char **argv);
int sim_cmd_exchange(int argc, char **argv);

/* A measured routing trace (main_routes.c): ids [tokens][layers][k]. */
typedef struct sim_routes {
    int layers, experts, k, tokens;
    int *ids;
} sim_routes;
int sim_read_routes(const char *path, sim_routes *r, moex_error *err);
void sim_routes_free(sim_routes *r);
/* Replica table [layers][experts][replicas] balancing the trace's loads per layer. */
int sim_place_by_load(const sim_routes *r, int workers, int replicas, int **table, moex_error *err);

/* Prints "moex-sim <cmd>: msg" and a usage hint; returns exit status 2. */
int sim_usage_error(const char *cmd, const moex_error *err);

#endif
