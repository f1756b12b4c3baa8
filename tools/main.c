/* moex-gguf: inspect, tokenize and generate GGUF model files.
 * Each subcommand lives in its own tool_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "tools/tool.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moex-gguf <command> [args]\n"
            "  info FILE                      metadata, tensors, types and sizes\n"
            "  tokenize VOCAB.gguf [TEXT]     token ids of TEXT (stdin when absent); --special parses special tokens\n"
            "  detokenize VOCAB.gguf [IDS]    text of space/comma-separated ids (stdin when absent)\n"
            "  gen --arch A --preset P --vocab VOCAB.gguf --type T --seed S -o OUT.gguf\n"
            "                                 write a random-weight model (see gen --help)\n"
            "  quantize IN.gguf OUT.gguf --type T\n"
            "                                 rewrite a model's weights in type T or the q4_K_M mix\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "info")) return moex_tool_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return moex_tool_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "detokenize")) return moex_tool_detokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "gen")) return moex_tool_gen(argc - 1, argv + 1);
    if (!strcmp(cmd, "quantize")) return moex_tool_quantize(argc - 1, argv + 1);
    fprintf(stderr, "moex-gguf: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
