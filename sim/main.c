/* moex-sim: latency models of MoEx hedged expert dispatch.
 *   moex-sim hedging    expert-phase latency vs hedging factor (eq. 18 + Monte Carlo)
 *   moex-sim token      per-token discrete-event simulation (eqs. 10-12)
 *   moex-sim placement  expert placement on a consistent-hash ring
 *   moex-sim exchange   a token's time and bytes under three designs of the expert exchange */
#include "sim/main.h"

#include <string.h>

static void usage(FILE *f) {
    fputs("usage: moex-sim <command> [flags]\n"
          "  hedging    expected expert-phase latency E[max_k min_h T] vs h (eq. 18, Monte Carlo)\n"
          "  token      per-token latency: discrete-event simulation of L layers (eqs. 10-12)\n"
          "  placement  experts on workers via the consistent-hash ring: summary or --dump\n"
          "  exchange   a token's time and bytes: per-expert, token-major, layer-range delegation\n"
          "run 'moex-sim <command> --help' for a command's flags\n",
          f);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return MOEX_SIM_USAGE_ERROR;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "hedging")) return sim_cmd_hedging(argc - 2, argv + 2);
    if (!strcmp(cmd, "token")) return sim_cmd_token(argc - 2, argv + 2);
    if (!strcmp(cmd, "placement")) return sim_cmd_placement(argc - 2, argv + 2);
    if (!strcmp(cmd, "exchange")) return sim_cmd_exchange(argc - 2, argv + 2);
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "moex-sim: unknown command '%s'\n", cmd);
    usage(stderr);
    return MOEX_SIM_USAGE_ERROR;
}
