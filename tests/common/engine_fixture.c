#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

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

uint64_t fixture_disk_slot(uint64_t page_bytes, uint32_t page_tokens)
{
    uint64_t head = 160 + 4 * (uint64_t)page_tokens, body = page_bytes / 4096 * 4096;
    uint64_t tail = (page_bytes - body + 7) / 8 * 8 + head;

    return body + (body ? (tail + 4095) / 4096 * 4096 : (tail + 63) / 64 * 64);
}

int fixture_flip_bytes(const char *path, uint64_t off, size_t n)
{
    uint8_t b[64];
    int fd = open(path, O_RDWR), rc = 0;

    if (fd < 0)
        return -errno;
    if (n > sizeof(b) || pread(fd, b, n, (off_t)off) != (ssize_t)n)
        rc = n > sizeof(b) ? -EINVAL : -EIO;
    for (size_t i = 0; rc == 0 && i < n; i++)
        b[i] ^= 0xa5;
    if (rc == 0 && pwrite(fd, b, n, (off_t)off) != (ssize_t)n)
        rc = -EIO;
    close(fd);
    return rc;
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
