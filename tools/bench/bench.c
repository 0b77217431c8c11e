/* kvtier-bench's main (bench.h). */
#include <stdio.h>

#include "bench.h"

int main(int argc, char **argv)
{
    struct config cfg = {.page_size = 16, .device_tokens = DEFAULT_DEVICE_TOKENS, .seed = 1};
    struct source src = {.cfg = &cfg};
    struct bench b = {.cfg = &cfg, .src = &src};
    int rc = bench_parse_geometry(&cfg, "--geometry", "tiny");

    if (rc == 0)
        rc = bench_parse_args(argc, argv, &cfg);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (bench_survey(&b)) {
        rc = 1;
    } else if (cfg.corrupt_after > b.nreqs) {
        rc = cli_bad_usage(PROG, "--corrupt-after names a request past the last one", NULL);
    } else if (bench_setup(&b) == 0 && bench_replay(&b) == 0) {
        if (cfg.json)
            bench_print_json(&b);
        else
            bench_print_text(&b);
        if (b.c.mismatches) {
            bench_report_mismatch(&b);
            rc = 1;
        }
        if (bench_mm_mismatches(b.mm)) {
            fprintf(stderr, "%s: VERIFY FAILED: embeddings served differ from the images'\n", PROG);
            rc = 1;
        }
    } else {
        rc = 1;
    }
    bench_teardown(&b);
    bench_source_close(&src);
    return rc;
}
