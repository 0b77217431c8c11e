/* Transfer engine on the sim backend: byte-exact round trips, ordering, per-layer waits. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "device/backend.h"
#include "device/kv_pool.h"
#include "host/host_pool.h"
#include "host/transfer.h"

#define PS 4         /* tokens per page */
#define MAX_ROW 1024 /* bytes of the widest row below */
#define FILLER 9999  /* tag of pages no copy should reach */

/* V narrower than K, so a K/V mix-up cannot copy the right bytes. */
static const struct kvt_geometry mha = {.attention = KVT_ATTN_MHA,
                                        .layers = 4,
                                        .kv_heads = 2,
                                        .head_dim = 8,
                                        .v_head_dim = 4,
                                        .dtype_bytes = 2};
static const struct kvt_geometry mla = {.attention = KVT_ATTN_MLA,
                                        .layers = 3,
                                        .kv_lora_rank = 12,
                                        .qk_rope_head_dim = 4,
                                        .dtype_bytes = 2};

/* Wide rows: a page of K is a 4 KiB span, which the sim worker copies with streaming stores,
 * and V's 2 KiB span goes by memcpy; both paths in one op. */
static const struct kvt_geometry wide = {.attention = KVT_ATTN_MHA,
                                         .layers = 2,
                                         .kv_heads = 4,
                                         .head_dim = 128,
                                         .v_head_dim = 64,
                                         .dtype_bytes = 2};

struct rig {
    struct kv_pool dev;
    struct host_pool host;
    struct xfer_engine *x;
};

/* A device pool of dev_pages pages (page 0 the padding), a host pool, and the engine. */
static void rig_up(struct rig *r, const struct kvt_geometry *g, uint32_t layout, uint32_t dev_pages,
                   uint32_t host_pages, const struct xfer_config *cfg)
{
    assert_true(kv_row_bytes(g, 0) <= MAX_ROW);
    assert_int_equal(kv_pool_init(&r->dev, &dev_backend_sim, g, (uint64_t)dev_pages * PS), 0);
    assert_int_equal(host_pool_init(&r->host, &dev_backend_sim, g, PS, host_pages, layout), 0);
    assert_int_equal(xfer_create(&r->dev, &r->host, cfg, &r->x), 0);
}

static void rig_down(struct rig *r)
{
    xfer_destroy(r->x);
    host_pool_finish(&r->host);
    kv_pool_finish(&r->dev);
}

/* The byte a page tagged tag holds at (layer, K/V, token row, byte): distinct per tag and
 * place, so a copy to or from the wrong spot shows. */
static uint8_t pattern(uint32_t tag, uint32_t layer, int w, uint32_t row, size_t b)
{
    uint64_t h = ((uint64_t)tag << 32) ^ ((uint64_t)layer << 20) ^ ((uint64_t)w << 16) ^ row;

    h = (h ^ (h >> 31)) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    return (uint8_t)((h >> (8 * (b % 8))) + b);
}

static void make_rows(const struct rig *r, uint32_t tag, uint32_t layer, int w, uint8_t *out)
{
    size_t rb = r->dev.row_bytes[w];

    for (uint32_t i = 0; i < PS; i++)
        for (size_t b = 0; b < rb; b++)
            out[i * rb + b] = pattern(tag, layer, w, i, b);
}

static void page_slots(uint32_t page, int32_t *slots)
{
    for (uint32_t i = 0; i < PS; i++)
        slots[i] = (int32_t)(page * PS + i);
}

static void fill_dev_layer(struct rig *r, uint32_t page, uint32_t layer, uint32_t tag)
{
    uint8_t k[PS * MAX_ROW], v[PS * MAX_ROW];
    int32_t slots[PS];

    page_slots(page, slots);
    make_rows(r, tag, layer, 0, k);
    if (r->dev.row_bytes[1])
        make_rows(r, tag, layer, 1, v);
    assert_int_equal(kv_pool_write(&r->dev, layer, slots, PS, k, r->dev.row_bytes[1] ? v : NULL),
                     0);
}

static void fill_dev(struct rig *r, uint32_t page, uint32_t tag)
{
    for (uint32_t l = 0; l < r->dev.geo.layers; l++)
        fill_dev_layer(r, page, l, tag);
}

