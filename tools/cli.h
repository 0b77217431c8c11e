/* Command-line pieces the tools share. */
#ifndef KVT_TOOLS_CLI_H
#define KVT_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* Print "prog: msg: arg" and a hint to try --help on stderr; returns 2, the usage status. */
int cli_bad_usage(const char *prog, const char *msg, const char *arg);

/* A decimal count, digits only; false for anything else or an overflow. */
bool cli_parse_u64(const char *s, uint64_t *out);

/* s as a JSON string on stdout; NULL prints null. */
void cli_json_string(const char *s);

#endif
