#include "store_test.h"

/* ---- a power cut, simulated ----
 *
 * A child writes PC_FIRST pages and calls dstore_flush (everything durable), then waits while
 * the parent copies the dir's index and slab files: what the disk holds for sure. Then it
 * writes on (evicting the first pages, deleting some) with no flush until it is killed. The
 * parent builds what a power cut may leave of that: each 512-byte sector of each file as it
 * was at the flush or as the child left it, and the file's size one or the other; either all
 * of the old, all of the new (a SIGKILL), or a mix drawn sector by sector. It opens the dir
 * and reads every record and every page the child may have written: each is served
 * byte-exact or missed, never wrong. With all of the old, every page written before the
 * flush is served; with all of the new, every record the index holds is.
 *
 * In relaxed mode the mix is what the disk may do between flushes. In durable mode it is
 * harsher than a real power cut (the batches after the flush were synced before their records
 * committed): the reads' checks alone keep it right there.
 */

#define PC_SLOTS 40
#define PC_FIRST 24   /* pages written before the flush */
#define PC_SECTOR 512 /* what a disk writes whole */
#define PC_FILES 8
#define PC_MAX_DELAY_US 20000
#define PC_PACKED 2048 /* pages packed several to a block (format 3) */

enum pc_image { PC_OLD = 0, PC_NEW = 1, PC_MIX = 2 };

/* One file of the dir, as it was at the flush. */
struct pc_file {
    char path[128];
    uint8_t *old;
    size_t old_len;
};

struct pc_snapshot {
    struct pc_file f[PC_FILES];
    int n;
};

static uint8_t *read_whole(const char *path, size_t *len)
{
    struct stat st;
    uint8_t *buf;
    int fd = open(path, O_RDONLY);

    *len = 0;
    if (fd < 0)
        return NULL;
    assert_int_equal(fstat(fd, &st), 0);
    buf = malloc(st.st_size ? (size_t)st.st_size : 1);
    assert_non_null(buf);
    assert_int_equal(pread(fd, buf, (size_t)st.st_size, 0), st.st_size);
    close(fd);
    *len = (size_t)st.st_size;
    return buf;
}

static void snapshot_add(struct pc_snapshot *s, const char *path)
{
    struct pc_file *f = &s->f[s->n++];

    assert_true(s->n <= PC_FILES);
    snprintf(f->path, sizeof(f->path), "%s", path);
    f->old = read_whole(path, &f->old_len);
}

/* The index and every slab file (PC_SLOTS slots make at most PC_FILES - 1 of them). */
static void snapshot_take(struct fx *fx, struct pc_snapshot *s)
{
    char path[128];

    snprintf(path, sizeof(path), "%s/index/data.mdb", fx->dir);
    snapshot_add(s, path);
    for (uint32_t slab = 0; slab < PC_FILES - 1; slab++) {
        snprintf(path, sizeof(path), "%s/slabs/%04u.slab", fx->dir, slab);
        snapshot_add(s, path); /* one not made yet has no old bytes */
    }
}

static void snapshot_free(struct pc_snapshot *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->f[i].old);
    s->n = 0;
}

/* Sector i of the file as a power cut leaves it: old or new bytes (zeros past either end). */
static void pick_sector(uint8_t *out, const struct pc_file *f, const uint8_t *now, size_t now_len,
                        size_t at, bool take_new)
{
    const uint8_t *src = take_new ? now : f->old;
    size_t len = take_new ? now_len : f->old_len;

    memset(out, 0, PC_SECTOR);
    if (src && at < len)
        memcpy(out, src + at, len - at < PC_SECTOR ? len - at : PC_SECTOR);
}

/* The file rewritten as the image says. A file the flush had not seen is cut to nothing
 * where its old size is taken (its name may have reached the disk without its bytes). */