static bool dev_layer_holds(const struct rig *r, uint32_t page, uint32_t layer, uint32_t tag)
{
    uint8_t k[PS * MAX_ROW], v[PS * MAX_ROW], want[PS * MAX_ROW];
    int32_t slots[PS];
    bool mla_pool = !r->dev.row_bytes[1];

    page_slots(page, slots);
    assert_int_equal(kv_pool_read(&r->dev, layer, slots, PS, k, mla_pool ? NULL : v), 0);
    make_rows(r, tag, layer, 0, want);
    if (memcmp(k, want, PS * r->dev.row_bytes[0]))
        return false;
    if (mla_pool)
        return true;
    make_rows(r, tag, layer, 1, want);
    return memcmp(v, want, PS * r->dev.row_bytes[1]) == 0;
}

static bool dev_holds(const struct rig *r, uint32_t page, uint32_t tag)
{
    for (uint32_t l = 0; l < r->dev.geo.layers; l++)
        if (!dev_layer_holds(r, page, l, tag))
            return false;
    return true;
}

static void fill_host(struct rig *r, uint32_t page, uint32_t tag)
{
    for (uint32_t l = 0; l < r->host.layers; l++)
        for (int w = 0; w < 2; w++)
            if (r->host.row[w])
                make_rows(r, tag, l, w, host_pool_rows(&r->host, page, l, w));
}

static bool host_holds(const struct rig *r, uint32_t page, uint32_t tag)
{
    uint8_t want[PS * MAX_ROW];

    for (uint32_t l = 0; l < r->host.layers; l++)
        for (int w = 0; w < 2; w++) {
            if (!r->host.row[w])
                continue;
            make_rows(r, tag, l, w, want);
            if (memcmp(host_pool_rows(&r->host, page, l, w), want, PS * r->host.row[w]))
                return false;
        }
    return true;
}

static bool host_is_zero(const struct rig *r, uint32_t page)
{
    for (uint32_t l = 0; l < r->host.layers; l++)
        for (int w = 0; w < 2; w++) {
            const uint8_t *p = r->host.row[w] ? host_pool_rows(&r->host, page, l, w) : NULL;

            for (size_t b = 0; p && b < PS * r->host.row[w]; b++)
                if (p[b])
                    return false;
        }
    return true;
}

static bool in_list(const uint32_t *list, size_t n, uint32_t v)
{
    for (size_t i = 0; i < n; i++)
        if (list[i] == v)
            return true;
    return false;
}

static uint64_t submit(struct rig *r, enum xfer_dir dir, const uint32_t *dev, const uint32_t *host,
                       size_t n)
{
    uint64_t id = 0;

    assert_int_equal(xfer_submit(r->x, dir, dev, host, n, NULL, &id), 0);
    return id;
}

/* ---- round trips ---- */

/* One run of four where both sides climb; scattered pages; a run broken on the host side
 * only; one broken on the device side only. */
static const uint32_t src_dev[] = {1, 2, 3, 4, 9, 7, 11, 12, 13, 14, 15, 5};
static const uint32_t via_host[] = {5, 6, 7, 8, 20, 2, 30, 10, 11, 3, 12, 13};
static const uint32_t dst_dev[] = {10, 11, 12, 13, 2, 14, 4, 5, 6, 7, 1, 8};
#define NTRIP (sizeof(src_dev) / sizeof(src_dev[0]))
#define TRIP_DEV_PAGES 16
#define TRIP_HOST_PAGES 40

static void check_padding_page_untouched(const struct rig *r)
{
    uint8_t k[PS * MAX_ROW], v[PS * MAX_ROW], zero[PS * MAX_ROW] = {0};
    int32_t slots[PS];
    bool mla_pool = !r->dev.row_bytes[1];

    page_slots(0, slots);
    for (uint32_t l = 0; l < r->dev.geo.layers; l++) {
        assert_int_equal(kv_pool_read(&r->dev, l, slots, PS, k, mla_pool ? NULL : v), 0);
        assert_memory_equal(k, zero, PS * r->dev.row_bytes[0]);
        if (!mla_pool)
            assert_memory_equal(v, zero, PS * r->dev.row_bytes[1]);
    }
}

static void backup_then_check_host(struct rig *r)
{
    uint64_t id;

    for (uint32_t i = 0; i < NTRIP; i++)
        fill_dev(r, src_dev[i], 100 + i);
    id = submit(r, XFER_BACKUP, src_dev, via_host, NTRIP);
    assert_int_equal(id, 1);
    assert_int_equal(xfer_wait(r->x, XFER_BACKUP, id), 0);
    assert_int_equal(xfer_status(r->x, XFER_BACKUP, id), 0);
    for (uint32_t i = 0; i < NTRIP; i++)
        assert_true(host_holds(r, via_host[i], 100 + i));
    /* Runs copy no further than their pages. */
    for (uint32_t p = 0; p < TRIP_HOST_PAGES; p++)
        if (!in_list(via_host, NTRIP, p))
            assert_true(host_is_zero(r, p));
}

