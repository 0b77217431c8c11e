/* kvtier-xfer-bench's main (xfer_bench.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "xfer_bench.h"

int main(int argc, char **argv)
{
    struct config cfg = {.geometry_arg = DEFAULT_GEOMETRY,
                         .page_size = 16,
                         .run_pages = DEFAULT_RUN_PAGES,
                         .pages = DEFAULT_PAGES,
                         .reps = DEFAULT_REPS,
                         .seed = 1};
    struct rig r = {.cfg = &cfg};
    struct bandwidth bw = {0};
    struct overlap ov = {0};
    int rc = cli_parse_geometry(PROG, DEFAULT_GEOMETRY, &cfg.g, &cfg.tp_size);

    if (rc == 0)
        rc = xb_parse_args(&cfg, argc, argv);
    if (rc)
        return rc < 0 ? 0 : rc;
    rc = xb_setup(&r);
    if (rc == 0 && (xb_run_bandwidth(&r, &bw) || xb_run_overlap(&r, &ov)))
        rc = -1;
    if (rc == 0)
        xb_print_report(&r, &bw, &ov);
    xb_teardown(&r);
    return rc == EXIT_SKIP ? EXIT_SKIP : rc ? 1 : 0;
}
