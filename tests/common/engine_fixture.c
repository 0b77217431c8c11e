#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvtier.h"
#include "engine_fixture.h"

void fixture_engine_options(struct kvt_options *o, uint32_t layers, uint32_t head_dim)
{
    kvt_options_init(o, sizeof(*o));
    o->geometry = (struct kvt_geometry){.attention = KVT_ATTN_MHA,
                                        .layers = layers,
                                        .kv_heads = 1,
                                        .head_dim = head_dim,
                                        .dtype_bytes = 2};
    o->backend = KVT_BACKEND_SIM;
    o->page_size = 4;
    o->device_tokens = 64;
    o->max_requests = 4;
    o->max_context = 64;
}

int fixture_data_dir(char *dir, size_t len, const char *what)
{
    const char *tmp = getenv("TMPDIR");

    snprintf(dir, len, "%s/kvt-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", what);
    return mkdtemp(dir) ? 0 : -errno;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

void fixture_remove_tree(const char *dir)
{
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}
