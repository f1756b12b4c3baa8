/* placeholder: replaced by the generator work */
#include <stdio.h>
#include "hub/tool.h"
int moex_tool_gen(int argc, char **argv) { fprintf(stderr, "gen: not built yet\n"); return 1; }