static void load_then_check_dev(struct rig *r)
{
    uint64_t id;

    for (uint32_t p = 1; p < TRIP_DEV_PAGES; p++)
        fill_dev(r, p, FILLER);
    id = submit(r, XFER_LOAD, dst_dev, via_host, NTRIP);
    assert_int_equal(id, 1);
    assert_int_equal(xfer_wait(r->x, XFER_LOAD, id), 0);
    for (uint32_t i = 0; i < NTRIP; i++)
        assert_true(dev_holds(r, dst_dev[i], 100 + i));
    for (uint32_t p = 1; p < TRIP_DEV_PAGES; p++)
        if (!in_list(dst_dev, NTRIP, p))
            assert_true(dev_holds(r, p, FILLER));
    check_padding_page_untouched(r);
}

static void round_trip(const struct kvt_geometry *g, uint32_t layout)
{
    struct xfer_config cfg = {.max_delay_us = 100, .seed = 7};
    struct rig r;

    rig_up(&r, g, layout, TRIP_DEV_PAGES, TRIP_HOST_PAGES, &cfg);
    backup_then_check_host(&r);
    load_then_check_dev(&r);
    assert_int_equal(xfer_bytes(r.x, XFER_BACKUP), NTRIP * r.host.page_bytes);
    assert_int_equal(xfer_bytes(r.x, XFER_LOAD), NTRIP * r.host.page_bytes);
    rig_down(&r);
}

static void test_round_trip_mha_page_first(void **state)
{
    (void)state;
    round_trip(&mha, HOST_PAGE_FIRST);
}

static void test_round_trip_mha_layer_first(void **state)
{
    (void)state;
    round_trip(&mha, HOST_LAYER_FIRST);
}

static void test_round_trip_mla_page_first(void **state)
{
    (void)state;
    round_trip(&mla, HOST_PAGE_FIRST);
}

static void test_round_trip_mla_layer_first(void **state)
{
    (void)state;
    round_trip(&mla, HOST_LAYER_FIRST);
}

static void test_round_trip_wide(void **state)
{
    (void)state;
    round_trip(&wide, HOST_PAGE_FIRST);
    round_trip(&wide, HOST_LAYER_FIRST);
}

/* A single long run and a fully scattered list of the same pages move the same bytes. */
static void test_coalesced_and_scattered(void **state)
{
    static const uint32_t run_dev[] = {3, 4, 5, 6, 7, 8, 9, 10};
    static const uint32_t run_host[] = {16, 17, 18, 19, 20, 21, 22, 23};
    static const uint32_t scat_dev[] = {11, 1, 14, 2, 13, 15, 12, 3};
    static const uint32_t scat_host[] = {23, 16, 21, 18, 20, 17, 22, 19};
    uint32_t layouts[] = {HOST_PAGE_FIRST, HOST_LAYER_FIRST};

    (void)state;
    for (int i = 0; i < 2; i++) {
        struct rig r;

        rig_up(&r, &mha, layouts[i], 16, 32, NULL);
        for (uint32_t p = 0; p < 8; p++)
            fill_dev(&r, run_dev[p], 200 + p);
        uint64_t b = submit(&r, XFER_BACKUP, run_dev, run_host, 8);
        assert_int_equal(xfer_wait(r.x, XFER_BACKUP, b), 0);
        uint64_t l = submit(&r, XFER_LOAD, scat_dev, scat_host, 8);
        assert_int_equal(xfer_wait(r.x, XFER_LOAD, l), 0);
        for (uint32_t p = 0; p < 8; p++)
            assert_true(dev_holds(&r, scat_dev[p], 200 + (scat_host[p] - 16)));
        assert_true(host_is_zero(&r, 15) && host_is_zero(&r, 24));
        rig_down(&r);
    }
}

/* ---- ordering ---- */

#define NOPS 48
#define ORDER_DEV_PAGES 64
#define LOAD_DEV_SPAN 16   /* loads land on device pages 1..16, each three times */
#define BACKUP_DEV_BASE 33 /* backups read device pages 33..63, which loads never touch */

