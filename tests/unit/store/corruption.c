#include "store_test.h"

/* ---- corruption ---- */

struct where {
    uint8_t key[KEY];
    uint32_t slab, slot;
    bool found;
};

static int find_entry(void *arg, const struct dstore_entry *e)
{
    struct where *w = arg;

    if (memcmp(e->key, w->key, KEY))
        return 0;
    w->slab = e->slab;
    w->slot = e->slot;
    w->found = true;
    return 1;
}

static struct where locate(struct fx *f, uint64_t id)
{
    struct where w = {0};

    make_key(id, w.key);
    dstore_iterate(f->s, find_entry, &w);
    assert_true(w.found);
    return w;
}

static void slab_path(const struct fx *f, uint32_t slab, char *path, size_t len)
{
    snprintf(path, len, "%s/slabs/%04u.slab", f->dir, slab);
}

static void flip_byte(struct fx *f, struct where w, size_t at)
{
    char path[128];
    uint8_t b;
    int fd;

    slab_path(f, w.slab, path, sizeof(path));
    fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    off_t off = (off_t)(SLAB_HEAD_BYTES + w.slot * SLOT + at);
    assert_int_equal(pread(fd, &b, 1, off), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, off), 1);
    assert_int_equal(fsync(fd), 0);
    close(fd);
}

void test_flipped_bytes(void **state)
{
    struct fx *f = *state;

    fx_open(f);
    put_range(f, 1, 6);
    flip_byte(f, locate(f, 3), 100);
    assert_int_equal(get_id(f, 3), KVT_ECORRUPT);
    assert_int_equal(dstore_flush(f->s), 0);
    assert_false(has_id(f, 3));
    assert_int_equal(get_id(f, 3), -ENOENT);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.err_checksum, 1);
    assert_int_equal(st.dropped, 1);
    assert_int_equal(st.pages, 5);
    /* the store keeps working, and the slot is usable again */
    put_range(f, 3, 1);
    assert_int_equal(get_id(f, 3), 0);
    /* flipped while closed: found at the next read after reopening */
    flip_byte(f, locate(f, 5), PAGE - 1);
    fx_reopen(f);
    assert_int_equal(get_id(f, 5), KVT_ECORRUPT);
    for (uint64_t id = 1; id <= 6; id++)
        if (id != 5)
            assert_int_equal(get_id(f, id), 0);
}

void test_truncated_slab(void **state)
{
    struct fx *f = *state;
    char path[128];

    fx_open(f);
    put_range(f, 1, 20); /* slabs of 16 slots: 0000 full, 0001 holds 4 */
    struct where w = locate(f, 10);
    assert_int_equal(w.slab, 0);
    assert_int_equal(w.slot, 9);
    dstore_close(f->s);
    f->s = NULL;
    slab_path(f, 0, path, sizeof(path));
    assert_int_equal(truncate(path, SLAB_HEAD_BYTES + 8 * SLOT), 0); /* slots 8..15 gone */
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    assert_int_not_equal(get_id(f, 10), 0); /* before or after the rebuild: never served */
    assert_int_equal(dstore_wait_ready(f->s), 0);
    for (uint64_t id = 1; id <= 20; id++) {
        struct where at = {0};

        make_key(id, at.key);
        dstore_iterate(f->s, find_entry, &at);
        bool lost = at.found ? false : true;
        assert_int_equal(get_id(f, id), lost ? -ENOENT : 0);
        assert_int_equal(lost, id >= 9 && id <= 16);
    }
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.pages, 12);
    assert_true(st.err_bounds >= 8);
    /* writes refill the truncated slab */
    put_range(f, 100, 10);
    for (uint64_t id = 100; id < 110; id++)
        assert_int_equal(get_id(f, id), 0);
    struct stat sb;
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, SLAB_HEAD_BYTES + 16 * SLOT);
}

