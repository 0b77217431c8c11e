#include "engine_test.h"

/* ---- options, versions and error strings ---- */

void test_options(void **state)
{
    struct kvt_options o;
    kvt_engine *e = (kvt_engine *)1;

    (void)state;
    kvt_options_init(&o, sizeof(o));
    assert_int_equal(o.size, sizeof(o));
    assert_int_equal(o.page_size, 16);
    assert_int_equal(o.hash_pages, 1);
    assert_int_equal(o.tp_size, 1);
    assert_int_equal(kvt_open(&o, &e), -EINVAL); /* no geometry */
    assert_null(e);

#define REJECT(field, value)                                                                       \
    do {                                                                                           \
        base_options(&o);                                                                          \
        o.field = value;                                                                           \
        assert_int_equal(kvt_open(&o, &e), -EINVAL);                                               \
    } while (0)
    REJECT(page_size, 0);
    REJECT(page_size, 3);
    REJECT(page_size, 512);
    REJECT(backend, 7);
    REJECT(sim_serial, 2);
    REJECT(evict_policy, 6);
    REJECT(hash_pages, 2);
    REJECT(tp_rank, 1);
    REJECT(tp_size, 0);
    REJECT(max_requests, 0);
    REJECT(max_context, 0);
    REJECT(geometry.layers, 0);
    REJECT(geometry.dtype_bytes, 3);
    REJECT(geometry.attention, 2);
    REJECT(geometry.kv_heads, 1u << 31); /* a row size that would overflow */
    REJECT(geometry.layers, 1u << 20);
    REJECT(geometry.kv_lora_rank, 4); /* an MLA field on an MHA geometry */
    REJECT(max_context, 0x80000000u);
    REJECT(device_tokens, 3);     /* less than a page */
    REJECT(store_page_tokens, 6); /* not whole pages of 4 */
    REJECT(store_page_tokens, 2);
    REJECT(store_page_tokens, 8192); /* more than a disk page's head records */
    REJECT(size, 0);
    REJECT(size, sizeof(o.size) - 1); /* not even the size field */
#undef REJECT
    base_options(&o);
    o.device_tokens = 0; /* and no budget either */
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    assert_int_equal(kvt_open(NULL, &e), -EINVAL);
    assert_int_equal(kvt_open(&o, NULL), -EINVAL);

    /* A caller built against a newer header: unknown options must be zero. */
    struct {
        struct kvt_options o;
        uint64_t newer;
    } ext;
    memset(&ext, 0, sizeof(ext));
    base_options(&ext.o);
    ext.o.size = sizeof(ext);
    ext.newer = 1;
    assert_int_equal(kvt_open(&ext.o, &e), -EINVAL);
    ext.newer = 0;
    assert_int_equal(kvt_open(&ext.o, &e), 0);
    kvt_close(e);

    /* A budget instead of a token count: 2 layers x (K + V) x 4 x 2 bytes = 32 B a token. */
    base_options(&o);
    o.device_tokens = 0;
    o.device_bytes = 32 * 100;
    assert_int_equal(kvt_open(&o, &e), 0);
    assert_int_equal(stats(e).device_tokens, 96); /* 100 rows - 4 padding, whole pages */
    kvt_close(e);
    kvt_close(NULL);
}

/* A caller built against an older header passes a shorter struct kvt_options (and struct
 * kvt_stats): init fills only its bytes, open reads only its fields and gives the rest their
 * defaults, stats fills only what it has. The structs are heap blocks of exactly that size,
 * so ASan sees any access past them; the test reads and writes them as bytes, as the older
 * struct is another type. */
#define PUT(buf, type, field, v)                                                                   \
    do {                                                                                           \
        __typeof__(((type *)0)->field) v_ = (v);                                                   \
        memcpy((uint8_t *)(buf) + offsetof(type, field), &v_, sizeof(v_));                         \
    } while (0)
#define GET(buf, type, field, out)                                                                 \
    memcpy(&(out), (uint8_t *)(buf) + offsetof(type, field), sizeof(out))

