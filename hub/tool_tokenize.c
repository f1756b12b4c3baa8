/* placeholder: replaced by the tokenizer work */
#include <stdio.h>
#include "hub/tool.h"
int moex_tool_tokenize(int argc, char **argv) { fprintf(stderr, "tokenize: not built yet\n"); return 1; }
int moex_tool_detokenize(int argc, char **argv) { fprintf(stderr, "detokenize: not built yet\n"); return 1; }
