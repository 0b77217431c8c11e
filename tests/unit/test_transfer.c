/* Transfer engine on the sim backend: byte-exact round trips, ordering, per-layer waits. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "device/backend.h"
#include "device/kv_pool.h"
#include "device/swa_alloc.h"
#include "device/swa_pool.h"
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

/* A page of rows of rb bytes each, as a page tagged tag holds them. */
static void pattern_rows(size_t rb, uint32_t tag, uint32_t layer, int w, uint8_t *out)
{
    for (uint32_t i = 0; i < PS; i++)
        for (size_t b = 0; b < rb; b++)
            out[i * rb + b] = pattern(tag, layer, w, i, b);
}

static void make_rows(const struct rig *r, uint32_t tag, uint32_t layer, int w, uint8_t *out)
{
    pattern_rows(r->dev.row_bytes[w], tag, layer, w, out);
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

static void fill_host_page(struct host_pool *hp, uint32_t page, uint32_t tag)
{
    for (uint32_t l = 0; l < hp->layers; l++)
        for (int w = 0; w < 2; w++)
            if (hp->row[w])
                pattern_rows(hp->row[w], tag, l, w, host_pool_rows(hp, page, l, w));
}

static void fill_host(struct rig *r, uint32_t page, uint32_t tag)
{
    fill_host_page(&r->host, page, tag);
}

static bool host_layer_holds(const struct host_pool *hp, uint32_t page, uint32_t layer,
                             uint32_t tag)
{
    uint8_t want[PS * MAX_ROW];

    for (int w = 0; w < 2; w++) {
        if (!hp->row[w])
            continue;
        pattern_rows(hp->row[w], tag, layer, w, want);
        if (memcmp(host_pool_rows(hp, page, layer, w), want, PS * hp->row[w]))
            return false;
    }
    return true;
}

static bool host_holds(const struct rig *r, uint32_t page, uint32_t tag)
{
    for (uint32_t l = 0; l < r->host.layers; l++)
        if (!host_layer_holds(&r->host, page, l, tag))
            return false;
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

/* ---- a sliding-window model's two pools ---- */

/* Five layers, 1 and 3 full attention: SWA layers on both sides of each full one. The SWA
 * pool is smaller than the full one, so a page number sent to the wrong pool shows. */
static const uint32_t swa_full_ids[] = {1, 3};
#define SWA_NPAGES 8     /* pages the rig allocates, each with its SWA peer at first */
#define SWA_FULL_SIDE 24 /* full pages of the allocator */
#define SWA_SWA_SIDE 12  /* SWA pages of the allocator */
#define SWA_HOST_PAGES 40
#define SWA_TAG 100 /* page i holds tag SWA_TAG + i */

struct swa_rig {
    struct kvt_geometry g;
    struct swa_alloc a;
    struct swa_pool p;
    struct host_pool host;
    struct xfer_engine *x;
    int32_t slots[SWA_NPAGES * PS]; /* page i's full slots at i * PS */
    uint32_t full[SWA_NPAGES];      /* page i's full page */
    uint32_t swa[SWA_NPAGES];       /* its SWA page, 0 once its window passed */
};

static bool layer_is_swa(const struct swa_rig *r, uint32_t layer)
{
    int is_swa;
    uint32_t index;

    assert_int_equal(swa_pool_layer(&r->p, layer, &is_swa, &index), 0);
    return is_swa;
}

/* Page i's rows tagged tag in every model layer it has (a page whose window passed has no
 * SWA rows to write). */
static void swa_fill_page(struct swa_rig *r, uint32_t i, uint32_t tag)
{
    uint8_t k[PS * MAX_ROW], v[PS * MAX_ROW];

    for (uint32_t l = 0; l < r->g.layers; l++) {
        if (layer_is_swa(r, l) && !r->swa[i])
            continue;
        pattern_rows(r->p.full.row_bytes[0], tag, l, 0, k);
        pattern_rows(r->p.full.row_bytes[1], tag, l, 1, v);
        assert_int_equal(swa_pool_write(&r->p, &r->a, l, r->slots + i * PS, PS, k, v), 0);
    }
}

static bool swa_layer_holds(const struct swa_rig *r, uint32_t i, uint32_t layer, uint32_t tag)
{
    uint8_t k[PS * MAX_ROW], v[PS * MAX_ROW], want[PS * MAX_ROW];

    assert_int_equal(swa_pool_read(&r->p, &r->a, layer, r->slots + i * PS, PS, k, v), 0);
    pattern_rows(r->p.full.row_bytes[0], tag, layer, 0, want);
    if (memcmp(k, want, PS * r->p.full.row_bytes[0]))
        return false;
    pattern_rows(r->p.full.row_bytes[1], tag, layer, 1, want);
    return memcmp(v, want, PS * r->p.full.row_bytes[1]) == 0;
}

/* Pages 0..SWA_NPAGES-1 tagged, those in bare[] with their SWA part freed afterwards (SWA
 * tombstones whose freed peers keep stale rows); every host page FILLER. */
static void swa_rig_up(struct swa_rig *r, uint32_t layout, const struct xfer_config *cfg,
                       const uint32_t *bare, size_t nbare)
{
    struct xfer_config c = *cfg;
    int32_t lead[PS];

    r->g = mha;
    r->g.layers = 5;
    assert_int_equal(swa_alloc_init(&r->a, SWA_FULL_SIDE * PS, SWA_SWA_SIDE * PS, PS), 0);
    assert_int_equal(swa_pool_init(&r->p, &dev_backend_sim, &r->g, swa_full_ids, 2, &r->a), 0);
    assert_int_equal(host_pool_init(&r->host, &dev_backend_sim, &r->g, PS, SWA_HOST_PAGES, layout),
                     0);
    c.swa = &r->p;
    assert_int_equal(xfer_create(&r->p.full, &r->host, &c, &r->x), 0);
    /* A first page whose SWA part goes at once: the rig's pages then have full and SWA page
     * numbers apart, so a page sent to the wrong pool shows. */
    assert_int_equal(swa_alloc(&r->a, PS, lead), 0);
    assert_int_equal(swa_free_swa(&r->a, lead, PS), 0);
    assert_int_equal(swa_alloc(&r->a, SWA_NPAGES * PS, r->slots), 0);
    for (uint32_t i = 0; i < SWA_NPAGES; i++) {
        r->full[i] = (uint32_t)r->slots[i * PS] / PS;
        r->swa[i] = r->a.peer[r->full[i]];
        assert_true(r->swa[i] && r->swa[i] != r->full[i]);
        swa_fill_page(r, i, SWA_TAG + i);
    }
    for (size_t b = 0; b < nbare; b++) {
        assert_int_equal(swa_free_swa(&r->a, r->slots + bare[b] * PS, PS), 0);
        r->swa[bare[b]] = 0;
    }
    for (uint32_t h = 0; h < SWA_HOST_PAGES; h++)
        fill_host_page(&r->host, h, FILLER);
}

static void swa_rig_down(struct swa_rig *r)
{
    xfer_destroy(r->x);
    host_pool_finish(&r->host);
    swa_pool_finish(&r->p);
    swa_alloc_finish(&r->a);
}

/* What an op over pages idx[] moves: every layer, less the SWA layers of bare pages. */
static uint64_t swa_op_bytes(const struct swa_rig *r, const uint32_t *idx, size_t n)
{
    uint64_t layer_bytes = (uint64_t)PS * (r->host.row[0] + r->host.row[1]), bytes = 0;

    for (size_t k = 0; k < n; k++)
        bytes += layer_bytes * (r->swa[idx[k]] ? r->g.layers : 2);
    return bytes;
}

static uint64_t swa_submit(struct swa_rig *r, enum xfer_dir dir, const uint32_t *idx,
                           const uint32_t *host, size_t n)
{
    uint32_t dev[SWA_NPAGES], swa[SWA_NPAGES];
    uint64_t id = 0;

    for (size_t k = 0; k < n; k++) {
        dev[k] = r->full[idx[k]];
        swa[k] = r->swa[idx[k]];
    }
    assert_int_equal(xfer_submit_swa(r->x, dir, dev, swa, host, n, NULL, &id), 0);
    return id;
}

/* The SWA pool's rows, every layer, K then V (sim: host memory). */
static size_t swa_pool_copy(const struct swa_rig *r, uint8_t *out)
{
    size_t off = 0;

    for (uint32_t l = 0; l < r->p.swa.geo.layers; l++)
        for (int w = 0; w < 2; w++) {
            size_t n = r->p.swa.rows * r->p.swa.row_bytes[w];

            if (out)
                memcpy(out + off, r->p.swa.buf[w][l], n);
            off += n;
        }
    return off;
}

/* Every SWA pool page but those in keep[] (the load's targets) still as in before. */
static void swa_pool_untouched_but(const struct swa_rig *r, const uint8_t *before,
                                   const uint32_t *keep, size_t nkeep)
{
    size_t off = 0;

    for (uint32_t l = 0; l < r->p.swa.geo.layers; l++)
        for (int w = 0; w < 2; w++) {
            size_t span = (size_t)PS * r->p.swa.row_bytes[w];
            const uint8_t *now = r->p.swa.buf[w][l];

            /* keep[] names 0 for a bare page: the padding page must stay as it was too. */
            for (uint32_t pg = 0; pg < r->p.swa.rows / PS; pg++)
                if (pg == 0 || !in_list(keep, nkeep, pg))
                    assert_memory_equal(now + pg * span, before + off + pg * span, span);
            off += r->p.swa.rows * r->p.swa.row_bytes[w];
        }
}

/* Backup pages idx[] to host[], then load them back over FILLER into the same pages. */
static void swa_round_trip(uint32_t layout, const struct xfer_config *cfg, const uint32_t *idx,
                           const uint32_t *host, size_t n)
{
    static const uint32_t bare[] = {2, 6};
    uint32_t targets[SWA_NPAGES];
    struct swa_rig r;
    uint8_t *before;
    uint64_t id;

    swa_rig_up(&r, layout, cfg, bare, 2);
    id = swa_submit(&r, XFER_BACKUP, idx, host, n);
    assert_int_equal(xfer_wait(r.x, XFER_BACKUP, id), 0);
    for (size_t k = 0; k < n; k++)
        for (uint32_t l = 0; l < r.g.layers; l++) {
            bool moved = !layer_is_swa(&r, l) || r.swa[idx[k]];
            assert_true(host_layer_holds(&r.host, host[k], l, moved ? SWA_TAG + idx[k] : FILLER));
        }
    for (uint32_t h = 0; h < SWA_HOST_PAGES; h++)
        for (uint32_t l = 0; !in_list(host, n, h) && l < r.g.layers; l++)
            assert_true(host_layer_holds(&r.host, h, l, FILLER));
    assert_int_equal(xfer_bytes(r.x, XFER_BACKUP), swa_op_bytes(&r, idx, n));

    for (uint32_t i = 0; i < SWA_NPAGES; i++)
        swa_fill_page(&r, i, FILLER);
    before = malloc(swa_pool_copy(&r, NULL));
    assert_non_null(before);
    swa_pool_copy(&r, before);
    id = swa_submit(&r, XFER_LOAD, idx, host, n);
    assert_int_equal(xfer_wait(r.x, XFER_LOAD, id), 0);
    for (size_t k = 0; k < n; k++) {
        targets[k] = r.swa[idx[k]];
        for (uint32_t l = 0; l < r.g.layers; l++)
            if (!layer_is_swa(&r, l) || r.swa[idx[k]])
                assert_true(swa_layer_holds(&r, idx[k], l, SWA_TAG + idx[k]));
    }
    swa_pool_untouched_but(&r, before, targets, n);
    assert_int_equal(xfer_bytes(r.x, XFER_LOAD), swa_op_bytes(&r, idx, n));
    free(before);
    swa_rig_down(&r);
}

/* In allocation order (consecutive full and SWA pages, the SWA runs broken by the bare pages)
 * to consecutive host pages; then scattered, but for a bare page before SWA page 1 with the
 * host pages climbing (no run may start at a 0). Serial and threaded, both host layouts
 * (layer_first copies a run's host side in one span). */
static void test_swa_round_trip(void **state)
{
    static const uint32_t in_order[] = {0, 1, 2, 3, 4, 5, 6, 7};
    static const uint32_t run_host[] = {4, 5, 6, 7, 8, 9, 10, 11};
    static const uint32_t scattered[] = {6, 3, 2, 0, 7, 1, 4, 5};
    static const uint32_t scat_host[] = {30, 2, 16, 17, 9, 25, 0, 39};
    const struct xfer_config serial = {.serial = true}, threaded = {.max_delay_us = 100, .seed = 5};
    const uint32_t layouts[] = {HOST_PAGE_FIRST, HOST_LAYER_FIRST};

    (void)state;
    for (int i = 0; i < 2; i++) {
        swa_round_trip(layouts[i], &serial, in_order, run_host, SWA_NPAGES);
        swa_round_trip(layouts[i], &threaded, in_order, run_host, SWA_NPAGES);
        swa_round_trip(layouts[i], &serial, scattered, scat_host, SWA_NPAGES);
        swa_round_trip(layouts[i], &threaded, scattered, scat_host, SWA_NPAGES);
    }
}

/* xfer_submit on a sliding-window engine: the pages have no SWA part. */
static void test_swa_plain_submit(void **state)
{
    const struct xfer_config cfg = {.serial = true};
    const uint32_t idx[] = {3}, host[] = {7};
    struct swa_rig r;
    uint64_t id = 0;

    (void)state;
    swa_rig_up(&r, HOST_PAGE_FIRST, &cfg, NULL, 0);
    assert_int_equal(xfer_submit(r.x, XFER_BACKUP, &r.full[3], host, 1, NULL, &id), 0);
    assert_int_equal(xfer_wait(r.x, XFER_BACKUP, id), 0);
    for (uint32_t l = 0; l < r.g.layers; l++)
        assert_true(host_layer_holds(&r.host, 7, l, layer_is_swa(&r, l) ? FILLER : SWA_TAG + 3));
    r.swa[3] = 0; /* what the op moved: its full layers */
    assert_int_equal(xfer_bytes(r.x, XFER_BACKUP), swa_op_bytes(&r, idx, 1));
    swa_rig_down(&r);
}

/* Loads mark model layers: once layer l's wait returns, that layer of every page is there,
 * SWA layers where the page has an SWA part. */
static bool swa_follow_load(struct swa_rig *r, const uint32_t *idx, const uint32_t *host)
{
    bool early = false;
    uint64_t id;

    for (uint32_t i = 0; i < SWA_NPAGES; i++)
        swa_fill_page(r, i, FILLER);
    id = swa_submit(r, XFER_LOAD, idx, host, SWA_NPAGES);
    for (uint32_t l = 0; l < r->g.layers; l++) {
        assert_int_equal(xfer_wait_layer(r->x, id, l, NULL), 0);
        if (l == 0)
            early = xfer_done(r->x, XFER_LOAD) < id;
        for (uint32_t k = 0; k < SWA_NPAGES; k++)
            if (!layer_is_swa(r, l) || r->swa[idx[k]])
                assert_true(swa_layer_holds(r, idx[k], l, 300 + k));
    }
    assert_int_equal(xfer_wait(r->x, XFER_LOAD, id), 0);
    return early;
}

static void test_swa_wait_layer(void **state)
{
    const struct xfer_config cfg = {.layer_delay_us = WL_DELAY_US};
    static const uint32_t bare[] = {1, 4};
    const uint32_t idx[] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint32_t host[SWA_NPAGES];
    bool early = false;
    struct swa_rig r;

    (void)state;
    swa_rig_up(&r, HOST_PAGE_FIRST, &cfg, bare, 2);
    for (uint32_t k = 0; k < SWA_NPAGES; k++) {
        host[k] = 3 * k;
        fill_host_page(&r.host, host[k], 300 + k);
    }
    for (int attempt = 0; attempt < 3 && !early; attempt++)
        early = swa_follow_load(&r, idx, host);
    assert_true(early);
    assert_int_equal(xfer_wait_layer(r.x, 1, r.g.layers, NULL), -EINVAL);
    swa_rig_down(&r);
}

/* Pools that do not fit a sliding-window engine, SWA pages past the SWA pool, and SWA pages
 * on an engine without SWA layers. */
static void test_swa_bad_input(void **state)
{
    const struct xfer_config plain_cfg = {.serial = true};
    struct xfer_config cfg = plain_cfg;
    struct xfer_engine *x = (struct xfer_engine *)&x;
    struct kvt_geometry g;
    struct host_pool hp;
    struct swa_rig r;
    struct rig plain;
    uint64_t id = 0;

    (void)state;
    swa_rig_up(&r, HOST_PAGE_FIRST, &plain_cfg, NULL, 0);
    cfg.swa = &r.p;
    assert_int_equal(xfer_create(&r.p.swa, &r.host, &cfg, &x), -EINVAL);
    assert_null(x);
    assert_int_equal(xfer_create(&r.p.full, &r.host, &cfg, &x), 0);
    xfer_destroy(x);
    g = r.g;
    g.layers = 2; /* the full pool's layers alone: right for a plain engine, not for this one */
    assert_int_equal(host_pool_init(&hp, &dev_backend_sim, &g, PS, 8, HOST_PAGE_FIRST), 0);
    assert_int_equal(xfer_create(&r.p.full, &hp, &cfg, &x), -EINVAL);
    host_pool_finish(&hp);
    /* cuda refuses before it touches a device: pools that claim to be cuda's do. */
    struct dev_backend cuda_like = dev_backend_sim;
    struct swa_pool on_cuda = r.p;
    cuda_like.kind = KVT_BACKEND_CUDA;
    on_cuda.full.be = on_cuda.swa.be = &cuda_like;
    cfg.swa = &on_cuda;
    assert_int_equal(xfer_create(&on_cuda.full, &r.host, &cfg, &x), KVT_ENOBACKEND);
    assert_null(x);

    const uint32_t dev[] = {r.full[0], r.full[1]}, host[] = {1, 2};
    const uint32_t past[] = {r.swa[0], SWA_SWA_SIDE + 1}, last[] = {0, SWA_SWA_SIDE};
    assert_int_equal(xfer_submit_swa(r.x, XFER_LOAD, dev, past, host, 2, NULL, &id), -EINVAL);
    assert_int_equal(id, 0);
    assert_int_equal(xfer_submit_swa(r.x, XFER_BACKUP, dev, last, host, 2, NULL, &id), 0);
    assert_int_equal(xfer_wait(r.x, XFER_BACKUP, id), 0);
    assert_int_equal(xfer_done(r.x, XFER_LOAD), 0);
    swa_rig_down(&r);

    const uint32_t pdev[] = {1, 2, 3}, phost[] = {0, 1, 2}, some[] = {0, 5, 0}, none[3] = {0};
    rig_up(&plain, &mha, HOST_PAGE_FIRST, 16, 32, &plain_cfg);
    assert_int_equal(xfer_submit_swa(plain.x, XFER_LOAD, pdev, some, phost, 3, NULL, &id), -EINVAL);
    expect_nothing_queued(&plain);
    assert_int_equal(xfer_submit_swa(plain.x, XFER_LOAD, pdev, none, phost, 3, NULL, &id), 0);
    assert_int_equal(xfer_submit_swa(plain.x, XFER_LOAD, pdev, NULL, phost, 3, NULL, &id), 0);
    assert_int_equal(xfer_wait(plain.x, XFER_LOAD, id), 0);
    assert_int_equal(xfer_bytes(plain.x, XFER_LOAD), 6 * plain.host.page_bytes);
    rig_down(&plain);
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
        cmocka_unit_test(test_swa_round_trip),
        cmocka_unit_test(test_swa_plain_submit),
        cmocka_unit_test(test_swa_wait_layer),
        cmocka_unit_test(test_swa_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
