/* placeholder: moex-hub */
#include <stdio.h>
int main(void) { fprintf(stderr, "moex-hub: not built yet\n"); return 1; }