void test_older_caller(void **state)
{
    size_t sz = offsetof(struct kvt_options, model_id), got_size; /* up to hash_pages */
    struct kvt_options full;
    uint8_t *raw = malloc(sizeof(full));
    uint32_t u32;
    uint64_t u64;
    kvt_engine *e = NULL;

    (void)state;
    memset(raw, 0xab, sizeof(full));
    kvt_options_init((struct kvt_options *)raw, sz);
    GET(raw, struct kvt_options, size, got_size);
    assert_int_equal(got_size, sz);
    GET(raw, struct kvt_options, page_size, u32);
    assert_int_equal(u32, 16);
    for (size_t i = sz; i < sizeof(full); i++)
        assert_int_equal(raw[i], 0xab); /* not the caller's to write */
    free(raw);

    uint8_t *old = malloc(sz);
    base_options(&full);
    memcpy(old, &full, sz);
    PUT(old, struct kvt_options, size, sz);
    PUT(old, struct kvt_options, page_size, 8);
    assert_int_equal(kvt_open((struct kvt_options *)old, &e), 0);
    assert_int_equal(e->opts.page_size, 8);
    assert_int_equal(e->opts.max_requests, 4);
    assert_int_equal(e->opts.write_threshold, 2); /* past its size: the defaults */
    assert_int_equal(e->opts.tp_size, 1);
    assert_null(e->below);
    assert_null(e->stats);
    free(old);

    size_t ssz = offsetof(struct kvt_stats, cached_tokens);
    uint8_t *st = malloc(ssz);
    PUT(st, struct kvt_stats, size, ssz);
    assert_int_equal(kvt_stats(e, (struct kvt_stats *)st), 0);
    GET(st, struct kvt_stats, size, got_size);
    assert_int_equal(got_size, ssz);
    GET(st, struct kvt_stats, page_size, u32);
    assert_int_equal(u32, 8);
    GET(st, struct kvt_stats, device_tokens, u64);
    assert_int_equal(u64, 64);
    free(st);
    kvt_close(e);
}
#undef PUT
#undef GET

/* A caller built against a newer header: init zeroes its fields past ours and keeps its size,
 * so an option this library does not know, once set, is refused rather than ignored. */
void test_newer_caller(void **state)
{
    struct {
        struct kvt_options o;
        uint64_t newer;
    } ext;
    kvt_engine *e = NULL;

    (void)state;
    memset(&ext, 0xab, sizeof(ext));
    kvt_options_init(&ext.o, sizeof(ext));
    assert_int_equal(ext.o.size, sizeof(ext));
    assert_int_equal(ext.newer, 0);
    struct kvt_options base;
    base_options(&base);
    memcpy((uint8_t *)&ext.o + sizeof(size_t), (uint8_t *)&base + sizeof(size_t),
           sizeof(base) - sizeof(size_t));
    ext.newer = 5;
    assert_int_equal(kvt_open(&ext.o, &e), -EINVAL);
    ext.newer = 0;
    assert_int_equal(kvt_open(&ext.o, &e), 0);

    struct {
        struct kvt_stats st;
        uint64_t newer;
    } sx;
    memset(&sx, 0xab, sizeof(sx));
    sx.st.size = sizeof(sx);
    assert_int_equal(kvt_stats(e, &sx.st), 0);
    assert_int_equal(sx.st.size, sizeof(struct kvt_stats));
    assert_int_equal(sx.newer, 0);
    assert_int_equal(sx.st.device_tokens, 64);
    kvt_close(e);
}

void test_backend_choice(void **state)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    (void)state;
    base_options(&o);
    o.backend = KVT_BACKEND_AUTO;
    assert_int_equal(kvt_open(&o, &e), 0);
    uint32_t chosen = stats(e).backend;
    kvt_close(e);
    o.backend = KVT_BACKEND_CUDA;
    int rc = kvt_open(&o, &e);
    if (chosen == KVT_BACKEND_SIM) {
        /* auto fell back to sim, so cuda cannot be had: a clear error, not a crash. */
        assert_int_equal(rc, KVT_ENOBACKEND);
    } else {
        assert_int_equal(rc, 0);
        kvt_close(e);
    }
}

void test_strerror(void **state)
{
    (void)state;
    assert_string_equal(kvt_strerror(0), "success");
    assert_non_null(strstr(kvt_strerror(KVT_ENOBACKEND), "backend"));
    assert_string_equal(kvt_strerror(-EINVAL), kvt_strerror(EINVAL));
    assert_non_null(strstr(kvt_strerror(-ENOMEM), "memory"));
    assert_string_equal(kvt_strerror(-99999), "unknown error");
    assert_string_equal(kvt_strerror(INT_MIN), "unknown error");
}

void test_version(void **state)
{
    int major = -1, minor = -1, patch = -1;
    char want[32];

    (void)state;
    snprintf(want, sizeof(want), "%d.%d.%d", KVT_VERSION_MAJOR, KVT_VERSION_MINOR,
             KVT_VERSION_PATCH);
    assert_string_equal(kvt_version(&major, &minor, &patch), want);
    assert_int_equal(major, KVT_VERSION_MAJOR);
    assert_int_equal(minor, KVT_VERSION_MINOR);
    assert_int_equal(patch, KVT_VERSION_PATCH);
    assert_string_equal(kvt_version(NULL, NULL, NULL), want);
}