struct order_state {
    uint64_t ids[2];  /* the last id issued per direction */
    uint64_t seen[2]; /* the highest watermark seen */
    uint64_t bytes[2];
};

/* The watermark only climbs, never passes what was issued, and covers clean ops. */
static void watch(struct rig *r, struct order_state *o)
{
    for (int d = 0; d < 2; d++) {
        uint64_t done = xfer_done(r->x, (enum xfer_dir)d);

        assert_true(done >= o->seen[d] && done <= o->ids[d]);
        o->seen[d] = done;
        if (done)
            assert_int_equal(xfer_status(r->x, (enum xfer_dir)d, done), 0);
    }
}

/* Every seventh op of each kind moves nothing: it still takes its id and completes in turn. */
static void submit_order_pair(struct rig *r, struct order_state *o, uint32_t i)
{
    uint32_t ldev = 1 + i % LOAD_DEV_SPAN, lhost = i;
    uint32_t bdev = BACKUP_DEV_BASE + i % 31, bhost = 64 + i;
    size_t n = i % 7 == 3 ? 0 : 1;
    uint64_t id;

    id = submit(r, XFER_LOAD, &ldev, &lhost, n);
    assert_int_equal(id, ++o->ids[XFER_LOAD]);
    o->bytes[XFER_LOAD] += n * r->host.page_bytes;
    id = submit(r, XFER_BACKUP, &bdev, &bhost, n);
    assert_int_equal(id, ++o->ids[XFER_BACKUP]);
    o->bytes[XFER_BACKUP] += n * r->host.page_bytes;
    watch(r, o);
}

/* Each device page got three loads: the last one submitted wins. */
static void check_order_data(const struct rig *r)
{
    for (uint32_t i = 0; i < NOPS; i++) {
        bool moved = i % 7 != 3;
        uint32_t dev = 1 + i % LOAD_DEV_SPAN;
        bool last = true;

        for (uint32_t j = i + LOAD_DEV_SPAN; j < NOPS; j += LOAD_DEV_SPAN)
            last = last && j % 7 == 3; /* a later load to dev that moved nothing */
        if (moved && last)
            assert_true(dev_holds(r, dev, i));
        if (moved)
            assert_true(host_holds(r, 64 + i, 500 + (BACKUP_DEV_BASE + i % 31)));
        else
            assert_true(host_is_zero(r, 64 + i));
    }
}

static void test_order_and_watermarks(void **state)
{
    struct xfer_config cfg = {.max_delay_us = 300, .seed = 1234};
    struct order_state o = {0};
    struct rig r;

    (void)state;
    rig_up(&r, &mha, HOST_PAGE_FIRST, ORDER_DEV_PAGES, 128, &cfg);
    for (uint32_t i = 0; i < NOPS; i++)
        fill_host(&r, i, i);
    for (uint32_t p = BACKUP_DEV_BASE; p < ORDER_DEV_PAGES; p++)
        fill_dev(&r, p, 500 + p);
    for (uint32_t i = 0; i < NOPS; i++)
        submit_order_pair(&r, &o, i);
    /* Waiting on an op in the middle covers everything before it. */
    assert_int_equal(xfer_wait(r.x, XFER_LOAD, NOPS / 2), 0);
    assert_true(xfer_done(r.x, XFER_LOAD) >= NOPS / 2);
    for (uint64_t id = 1; id <= NOPS / 2; id++)
        assert_int_equal(xfer_status(r.x, XFER_LOAD, id), 0);
    while (xfer_done(r.x, XFER_LOAD) < NOPS || xfer_done(r.x, XFER_BACKUP) < NOPS)
        watch(&r, &o);
    assert_int_equal(xfer_wait(r.x, XFER_LOAD, NOPS), 0);
    assert_int_equal(xfer_wait(r.x, XFER_BACKUP, NOPS), 0);
    assert_int_equal(xfer_bytes(r.x, XFER_LOAD), o.bytes[XFER_LOAD]);
    assert_int_equal(xfer_bytes(r.x, XFER_BACKUP), o.bytes[XFER_BACKUP]);
    check_order_data(&r);
    rig_down(&r);
}

/* ---- per-layer waits ---- */

#define WL_LAYERS 8
#define WL_PAGES 12
#define WL_DELAY_US 20000 /* after layer 0 lands, the op has at least 140 ms to go */

/* Follow one load layer by layer: each layer is whole when its wait returns, and layer 0
 * returns while the op is not yet done. The latter holds unless this thread stalls for the
 * whole 140 ms, so it is asked of one attempt out of three, never of all. */
