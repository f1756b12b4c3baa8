/* Subcommands of moex-gguf (private to the tool; argv[0] is the subcommand name).
 * Each returns the process exit code: 0 ok, 1 failure, 2 bad usage. */
#ifndef MOEX_TOOLS_TOOL_H
#define MOEX_TOOLS_TOOL_H

int moex_tool_info(int argc, char **argv);
int moex_tool_tokenize(int argc, char **argv);
int moex_tool_detokenize(int argc, char **argv);
int moex_tool_gen(int argc, char **argv);
int moex_tool_quantize(int argc, char **argv);

#endif