void test_fingerprint(void **state)
{
    struct kvt_options o;
    kvt_engine *e;
    uint8_t a[32], b[32], c[32];

    (void)state;
    base_options(&o);
    o.model_id = "llama";
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_fingerprint(e, a);
    kvt_close(e);
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_fingerprint(e, b);
    kvt_close(e);
    assert_memory_equal(a, b, 32);
    o.model_id = "llamb";
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_fingerprint(e, c);
    kvt_close(e);
    assert_memory_not_equal(a, c, 32);
    memset(c, 0xab, sizeof(c));
    kvt_fingerprint(NULL, c); /* no engine: zeros */
    assert_memory_equal(c, (uint8_t[32]){0}, 32);
    kvt_fingerprint(NULL, NULL);
    /* A store page of several pages names pages apart; of one it changes nothing. */
    o.model_id = "llama";
    o.store_page_tokens = o.page_size;
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_fingerprint(e, c);
    kvt_close(e);
    assert_memory_equal(a, c, 32);
    o.store_page_tokens = 4 * o.page_size;
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_fingerprint(e, c);
    kvt_close(e);
    assert_memory_not_equal(a, c, 32);
    o.store_page_tokens = 0;
    o.tp_size = 2;
    o.tp_rank = 1;
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_fingerprint(e, c);
    kvt_close(e);
    assert_memory_not_equal(a, c, 32);
}

/* options.remote: a URL that is not redis(s)://[:PASSWORD@]HOST[:PORT] is -EINVAL; a good one
 * opens without a server (it connects on the first op) where this build has the Redis store,
 * else KVT_ENOBACKEND; it needs the host tier. */
void test_remote_url(void **state)
{
    static const char *const bad[] = {"http://h:1",  "redis://",        "redis://h:0",
                                      "redis://h:x", "redis://h:70000", "redis://u@h:1",
                                      "redis://h/0", "redis://:pw@"};
    struct kvt_options o;
    kvt_engine *e = NULL;

#ifdef KVT_HAVE_REDIS
    const int refused = -EINVAL;
#else
    const int refused = KVT_ENOBACKEND; /* any remote, before its URL is looked at */
#endif

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        base_options(&o);
        o.host_ratio = 2.0;
        o.remote = bad[i];
        if (kvt_open(&o, &e) != refused)
            fail_msg("remote %s was not refused", bad[i]);
    }
    base_options(&o);
    o.remote = "redis://127.0.0.1:1"; /* no host tier */
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    o.host_ratio = 2.0;
    /* A password alone, and an ACL user's (since 0.5): the server is not asked at open. */
    for (int i = 0; i < 2; i++) {
        o.remote = i ? "redis://kv:s%40cret@127.0.0.1:1" : "redis://:secret@127.0.0.1:1";
        int rc = kvt_open(&o, &e);
#ifdef KVT_HAVE_REDIS
        assert_int_equal(rc, 0);
        kvt_close(e);
#else
        assert_int_equal(rc, KVT_ENOBACKEND);
#endif
    }
#ifdef KVT_HAVE_REDIS
    /* TLS (since 0.6): rediss:// opens with the system's CAs; TLS files with redis://, a
     * mixed list, a file that cannot be read or holds no PEM are -EINVAL. */
    o.remote = "rediss://127.0.0.1:1,127.0.0.1:2";
    assert_int_equal(kvt_open(&o, &e), 0);
    kvt_close(e);
    o.remote = "rediss://127.0.0.1:1,redis://127.0.0.1:2";
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    char not_pem[96];
    assert_int_equal(fixture_data_dir(not_pem, sizeof(not_pem), "not-pem"), 0);
    strcat(not_pem, "/ca.pem");
    int fd = open(not_pem, O_WRONLY | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0 && write(fd, "no PEM here\n", 12) == 12);
    close(fd);
    o.remote = "redis://127.0.0.1:1";
    o.remote_tls_ca = not_pem;
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
    o.remote = "rediss://127.0.0.1:1";
    assert_int_equal(kvt_open(&o, &e), -EINVAL); /* no PEM in it */
    unlink(not_pem);
    *strrchr(not_pem, '/') = '\0';
    fixture_remove_tree(not_pem);
    o.remote_tls_ca = "/nonexistent/ca.pem";
    assert_int_equal(kvt_open(&o, &e), -EINVAL);
#endif
}