static bool follow_load(struct rig *r, const uint32_t *dev, const uint32_t *host, uint32_t tag)
{
    bool early = false;
    uint64_t id;

    for (uint32_t p = 0; p < WL_PAGES; p++)
        fill_dev(r, dev[p], FILLER);
    id = submit(r, XFER_LOAD, dev, host, WL_PAGES);
    for (uint32_t l = 0; l < WL_LAYERS; l++) {
        assert_int_equal(xfer_wait_layer(r->x, id, l, NULL), 0);
        if (l == 0)
            early = xfer_done(r->x, XFER_LOAD) < id;
        for (uint32_t p = 0; p < WL_PAGES; p++)
            assert_true(dev_layer_holds(r, dev[p], l, tag + p));
    }
    /* The last layer's wait implies every layer is there. */
    for (uint32_t p = 0; p < WL_PAGES; p++)
        assert_true(dev_holds(r, dev[p], tag + p));
    assert_int_equal(xfer_wait(r->x, XFER_LOAD, id), 0);
    assert_int_equal(xfer_wait_layer(r->x, id, WL_LAYERS - 1, NULL), 0); /* done: at once */
    return early;
}

static void test_wait_layer(void **state)
{
    struct kvt_geometry g = mha;
    struct xfer_config cfg = {.layer_delay_us = WL_DELAY_US};
    uint32_t dev[WL_PAGES], host[WL_PAGES];
    bool early = false;
    struct rig r;

    (void)state;
    g.layers = WL_LAYERS;
    rig_up(&r, &g, HOST_PAGE_FIRST, 32, 32, &cfg);
    for (uint32_t p = 0; p < WL_PAGES; p++) {
        dev[p] = 1 + p;
        host[p] = 2 * p; /* scattered on the host side */
        fill_host(&r, host[p], 300 + p);
    }
    for (int attempt = 0; attempt < 3 && !early; attempt++)
        early = follow_load(&r, dev, host, 300);
    assert_true(early);
    uint64_t last = xfer_done(r.x, XFER_LOAD);
    assert_int_equal(xfer_wait_layer(r.x, last, WL_LAYERS, NULL), -EINVAL);
    assert_int_equal(xfer_wait_layer(r.x, last + 1, 0, NULL), -EINVAL); /* never issued */
    assert_int_equal(xfer_wait_layer(r.x, 0, 0, NULL), -EINVAL);
    rig_down(&r);
}

/* ---- bad input ---- */

static void expect_nothing_queued(struct rig *r)
{
    for (int d = 0; d < 2; d++) {
        assert_int_equal(xfer_done(r->x, (enum xfer_dir)d), 0);
        assert_int_equal(xfer_status(r->x, (enum xfer_dir)d, 1), -EINVAL); /* never issued */
        assert_int_equal(xfer_wait(r->x, (enum xfer_dir)d, 1), -EINVAL);
    }
}

static void test_bad_input(void **state)
{
    const uint32_t ok[] = {1, 2, 3}, host[] = {0, 1, 2};
    const uint32_t pad[] = {1, 0, 3}, past_dev[] = {1, 2, 16}, past_host[] = {0, 1, 32};
    uint64_t id = 0;
    struct rig r;

    (void)state;
    rig_up(&r, &mha, HOST_PAGE_FIRST, 16, 32, NULL);
    assert_int_equal(xfer_submit(r.x, XFER_LOAD, pad, host, 3, NULL, &id), -EINVAL);
    assert_int_equal(xfer_submit(r.x, XFER_BACKUP, past_dev, host, 3, NULL, &id), -EINVAL);
    assert_int_equal(xfer_submit(r.x, XFER_LOAD, ok, past_host, 3, NULL, &id), -EINVAL);
    assert_int_equal(xfer_submit(r.x, (enum xfer_dir)2, ok, host, 3, NULL, &id), -EINVAL);
    assert_int_equal(xfer_submit(r.x, XFER_LOAD, NULL, host, 3, NULL, &id), -EINVAL);
    assert_int_equal(xfer_submit(r.x, XFER_LOAD, ok, NULL, 3, NULL, &id), -EINVAL);
    assert_int_equal(xfer_submit(r.x, XFER_LOAD, ok, host, 3, NULL, NULL), -EINVAL);
    assert_int_equal(id, 0);
    expect_nothing_queued(&r);
    assert_int_equal(xfer_bytes(r.x, XFER_LOAD), 0);
    assert_int_equal(xfer_status(r.x, (enum xfer_dir)2, 0), -EINVAL);

    /* The refusals used no id: the next good op is 1, an empty one 2. */
    assert_int_equal(submit(&r, XFER_LOAD, ok, host, 3), 1);
    assert_int_equal(submit(&r, XFER_LOAD, NULL, NULL, 0), 2);
    assert_int_equal(xfer_wait(r.x, XFER_LOAD, 2), 0);
    assert_int_equal(xfer_status(r.x, XFER_LOAD, 0), 0);
    assert_int_equal(xfer_bytes(r.x, XFER_LOAD), 3 * r.host.page_bytes);
    assert_int_equal(xfer_done(r.x, XFER_BACKUP), 0);
    rig_down(&r);
}