static void cut_file(const struct pc_file *f, enum pc_image img, uint64_t *rng)
{
    size_t now_len, size;
    uint8_t *now = read_whole(f->path, &now_len), sector[PC_SECTOR];
    int fd;

    if (!now && !f->old)
        return;
    if (img == PC_MIX)
        size = rng_mix((*rng)++) & 1 ? now_len : f->old_len;
    else
        size = img == PC_NEW ? now_len : f->old_len;
    fd = open(f->path, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    for (size_t at = 0; at < size; at += PC_SECTOR) {
        bool take_new = img == PC_MIX ? (rng_mix((*rng)++) & 1) : img == PC_NEW;
        size_t n = size - at < PC_SECTOR ? size - at : PC_SECTOR;

        pick_sector(sector, f, now, now_len, at, take_new);
        assert_int_equal(pwrite(fd, sector, n, (off_t)at), (ssize_t)n);
    }
    assert_int_equal(ftruncate(fd, (off_t)size), 0);
    close(fd);
    free(now);
}

/* The child: PC_FIRST pages, a flush, a word to the parent, a wait for its answer, then
 * batches of fresh pages (and a delete now and then) until killed; *last (shared) is the
 * highest id it has handed to the store. */
static void pc_child(struct fx *f, int to_parent, int from_parent, volatile uint64_t *last)
{
    struct dstore *s;
    uint8_t key[KEY];
    char c;

    /* pread/pwrite threads die with the process; io_uring writes in flight may land after
     * it is reaped, over the image the parent builds (the parent reopens with io_uring). */
    f->o.io = DSTORE_IO_PSYNC;
    if (dstore_open(&f->o, &s))
        _exit(3);
    *last = PC_FIRST;
    for (uint64_t id = 1; id <= PC_FIRST; id += 8)
        child_put(s, f->bufs, id, 8);
    if (dstore_flush(s) || write(to_parent, "f", 1) != 1 || read(from_parent, &c, 1) != 1)
        _exit(6);
    for (uint64_t n = 0;; n++) {
        uint64_t first = PC_FIRST + 1 + n * 8;
        size_t k = 1 + n % 8;

        *last = first + k - 1;
        child_put(s, f->bufs, first, k);
        if (n % 5 == 4) {
            make_key(first, key);
            dstore_delete(s, key, 1, NULL);
        }
    }
}

struct pc_tally {
    uint64_t served, missed, records, records_served;
};

static int pc_visit(void *arg, const struct dstore_entry *e)
{
    struct fx *f = ((void **)arg)[0];
    struct pc_tally *t = ((void **)arg)[1];
    struct dstore_rpage r = {.key = e->key, .buf = buf_at(f, 1)};
    int res = 1;

    t->records++;
    if (e->status)
        return 0; /* a record that failed its own check: never served */
    assert_int_equal(dstore_get(f->s, &r, 1, &res), 0);
    if (res == 0) {
        assert_true(page_ok(e->key, buf_at(f, 1), page_len));
        t->records_served++;
    }
    return 0;
}

/* Open the cut dir and read everything: nothing wrong; with the old image all of the first
 * pages, with the new one every record. */
static void pc_check(struct fx *f, enum pc_image img, uint64_t last, struct pc_tally *t)
{
    struct pc_tally r = {0};
    void *arg[2] = {f, &r};
    char why[128];

    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    assert_int_equal(dstore_iterate(f->s, pc_visit, arg), 0);
    if (img == PC_NEW)
        assert_int_equal(r.records_served, r.records);
    for (uint64_t id = 1; id <= last; id++) {
        int res = get_id(f, id); /* a hit is checked byte for byte */

        assert_true(res <= 0); /* a miss of any kind: not there, failed a check, cut short */
        if (img == PC_OLD && id <= PC_FIRST)
            assert_int_equal(res, 0);
        r.served += res == 0;
        r.missed += res != 0;
    }
    put_range(f, last + 1, 4); /* and the store still writes */
    for (uint64_t id = last + 1; id <= last + 4; id++)
        assert_int_equal(get_id(f, id), 0);
    assert_int_equal(slots_check(f->s, why, sizeof(why)), 0);
    fx_close(f);
    t->served += r.served;
    t->missed += r.missed;
    t->records += r.records;
    t->records_served += r.records_served;
}

static void pc_round(struct fx *f, enum pc_image img, uint64_t *rng, volatile uint64_t *last,
                     struct pc_tally *t)
{
    struct pc_snapshot snap = {0};
    int up[2], down[2], status;
    char c;
    pid_t pid;

    rm_rf(f->dir);
    assert_int_equal(mkdir(f->dir, 0700), 0);
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        pc_child(f, up[1], down[0], last);
    assert_int_equal(read(up[0], &c, 1), 1);
    snapshot_take(f, &snap);
    assert_int_equal(write(down[1], "g", 1), 1);
    usleep((useconds_t)(rng_mix((*rng)++) % PC_MAX_DELAY_US));
    kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status)); /* it never stops on its own */
    for (int i = 0; i < 4; i++)
        close(i < 2 ? up[i] : down[i - 2]);
    for (int i = 0; i < snap.n; i++)
        cut_file(&snap.f[i], img, rng);
    snapshot_free(&snap);
    pc_check(f, img, *last, t);
}

static void power_cut(struct fx *f, const char *mode)
{
    const char *env = getenv("KVT_CRASH_ROUNDS");
    int rounds = env ? atoi(env) / 4 : 24;
    uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)getpid() << 32, rng = seed;
    struct pc_tally t = {0};
    struct slot_layout l;
    volatile uint64_t *last =
        mmap(NULL, sizeof(*last), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

    need_io();
    assert_true(last != MAP_FAILED);
    assert_int_equal(layout_init(&l, page_len, TOKENS, DSTORE_FORMAT_VERSION), 0);
    f->o.disk_bytes = PC_SLOTS * (uint64_t)l.slot_bytes;
    f->o.sync_ms = 3600000; /* no flush but the child's own: the old image is the disk's */
    f->o.sync_bytes = UINT64_MAX;
    f->o.stripes = DSTORE_STRIPES; /* as users open it: several slabs growing at once */
    for (int round = 0; round < rounds; round++)
        pc_round(f, (enum pc_image)(round % 3), &rng, last, &t);
    print_message("power cut (%s): %d rounds, seed %llu: %llu pages served, %llu missed (lost "
                  "or never written), 0 wrong; %llu of %llu records served\n",
                  mode, rounds, (unsigned long long)seed, (unsigned long long)t.served,
                  (unsigned long long)t.missed, (unsigned long long)t.records_served,
                  (unsigned long long)t.records);
    munmap((void *)last, sizeof(*last));
    assert_true(rounds == 0 || t.served > 0);
}

void test_power_cut_relaxed(void **state)
{
    struct fx *f = *state;

    f->o.sync = DSTORE_SYNC_RELAXED;
    power_cut(f, "relaxed");
}

void test_power_cut_durable(void **state)
{
    power_cut(*state, "durable");
}

/* Pages below a block share blocks with their neighbours (format 3), so a sector torn in one
 * page's write may cut into another's: still served exactly or missed, never wrong, in both
 * modes by turns. */
void test_power_cut_packed(void **state)
{
    struct fx *f = *state;

    f->o.page_bytes = page_len = PC_PACKED;
    power_cut(f, "durable, packed");
    f->o.sync = DSTORE_SYNC_RELAXED;
    power_cut(f, "relaxed, packed");
}
