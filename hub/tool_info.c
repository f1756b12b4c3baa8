/* placeholder: replaced by the GGUF reader work */
#include <stdio.h>
#include "hub/tool.h"
int moex_tool_info(int argc, char **argv) { fprintf(stderr, "info: not built yet\n"); return 1; }
