#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* The dirs fixture_data_dir made and fixture_remove_tree has not removed yet: removed at exit,
 * so a test that failed (an assertion returns out of it, the harness exits) leaves none
 * behind. Only by the process that made them: a forked child's exit must not take its
 * parent's dirs. A test killed by a signal still leaves its own. */
static char **made;
static size_t nmade, made_cap;
static pid_t made_by;
static pthread_mutex_t made_mu = PTHREAD_MUTEX_INITIALIZER;

static void remove_left(void);

static void note_made(const char *dir)
{
    char *copy = strdup(dir);

    pthread_mutex_lock(&made_mu);
    if (!made_by) {
        made_by = getpid();
        atexit(remove_left);
    }
    if (copy && nmade == made_cap) {
        size_t cap = made_cap ? 2 * made_cap : 16;
        char **v = realloc(made, cap * sizeof(*v));

        if (v) {
            made = v;
            made_cap = cap;
        }
    }
    if (copy && nmade < made_cap)
        made[nmade++] = copy;
    else
        free(copy);
    pthread_mutex_unlock(&made_mu);
}

static void forget_made(const char *dir)
{
    pthread_mutex_lock(&made_mu);
    for (size_t i = 0; i < nmade; i++)
        if (!strcmp(made[i], dir)) {
            free(made[i]);
            made[i] = made[--nmade];
            break;
        }
    pthread_mutex_unlock(&made_mu);
}

int fixture_data_dir(char *dir, size_t len, const char *what)
{
    const char *tmp = getenv("TMPDIR");

    snprintf(dir, len, "%s/kvt-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", what);
    if (!mkdtemp(dir))
        return -errno;
    note_made(dir);
    return 0;
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
    forget_made(dir);
}

void fixture_keep_tree(const char *dir)
{
    forget_made(dir);
}

static void remove_left(void)
{
    if (getpid() != made_by)
        return;
    for (size_t i = 0; i < nmade; i++) {
        nftw(made[i], remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        free(made[i]);
    }
    free(made);
    made = NULL;
    nmade = made_cap = 0;
}