/* The engine refuses pools that disagree on geometry. */
static void test_create_mismatch(void **state)
{
    struct kvt_geometry g = mha;
    struct xfer_engine *x = (struct xfer_engine *)&x;
    struct host_pool host;
    struct kv_pool dev;

    (void)state;
    g.layers = mha.layers + 1;
    assert_int_equal(kv_pool_init(&dev, &dev_backend_sim, &mha, 16 * PS), 0);
    assert_int_equal(host_pool_init(&host, &dev_backend_sim, &g, PS, 8, HOST_PAGE_FIRST), 0);
    assert_int_equal(xfer_create(&dev, &host, NULL, &x), -EINVAL);
    assert_null(x);
    host_pool_finish(&host);
    g = mha;
    g.v_head_dim = 0; /* V as wide as K: same layers, other row bytes */
    assert_int_equal(host_pool_init(&host, &dev_backend_sim, &g, PS, 8, HOST_PAGE_FIRST), 0);
    assert_int_equal(xfer_create(&dev, &host, NULL, &x), -EINVAL);
    host_pool_finish(&host);
    /* An io mode past the enum is refused on sim too, where io is otherwise ignored. */
    assert_int_equal(host_pool_init(&host, &dev_backend_sim, &mha, PS, 8, HOST_PAGE_FIRST), 0);
    struct xfer_config bad_io = {.io = KVT_IO_DMA + 1}, dma = {.io = KVT_IO_DMA};
    assert_int_equal(xfer_create(&dev, &host, &bad_io, &x), -EINVAL);
    assert_null(x);
    assert_int_equal(xfer_create(&dev, &host, &dma, &x), 0);
    xfer_destroy(x);
    host_pool_finish(&host);
    kv_pool_finish(&dev);
    xfer_destroy(NULL);
}

/* ---- teardown ---- */

/* Destroy with many slow ops queued: every op still lands, nothing leaks, nothing hangs. */
static void test_destroy_in_flight(void **state)
{
    struct xfer_config cfg = {.max_delay_us = 2000, .seed = 99, .layer_delay_us = 100};
    struct rig r;

    (void)state;
    /* Loads write device pages 1..32, backups read 33..64: the streams share no page. */
    rig_up(&r, &mla, HOST_LAYER_FIRST, 80, 128, &cfg);
    for (uint32_t i = 0; i < 32; i++) {
        fill_host(&r, i, 700 + i);
        fill_dev(&r, 33 + i, 800 + i);
    }
    for (uint32_t i = 0; i < 32; i++) {
        uint32_t ldev = 1 + i, lhost = i, bdev = 33 + i, bhost = 64 + i;

        submit(&r, XFER_LOAD, &ldev, &lhost, 1);
        submit(&r, XFER_BACKUP, &bdev, &bhost, 1);
    }
    xfer_destroy(r.x);
    r.x = NULL;
    for (uint32_t i = 0; i < 32; i++) {
        assert_true(dev_holds(&r, 1 + i, 700 + i));
        assert_true(host_holds(&r, 64 + i, 800 + i));
    }
    rig_down(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_mha_page_first),
        cmocka_unit_test(test_round_trip_mha_layer_first),
        cmocka_unit_test(test_round_trip_mla_page_first),
        cmocka_unit_test(test_round_trip_mla_layer_first),
        cmocka_unit_test(test_round_trip_wide),
        cmocka_unit_test(test_coalesced_and_scattered),
        cmocka_unit_test(test_order_and_watermarks),
        cmocka_unit_test(test_wait_layer),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_create_mismatch),
        cmocka_unit_test(test_destroy_in_flight),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