/* Junk written into an index record, and checked records that lie, with LMDB directly. */
static void poke_records(const char *dir, const uint8_t *junk_key, const uint8_t *liar_key,
                         const uint8_t *victim_key, const uint8_t *long_key)
{
    static uint8_t longer[REC_HEAD_BYTES + 4 * (TOKENS + 100)];
    char path[96];
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_val k = {KEY, (void *)junk_key}, v;
    uint8_t junk[REC_HEAD_BYTES + 4 * TOKENS], rec[REC_HEAD_BYTES + 4 * TOKENS];
    struct drec r, victim;

    snprintf(path, sizeof(path), "%s/index", dir);
    assert_int_equal(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 2);
    assert_int_equal(mdb_env_open(env, path, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "pages", 0, &dbi), 0);
    /* junk of the right size, then of a wrong size */
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    memcpy(junk, v.mv_data, sizeof(junk));
    for (size_t i = 4; i < sizeof(junk); i += 7)
        junk[i] ^= 0x5a;
    v = (MDB_val){sizeof(junk), junk};
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    /* a well-formed record that names another page's slot */
    k.mv_data = (void *)victim_key;
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    assert_int_equal(rec_decode(victim_key, v.mv_data, v.mv_size, &victim), 0);
    k.mv_data = (void *)liar_key;
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    assert_int_equal(rec_decode(liar_key, v.mv_data, v.mv_size, &r), 0);
    r.slab = victim.slab;
    r.slot = victim.slot;
    rec_encode(liar_key, &r, NULL, rec);
    v = (MDB_val){sizeof(rec), rec};
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    /* a well-formed record with more tokens than the dir's pages have */
    k.mv_data = (void *)long_key;
    assert_int_equal(mdb_get(txn, dbi, &k, &v), 0);
    assert_int_equal(rec_decode(long_key, v.mv_data, v.mv_size, &r), 0);
    r.ntokens = TOKENS + 100;
    rec_encode(long_key, &r, NULL, longer);
    v = (MDB_val){sizeof(longer), longer};
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

void test_garbled_index(void **state)
{
    struct fx *f = *state;
    uint8_t junk[KEY], liar[KEY], victim[KEY], longer[KEY];

    fx_open(f);
    put_range(f, 1, 8);
    dstore_close(f->s);
    f->s = NULL;
    make_key(2, junk);
    make_key(4, liar);
    make_key(6, victim);
    make_key(7, longer);
    poke_records(f->dir, junk, liar, victim, longer);
    assert_int_equal(dstore_open(&f->o, &f->s), 0);
    /* whatever the rebuild has done yet: never served wrong */
    assert_int_not_equal(get_id(f, 2), 0);
    assert_int_not_equal(get_id(f, 4), 0);
    assert_int_not_equal(get_id(f, 7), 0);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    assert_int_equal(dstore_flush(f->s), 0);
    assert_false(has_id(f, 2));
    for (uint64_t id = 1; id <= 8; id++)
        assert_int_equal(get_id(f, id), id == 2 || id == 4 || id == 7 ? -ENOENT : 0);
    struct dstore_stats st = stats_of(f);
    assert_true(st.err_record >= 2);
    assert_int_equal(st.pages, 5);
    /* after a restart the survivors still serve */
    fx_reopen(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    assert_int_equal(get_id(f, 8), 0);
    put_range(f, 2, 1);
    assert_int_equal(get_id(f, 2), 0);
}

/* Every page the store claims is byte-exact and every record points at written bytes. */
void check_all(struct fx *f, uint64_t first, uint64_t last)
{
    for (uint64_t id = first; id <= last; id++) {
        int res = get_id(f, id);

        assert_true(res == 0 || res == -ENOENT);
        assert_int_equal(res == 0, has_id(f, id));
    }
}

/* A lower capacity at open: the pages past it are dropped, oldest first, in transactions
 * the index has room for (a map sized for the smaller capacity once could not hold them);
 * the slab files past it go, and every open after serves what is left without an error. */
void test_capacity_lowered(void **state)
{
    struct fx *f = *state;
    char path[128];
    struct stat sb;

    fx_open(f); /* 64 slots in slabs of 16 */
    put_range(f, 1, 20);
    put_range(f, 21, 20);
    f->o.disk_bytes = 20ull * SLOT; /* slab 0 whole, 4 slots of slab 1 */
    fx_reopen(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    struct dstore_stats st = stats_of(f);
    assert_int_equal(st.pages, 20);
    assert_int_equal(st.dropped, 20);
    assert_int_equal(st.err_index + st.err_nospc + st.err_bounds, 0);
    for (uint64_t id = 1; id <= 40; id++)
        assert_int_equal(get_id(f, id), id <= 20 ? 0 : -ENOENT);
    slab_path(f, 2, path, sizeof(path));
    assert_int_equal(stat(path, &sb), -1); /* past the capacity: gone */
    slab_path(f, 1, path, sizeof(path));
    assert_int_equal(stat(path, &sb), 0);
    assert_int_equal(sb.st_size, SLAB_HEAD_BYTES + 4 * SLOT);
    /* it keeps working: writes evict within the new capacity */
    put_range(f, 100, 10);
    fx_reopen(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    st = stats_of(f);
    assert_int_equal(st.pages, 20);
    assert_int_equal(st.err_index + st.err_nospc + st.err_bounds + st.dropped, 0);
    check_all(f, 1, 110);
}

/* What a data dir holds that kvtier did not make is never followed, blocked on or written
 * through: a FIFO, a symbolic link and a device where slab files should be are no slabs (a
 * read-only open does not hang; their pages are misses), and a writer replaces them; a
 * dangling link named lock is replaced, its target never created. */
void test_not_regular_files(void **state)
{
    struct fx *f = *state;
    char path[128], target[160];
    struct stat sb;

    f->o.slab_bytes = 8ull * SLOT;
    fx_open(f);
    put_range(f, 1, 24); /* slabs 0, 1 and 2 */
    dstore_close(f->s);
    f->s = NULL;
    slab_path(f, 0, path, sizeof(path));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    slab_path(f, 1, path, sizeof(path));
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink("/dev/zero", path), 0);
    snprintf(path, sizeof(path), "%s/lock", f->dir);
    snprintf(target, sizeof(target), "%s.lock-target", f->dir);
    assert_int_equal(unlink(path), 0);
    assert_int_equal(symlink(target, path), 0);

    /* read-only: opens at once, the pages of slabs 0 and 1 are misses, slab 2 serves */
    struct dstore_options ro = f->o;
    ro.flags = DSTORE_READONLY;
    assert_int_equal(dstore_open(&ro, &f->s), 0);
    for (uint64_t id = 1; id <= 24; id++)
        assert_int_equal(get_id(f, id) == 0, id > 16);
    dstore_close(f->s);
    f->s = NULL;

    /* a writer: the junk is replaced, the lock's target never made */
    fx_open(f);
    assert_int_equal(dstore_wait_ready(f->s), 0);
    assert_int_equal(stat(target, &sb), -1);
    snprintf(path, sizeof(path), "%s/lock", f->dir);
    assert_int_equal(lstat(path, &sb), 0);
    assert_true(S_ISREG(sb.st_mode));
    put_range(f, 100, 24);
    for (uint32_t slab = 0; slab < 2; slab++) {
        slab_path(f, slab, path, sizeof(path));
        assert_int_equal(lstat(path, &sb), 0);
        assert_true(S_ISREG(sb.st_mode));
    }
    check_all(f, 1, 124);
    for (uint64_t id = 100; id < 124; id++)
        assert_true(has_id(f, id) || stats_of(f).evicted > 0);
}

static int count_visit(void *arg, const struct dstore_entry *e)
{
    (void)e;
    (*(uint64_t *)arg)++;
    return 0;
}

/* A reader beside a writer (in another process: in this one a writer is refused while a store
 * has the dir open, since LMDB allows a process one environment of a file) that grew the index
 * past the reader's map (MDB_MAP_RESIZED): the reader adopts the larger map between its
 * snapshots and goes on reading. */
void test_reader_beside_growth(void **state)
{
    struct fx *f = *state;
    struct dstore *r, *w = NULL;
    struct dstore_options ro;
    int up[2], down[2], status;
    uint64_t n = 0;
    char c = 0;
    pid_t pid;

    /* The writer's process is forked first, while this one has no thread (a fork beside the
     * I/O engine's threads is what ThreadSanitizer refuses); it opens on a word. */
    f->o.disk_bytes = 8192ull * SLOT;
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(120); /* never outlives a failed parent */
        close(up[0]);
        close(down[1]);
        if (read(down[0], &c, 1) != 1)
            _exit(2);
        f->o.map_bytes = 64ull << 20;
        c = dstore_open(&f->o, &w) == 0 ? 'y' : 'n';
        for (uint64_t id = 100; c == 'y' && id < 100 + 6000; id += 30)
            child_put(w, f->bufs, id, 30); /* the index file grows past 512 KiB */
        if (write(up[1], &c, 1) != 1 || read(down[0], &c, 1) != 1)
            _exit(2);
        dstore_close(w);
        _exit(0);
    }
    close(up[1]);
    close(down[0]);
    f->o.map_bytes = 512ull << 10; /* a small map, recorded in the index */
    fx_open(f);
    put_range(f, 1, 8);
    fx_close(f);
    ro = f->o;
    ro.flags = DSTORE_READONLY;
    assert_int_equal(dstore_open(&ro, &r), 0); /* takes the writer's map */
    f->o.map_bytes = 64ull << 20;
    assert_int_equal(dstore_open(&f->o, &w), -EBUSY); /* not in this process */
    assert_int_equal(write(down[1], "g", 1), 1);
    assert_int_equal(read(up[0], &c, 1), 1); /* EOF (0) when the writer's process died */
    assert_int_equal(c, 'y');
    f->s = r; /* the helpers read through the reader, the writer still open */
    for (uint64_t id = 100; id < 6100; id += 97)
        assert_int_equal(get_id(f, id), 0);
    assert_int_equal(dstore_iterate(r, count_visit, &n), 0);
    assert_int_equal(n, 6008);
    assert_int_equal(write(down[1], &c, 1), 1);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(up[0]);
    close(down[1]);
    f->s = NULL;
    dstore_close(r);
}
