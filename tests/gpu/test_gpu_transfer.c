/*
 * The transfer engine on a GPU: byte-exact round trips device -> host -> device through
 * every io mode (auto, kernel, dma, and auto made to pick dma), both host layouts, MHA and
 * MLA at access widths 16, 8, 4 and 1, and page lists scattered, in runs, and single; how
 * auto picks; the index ring under many ops in flight; a per-layer wait through a stream;
 * a backup that waits on its ready event; and the device pool's batched copies of scattered
 * rows (kvt_kv_write and kvt_kv_read), over several staging chunks.
 *
 * Exits 77 (skip) when CUDA is not built in or no GPU is visible.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "device/backend.h"
#include "device/kv_pool.h"
#include "host/host_pool.h"
#include "host/transfer.h"

#ifdef KVT_HAVE_CUDA
#include <cuda_runtime_api.h>

#define FILLER 9999u /* tag of device pages no load should reach */
#define DEV_PAGES 24 /* pages 0..23, 0 the padding page */
#define HOST_PAGES 64

struct shape {
    const char *name;
    struct kvt_geometry g;
    uint32_t ps; /* tokens per page */
};

/* Page spans of 128/64, 128, 8/16, 12/20 and 7 bytes: access widths 16, 16, 8, 4 and 1. */
static const struct shape shapes[] = {
    {"mha",
     {.attention = KVT_ATTN_MHA,
      .layers = 4,
      .kv_heads = 2,
      .head_dim = 8,
      .v_head_dim = 4,
      .dtype_bytes = 2},
     4},
    {"mla",
     {.attention = KVT_ATTN_MLA,
      .layers = 3,
      .kv_lora_rank = 12,
      .qk_rope_head_dim = 4,
      .dtype_bytes = 2},
     4},
    {"mha-w8",
     {.attention = KVT_ATTN_MHA,
      .layers = 2,
      .kv_heads = 1,
      .head_dim = 2,
      .v_head_dim = 4,
      .dtype_bytes = 4},
     1},
    {"mha-w4",
     {.attention = KVT_ATTN_MHA,
      .layers = 3,
      .kv_heads = 1,
      .head_dim = 3,
      .v_head_dim = 5,
      .dtype_bytes = 1},
     4},
    {"mla-w1",
     {.attention = KVT_ATTN_MLA,
      .layers = 2,
      .kv_lora_rank = 5,
      .qk_rope_head_dim = 2,
      .dtype_bytes = 1},
     1},
};
#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

/* The io modes under test; auto_dma is auto with a threshold every op passes. */
/* M_KERNEL_ONE: the kernels with one block per layer (its warps loop over every page part)
 * and loads on a high-priority stream. */
enum mode { M_AUTO, M_KERNEL, M_DMA, M_AUTO_DMA, M_KERNEL_ONE, M_DMA_HINT, NMODES };
static const char *const mode_names[NMODES] = {
    "auto", "kernel", "dma", "auto(dma)", "kernel, one block", "dma, overlap hint"};

struct rig {
    struct kv_pool dev;
    struct host_pool host;
    struct xfer_engine *x;
    uint32_t ps;
};

/* The kernels are built and the GPU is compute capability 9.0 or newer, which the build
 * has code for: io=kernel must then work. */
static bool kernels_expected;

static struct xfer_config mode_config(enum mode m)
{
    struct xfer_config c = {.io = KVT_IO_AUTO};

    if (m == M_KERNEL || m == M_KERNEL_ONE)
        c.io = KVT_IO_KERNEL;
    if (m == M_KERNEL_ONE) {
        c.kernel_blocks = 1;
        c.high_priority_loads = true;
    }
    if (m == M_DMA || m == M_DMA_HINT)
        c.io = KVT_IO_DMA;
    c.dma_prefer_overlap = m == M_DMA_HINT;
    if (m == M_AUTO_DMA)
        c.auto_dma_min_bytes = 1;
    return c;
}

/* false when io=kernel cannot run on this GPU (then the mode is skipped, and must not be on
 * a GPU the build targets). */
static bool rig_up(struct rig *r, const struct kvt_geometry *g, uint32_t ps, uint32_t layout,
                   uint32_t dev_pages, uint32_t host_pages, const struct xfer_config *cfg)
{
    memset(r, 0, sizeof(*r));
    r->ps = ps;
    assert_int_equal(kv_pool_init(&r->dev, &dev_backend_cuda, g, (uint64_t)dev_pages * ps), 0);
    assert_int_equal(host_pool_init(&r->host, &dev_backend_cuda, g, ps, host_pages, layout), 0);
    int rc = xfer_create(&r->dev, &r->host, cfg, &r->x);
    if (rc == KVT_ENOBACKEND && cfg && cfg->io == KVT_IO_KERNEL && !kernels_expected) {
        host_pool_finish(&r->host);
        kv_pool_finish(&r->dev);
        return false;
    }
    assert_int_equal(rc, 0);
    return true;
}

static void rig_down(struct rig *r)
{
    xfer_destroy(r->x);
    host_pool_finish(&r->host);
    kv_pool_finish(&r->dev);
}

/* ---- content ---- */

/* The byte a page tagged tag holds at (layer, K/V, byte of the page's span): distinct per
 * tag and place, so a copy to or from the wrong spot shows. */
static uint8_t pattern(uint32_t tag, uint32_t layer, int w, size_t b)
{
    uint64_t h = ((uint64_t)tag << 32) ^ ((uint64_t)layer << 24) ^ ((uint64_t)w << 20) ^ b;

    h = (h ^ (h >> 31)) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    return (uint8_t)(h >> 17);
}

static size_t span(const struct rig *r, int w)
{
    return (size_t)r->ps * r->dev.row_bytes[w];
}

static void make_span(const struct rig *r, uint32_t tag, uint32_t layer, int w, uint8_t *out)
{
    for (size_t b = 0; b < span(r, w); b++)
        out[b] = pattern(tag, layer, w, b);
}

static void page_slots(const struct rig *r, uint32_t page, int32_t *slots)
{
    for (uint32_t i = 0; i < r->ps; i++)
        slots[i] = (int32_t)(page * r->ps + i);
}

#define MAX_SPAN 32768 /* the largest page span below (big) */

static void fill_dev(struct rig *r, uint32_t page, uint32_t tag)
{
    uint8_t k[MAX_SPAN], v[MAX_SPAN];
    int32_t slots[64];
    bool mha = r->dev.row_bytes[1] != 0;

    assert_true(span(r, 0) <= MAX_SPAN && span(r, 1) <= MAX_SPAN && r->ps <= 64);
    page_slots(r, page, slots);
    for (uint32_t l = 0; l < r->dev.geo.layers; l++) {
        make_span(r, tag, l, 0, k);
        if (mha)
            make_span(r, tag, l, 1, v);
        assert_int_equal(kv_pool_write(&r->dev, l, slots, r->ps, k, mha ? v : NULL), 0);
    }
}

/* tag FILLER + 1 stands for "all zero" (the padding page). */
static bool dev_holds(const struct rig *r, uint32_t page, uint32_t tag)
{
    uint8_t got[2][MAX_SPAN], want[MAX_SPAN];
    int32_t slots[64];
    bool mha = r->dev.row_bytes[1] != 0;

    page_slots(r, page, slots);
    for (uint32_t l = 0; l < r->dev.geo.layers; l++) {
        assert_int_equal(kv_pool_read(&r->dev, l, slots, r->ps, got[0], mha ? got[1] : NULL), 0);
        for (int w = 0; w < (mha ? 2 : 1); w++) {
            if (tag == FILLER + 1)
                memset(want, 0, span(r, w));
            else
                make_span(r, tag, l, w, want);
            if (memcmp(got[w], want, span(r, w)))
                return false;
        }
    }
    return true;
}

static bool host_holds(const struct rig *r, uint32_t page, uint32_t tag)
{
    uint8_t want[MAX_SPAN];

    for (uint32_t l = 0; l < r->host.layers; l++)
        for (int w = 0; w < 2; w++) {
            if (!r->host.row[w])
                continue;
            make_span(r, tag, l, w, want);
            if (memcmp(host_pool_rows(&r->host, page, l, w), want, span(r, w)))
                return false;
        }
    return true;
}

static bool host_is_zero(const struct rig *r, uint32_t page)
{
    for (uint32_t l = 0; l < r->host.layers; l++)
        for (int w = 0; w < 2; w++) {
            const uint8_t *p = r->host.row[w] ? host_pool_rows(&r->host, page, l, w) : NULL;

            for (size_t b = 0; p && b < span(r, w); b++)
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
                       size_t n, void *ready)
{
    uint64_t id = 0;

    assert_int_equal(xfer_submit(r->x, dir, dev, host, n, ready, &id), 0);
    return id;
}

/* ---- round trips ---- */

/* src_dev -> host -> dst_dev. */
struct page_set {
    const char *name;
    size_t n;
    uint32_t src[9], host[9], dst[9];
};

static const struct page_set page_sets[] = {
    {"scattered", 5, {3, 9, 1, 14, 6}, {40, 7, 22, 13, 31}, {8, 2, 15, 5, 12}},
    /* a run of six on both sides; then a run broken on the host side only */
    {"runs",
     9,
     {16, 17, 18, 19, 20, 21, 10, 11, 12},
     {50, 51, 52, 53, 54, 55, 2, 3, 5},
     {1, 2, 3, 4, 5, 6, 20, 21, 22}},
    /* the last host page: offsets up to the end of the pool */
    {"single", 1, {23}, {HOST_PAGES - 1}, {1}},
};
#define NSETS (sizeof(page_sets) / sizeof(page_sets[0]))

static void backup_set(struct rig *r, const struct page_set *ps, uint32_t tag0)
{
    memset(r->host.base, 0, r->host.bytes);
    for (uint32_t i = 0; i < ps->n; i++)
        fill_dev(r, ps->src[i], tag0 + i);
    uint64_t id = submit(r, XFER_BACKUP, ps->src, ps->host, ps->n, NULL);
    assert_int_equal(xfer_wait(r->x, XFER_BACKUP, id), 0);
    for (uint32_t i = 0; i < ps->n; i++)
        if (!host_holds(r, ps->host[i], tag0 + i))
            fail_msg("%s: host page %u wrong after backup", ps->name, ps->host[i]);
    for (uint32_t p = 0; p < HOST_PAGES; p++)
        if (!in_list(ps->host, ps->n, p) && !host_is_zero(r, p))
            fail_msg("%s: backup wrote host page %u", ps->name, p);
}

static void load_set(struct rig *r, const struct page_set *ps, uint32_t tag0)
{
    for (uint32_t p = 1; p < DEV_PAGES; p++)
        fill_dev(r, p, FILLER);
    uint64_t id = submit(r, XFER_LOAD, ps->dst, ps->host, ps->n, NULL);
    assert_int_equal(xfer_wait(r->x, XFER_LOAD, id), 0);
    for (uint32_t i = 0; i < ps->n; i++)
        if (!dev_holds(r, ps->dst[i], tag0 + i))
            fail_msg("%s: device page %u wrong after load", ps->name, ps->dst[i]);
    for (uint32_t p = 1; p < DEV_PAGES; p++)
        if (!in_list(ps->dst, ps->n, p) && !dev_holds(r, p, FILLER))
            fail_msg("%s: load wrote device page %u", ps->name, p);
    assert_true(dev_holds(r, 0, FILLER + 1)); /* the padding page stays zero */
}

/* Ops went by the path the mode asks for. */
static void check_paths(const struct rig *r, enum mode m, uint64_t ops)
{
    uint64_t kern, dma;

    xfer_path_ops(r->x, &kern, &dma);
    assert_int_equal(kern + dma, ops);
    /* auto: these spans are far below the threshold, so kernels wherever they run */
    if (m == M_KERNEL || m == M_KERNEL_ONE || (m == M_AUTO && kernels_expected))
        assert_int_equal(kern, ops);
    else
        assert_int_equal(dma, ops);
}

static void round_trips(const struct shape *sh, uint32_t layout, enum mode m)
{
    struct xfer_config cfg = mode_config(m);
    struct rig r;
    uint64_t bytes = 0;

    if (!rig_up(&r, &sh->g, sh->ps, layout, DEV_PAGES, HOST_PAGES, &cfg)) {
        printf("# io=kernel unavailable on this GPU: %s skipped\n", sh->name);
        return;
    }
    for (uint32_t s = 0; s < NSETS; s++) {
        printf("# %s, %s, %s, %s\n", mode_names[m], sh->name,
               layout == HOST_PAGE_FIRST ? "page_first" : "layer_first", page_sets[s].name);
        backup_set(&r, &page_sets[s], 100 * (s + 1));
        load_set(&r, &page_sets[s], 100 * (s + 1));
        bytes += page_sets[s].n * r.host.page_bytes;
    }
    assert_int_equal(xfer_bytes(r.x, XFER_BACKUP), bytes);
    assert_int_equal(xfer_bytes(r.x, XFER_LOAD), bytes);
    check_paths(&r, m, 2 * NSETS);
    rig_down(&r);
}

static void round_trips_mode(enum mode m)
{
    for (uint32_t i = 0; i < NSHAPES; i++) {
        round_trips(&shapes[i], HOST_PAGE_FIRST, m);
        round_trips(&shapes[i], HOST_LAYER_FIRST, m);
    }
}

static void test_round_trip_auto(void **state)
{
    (void)state;
    round_trips_mode(M_AUTO);
}

static void test_round_trip_kernel(void **state)
{
    (void)state;
    round_trips_mode(M_KERNEL);
}

static void test_round_trip_dma(void **state)
{
    (void)state;
    round_trips_mode(M_DMA);
}

static void test_round_trip_auto_dma(void **state)
{
    (void)state;
    round_trips_mode(M_AUTO_DMA);
}

static void test_round_trip_kernel_one_block(void **state)
{
    (void)state;
    round_trips_mode(M_KERNEL_ONE);
}

static void test_round_trip_dma_hint(void **state)
{
    (void)state;
    round_trips_mode(M_DMA_HINT);
}

/* ---- how auto picks ---- */

/* Threshold two pages' worth of one layer's copy: scattered pages go by the kernels; a run
 * of three goes by DMA in layer_first (one copy per run) but not in page_first (one copy
 * per page). */
static void auto_picks(uint32_t layout, uint64_t runs_by_dma)
{
    const struct shape *sh = &shapes[0];
    const uint32_t scat_dev[] = {2, 7, 4}, scat_host[] = {9, 1, 30};
    const uint32_t run_dev[] = {10, 11, 12}, run_host[] = {20, 21, 22};
    struct xfer_config cfg = {.io = KVT_IO_AUTO};
    uint64_t kern, dma;
    struct rig r;

    cfg.auto_dma_min_bytes =
        2 * (uint64_t)sh->ps * (kv_row_bytes(&sh->g, 0) + kv_row_bytes(&sh->g, 1)) / 2;
    assert_true(rig_up(&r, &sh->g, sh->ps, layout, DEV_PAGES, HOST_PAGES, &cfg));
    assert_int_equal(xfer_wait(r.x, XFER_LOAD, submit(&r, XFER_LOAD, scat_dev, scat_host, 3, NULL)),
                     0);
    xfer_path_ops(r.x, &kern, &dma);
    assert_true(kern == 1 && dma == 0);
    assert_int_equal(xfer_wait(r.x, XFER_LOAD, submit(&r, XFER_LOAD, run_dev, run_host, 3, NULL)),
                     0);
    xfer_path_ops(r.x, &kern, &dma);
    assert_int_equal(dma, runs_by_dma);
    assert_int_equal(kern + dma, 2);
    rig_down(&r);
}

static void test_auto_picks(void **state)
{
    (void)state;
    if (!kernels_expected)
        skip();
    auto_picks(HOST_LAYER_FIRST, 1);
    auto_picks(HOST_PAGE_FIRST, 0);
}

/* An io value outside enum kvt_io is refused. */
static void test_bad_io(void **state)
{
    struct xfer_config cfg = {.io = KVT_IO_DMA + 1};
    struct kv_pool dev;
    struct host_pool host;
    struct xfer_engine *x = (struct xfer_engine *)&dev;

    (void)state;
    assert_int_equal(kv_pool_init(&dev, &dev_backend_cuda, &shapes[0].g, 4 * 4), 0);
    assert_int_equal(host_pool_init(&host, &dev_backend_cuda, &shapes[0].g, 4, 8, 0), 0);
    assert_int_equal(xfer_create(&dev, &host, &cfg, &x), -EINVAL);
    assert_null(x);
    host_pool_finish(&host);
    kv_pool_finish(&dev);
}

/* ---- many ops in flight: the index ring wraps and fills ---- */

#define RING_DEV_PAGES 2048
#define RING_HOST_PAGES 4096
#define RING_OPS 48
#define RING_N 2000 /* 48 x 4000 page numbers: more than the ring holds at once */

/* Load op k fills device pages 1..RING_N from host pages k*37 + i (mod the pool), page i
 * of the list going to device page 1 + (i * 7) % RING_N. The last op's bytes must win. */
static void ring_lists(uint32_t k, uint32_t *dev, uint32_t *host)
{
    for (uint32_t i = 0; i < RING_N; i++) {
        dev[i] = 1 + (i * 7) % RING_N;
        host[i] = (k * 37 + i) % RING_HOST_PAGES;
    }
}

static void test_ring_many_ops(void **state)
{
    static uint32_t dev[RING_N], host[RING_N];
    struct xfer_config cfg = {.io = KVT_IO_KERNEL};
    uint64_t id = 0, kern, dma;
    struct rig r;

    (void)state;
    if (!rig_up(&r, &shapes[0].g, shapes[0].ps, HOST_PAGE_FIRST, RING_DEV_PAGES, RING_HOST_PAGES,
                &cfg))
        skip();
    for (uint32_t p = 0; p < RING_HOST_PAGES; p++)
        for (uint32_t l = 0; l < r.host.layers; l++)
            for (int w = 0; w < 2; w++)
                make_span(&r, p, l, w, host_pool_rows(&r.host, p, l, w));
    for (uint32_t k = 0; k < RING_OPS; k++) {
        ring_lists(k, dev, host);
        id = submit(&r, XFER_LOAD, dev, host, RING_N, NULL);
    }
    assert_int_equal(xfer_wait(r.x, XFER_LOAD, id), 0);
    xfer_path_ops(r.x, &kern, &dma);
    assert_int_equal(kern + dma, RING_OPS);
    assert_true(kern > 0);
    printf("# %llu ops by kernel, %llu by dma (ring full)\n", (unsigned long long)kern,
           (unsigned long long)dma);
    for (uint32_t i = 0; i < RING_N; i++)
        if (!dev_holds(&r, dev[i], host[i]))
            fail_msg("device page %u does not hold host page %u", dev[i], host[i]);
    rig_down(&r);
}

/* ---- per-layer waits through a stream ---- */

/* Pages of 16 tokens of 8 heads x 128 x 2 bytes (32 KiB per page, layer and K/V) over 8
 * layers: a load of 128 pages is 64 MiB, long enough that a reader not held by the layer's
 * event would see the filler. */
static const struct kvt_geometry big = {
    .attention = KVT_ATTN_MHA, .layers = 8, .kv_heads = 8, .head_dim = 128, .dtype_bytes = 2};
#define BIG_PS 16
#define BIG_N 128

static void fill_host_big(struct rig *r)
{
    for (uint32_t p = 0; p < BIG_N; p++)
        for (uint32_t l = 0; l < big.layers; l++)
            for (int w = 0; w < 2; w++)
                make_span(r, 1000 + p, l, w, host_pool_rows(&r->host, p, l, w));
}

/* Zero the device rows the load will fill, and wait for it. */
static void clear_dev_big(struct rig *r)
{
    size_t bytes = (size_t)BIG_N * span(r, 0);

    for (uint32_t l = 0; l < big.layers; l++)
        for (int w = 0; w < 2; w++)
            assert_int_equal(cudaMemset((uint8_t *)r->dev.buf[w][l] + span(r, w), 0, bytes),
                             cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

/* Each layer: the reader stream waits for the layer, then copies its rows out. */
static void read_layers_after_waits(struct rig *r, uint64_t id, cudaStream_t cs, uint8_t *out)
{
    size_t bytes = (size_t)BIG_N * span(r, 0);

    for (uint32_t l = 0; l < big.layers; l++) {
        assert_int_equal(xfer_wait_layer(r->x, id, l, cs), 0);
        for (int w = 0; w < 2; w++)
            assert_int_equal(cudaMemcpyAsync(out + (2 * (size_t)l + w) * bytes,
                                             (uint8_t *)r->dev.buf[w][l] + span(r, w), bytes,
                                             cudaMemcpyDeviceToHost, cs),
                             cudaSuccess);
    }
    assert_int_equal(cudaStreamSynchronize(cs), cudaSuccess);
}

static void check_layers_out(struct rig *r, const uint8_t *out)
{
    static uint8_t want[32768];
    size_t sp = span(r, 0);

    assert_true(sp <= sizeof(want));
    for (uint32_t l = 0; l < big.layers; l++)
        for (int w = 0; w < 2; w++)
            for (uint32_t p = 0; p < BIG_N; p++) {
                make_span(r, 1000 + p, l, w, want);
                if (memcmp(out + ((2 * (size_t)l + w) * BIG_N + p) * sp, want, sp))
                    fail_msg("layer %u %c page %u read before it landed", l, "KV"[w], p);
            }
}

static void layer_wait_stream(enum mode m, bool legacy)
{
    struct xfer_config cfg = mode_config(m);
    uint32_t dev[BIG_N], host[BIG_N];
    cudaStream_t cs = NULL;
    uint8_t *out = NULL;
    struct rig r;

    if (!rig_up(&r, &big, BIG_PS, HOST_LAYER_FIRST, BIG_N + 1, BIG_N, &cfg))
        return;
    for (uint32_t i = 0; i < BIG_N; i++) {
        dev[i] = 1 + i; /* one run on both sides, so the dma path moves it in 16 copies */
        host[i] = i;
    }
    fill_host_big(&r);
    clear_dev_big(&r);
    assert_int_equal(cudaMallocHost((void **)&out, 2 * (size_t)big.layers * BIG_N * span(&r, 0)),
                     cudaSuccess);
    if (!legacy)
        assert_int_equal(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), cudaSuccess);
    uint64_t id = submit(&r, XFER_LOAD, dev, host, BIG_N, NULL);
    read_layers_after_waits(&r, id, cs, out);
    check_layers_out(&r, out);
    assert_int_equal(xfer_wait(r.x, XFER_LOAD, id), 0);
    if (cs)
        cudaStreamDestroy(cs);
    cudaFreeHost(out);
    rig_down(&r);
}

static void test_layer_wait_stream(void **state)
{
    (void)state;
    for (enum mode m = M_AUTO; m < NMODES; m++) {
        printf("# %s\n", mode_names[m]);
        layer_wait_stream(m, false);
        layer_wait_stream(m, true);
    }
}

/* ---- backups wait on their ready event ---- */

static void CUDART_CB sleep_100ms(void *arg)
{
    struct timespec ts = {0, 100 * 1000 * 1000};

    (void)arg;
    while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
        ;
}

/* The "forward": on stream cs, after a 100 ms stall, new rows (tag 2000 + p) land on the
 * device pages; ready is recorded after them. */
static void forward_writes(struct rig *r, cudaStream_t cs, cudaEvent_t ready, uint8_t *staging)
{
    size_t sp = span(r, 0), bytes = (size_t)BIG_N * sp;

    for (uint32_t l = 0; l < big.layers; l++)
        for (int w = 0; w < 2; w++)
            for (uint32_t p = 0; p < BIG_N; p++)
                make_span(r, 2000 + p, l, w, staging + ((2 * (size_t)l + w) * BIG_N + p) * sp);
    assert_int_equal(cudaLaunchHostFunc(cs, sleep_100ms, NULL), cudaSuccess);
    for (uint32_t l = 0; l < big.layers; l++)
        for (int w = 0; w < 2; w++)
            assert_int_equal(cudaMemcpyAsync((uint8_t *)r->dev.buf[w][l] + sp,
                                             staging + (2 * (size_t)l + w) * bytes, bytes,
                                             cudaMemcpyHostToDevice, cs),
                             cudaSuccess);
    assert_int_equal(cudaEventRecord(ready, cs), cudaSuccess);
}

static void backup_waits_ready(enum mode m)
{
    struct xfer_config cfg = mode_config(m);
    uint32_t dev[BIG_N], host[BIG_N];
    uint8_t *staging = NULL;
    cudaStream_t cs;
    cudaEvent_t ready;
    struct rig r;

    if (!rig_up(&r, &big, BIG_PS, HOST_PAGE_FIRST, BIG_N + 1, BIG_N, &cfg))
        return;
    for (uint32_t i = 0; i < BIG_N; i++) {
        dev[i] = 1 + i;
        host[i] = BIG_N - 1 - i; /* reversed: runs on the device side only */
    }
    clear_dev_big(&r); /* the old rows: zero */
    assert_int_equal(
        cudaMallocHost((void **)&staging, 2 * (size_t)big.layers * BIG_N * span(&r, 0)),
        cudaSuccess);
    assert_int_equal(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), cudaSuccess);
    forward_writes(&r, cs, ready, staging);
    uint64_t id = submit(&r, XFER_BACKUP, dev, host, BIG_N, ready);
    assert_int_equal(xfer_wait(r.x, XFER_BACKUP, id), 0);
    for (uint32_t i = 0; i < BIG_N; i++)
        if (!host_holds(&r, host[i], 2000 + i))
            fail_msg("%s: host page %u was backed up before its forward", mode_names[m], host[i]);
    assert_int_equal(cudaStreamSynchronize(cs), cudaSuccess);
    cudaEventDestroy(ready);
    cudaStreamDestroy(cs);
    cudaFreeHost(staging);
    rig_down(&r);
}

static void test_backup_waits_ready(void **state)
{
    (void)state;
    for (enum mode m = M_AUTO; m < NMODES; m++) {
        printf("# %s\n", mode_names[m]);
        backup_waits_ready(m);
    }
}

/* ---- the pool's rows, scattered (kvt_kv_write, kvt_kv_read) ---- */

/* Rows of 32 KiB of K and of V: a 32 MiB staging chunk holds 512 of them, so 1,300 rows
 * cross in three chunks, the last one short. */
static const struct kvt_geometry big_rows = {
    .attention = KVT_ATTN_MHA, .layers = 2, .kv_heads = 8, .head_dim = 1024, .dtype_bytes = 4};

static void fill_rows(const struct kv_pool *p, uint32_t layer, int w, const int32_t *slots,
                      size_t n, uint8_t *out)
{
    size_t rb = p->row_bytes[w];

    for (size_t i = 0; i < n; i++)
        for (size_t b = 0; b < rb; b++)
            out[i * rb + b] = pattern((uint32_t)slots[i] + 1, layer, w, b);
}

/* Every row of layer as one copy of the whole layer reads it (one run: never the batched
 * path): the rows written (written[s]) hold their pattern, the others are zero. */
static bool layer_holds(struct kv_pool *p, uint32_t layer, const int32_t *every,
                        const bool *written, uint8_t *all[2], uint8_t *want)
{
    bool mha = p->row_bytes[1] != 0;

    assert_int_equal(kv_pool_read(p, layer, every, p->rows, all[0], mha ? all[1] : NULL), 0);
    for (uint64_t s = 0; s < p->rows; s++)
        for (int w = 0; w < (mha ? 2 : 1); w++) {
            size_t rb = p->row_bytes[w];
            for (size_t b = 0; b < rb; b++)
                want[b] = written[s] ? pattern((uint32_t)s + 1, layer, w, b) : 0;
            if (memcmp(all[w] + s * rb, want, rb))
                return false;
        }
    return true;
}

static void rows_scattered(const struct kvt_geometry *g, uint64_t rows, size_t n)
{
    struct kv_pool p;
    int32_t *slots = malloc(rows * sizeof(*slots)), *back = malloc(n * sizeof(*back));
    int32_t *every = malloc(rows * sizeof(*every));
    bool *written = calloc(rows, sizeof(*written)), mha = g->attention == KVT_ATTN_MHA;
    uint64_t x = 0x2545f4914f6cdd1dull;
    uint8_t *buf[2], *got[2], *all[2], *want;
    size_t rb;

    assert_int_equal(kv_pool_init(&p, &dev_backend_cuda, g, rows), 0);
#ifdef KVT_HAVE_KERNELS
    assert_non_null(p.batch);
#endif
    rb = p.row_bytes[0] > p.row_bytes[1] ? p.row_bytes[0] : p.row_bytes[1];
    for (int w = 0; w < 2; w++) {
        buf[w] = malloc(n * rb);
        got[w] = malloc(n * rb);
        all[w] = malloc(rows * rb);
        assert_true(buf[w] && got[w] && all[w]);
    }
    want = malloc(rb);
    assert_true(slots && back && every && written && want);
    /* n distinct slots in shuffled order: runs of one row, seldom two. */
    for (uint64_t i = 0; i < rows; i++)
        slots[i] = every[i] = (int32_t)i;
    for (uint64_t i = rows - 1; i > 0; i--) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t j = x % (i + 1);
        int32_t t = slots[i];
        slots[i] = slots[j], slots[j] = t;
    }
    for (size_t i = 0; i < n; i++) {
        written[slots[i]] = true;
        back[i] = slots[n - 1 - i];
    }
    for (uint32_t l = 0; l < g->layers; l++) {
        for (int w = 0; w < (mha ? 2 : 1); w++)
            fill_rows(&p, l, w, slots, n, buf[w]);
        assert_int_equal(kv_pool_write(&p, l, slots, n, buf[0], mha ? buf[1] : NULL), 0);
    }
#ifdef KVT_HAVE_KERNELS
    if (kernels_expected) /* the batched path itself, not the copy per run it falls back to */
        assert_int_equal(
            dev_backend_cuda.rows_copy(p.batch, 0, slots, 2, got[0], mha ? got[1] : NULL, 0), 0);
#endif
    for (uint32_t l = 0; l < g->layers; l++) {
        assert_true(layer_holds(&p, l, every, written, all, want));
        /* Read back batched, in the other order. */
        assert_int_equal(kv_pool_read(&p, l, back, n, got[0], mha ? got[1] : NULL), 0);
        for (int w = 0; w < (mha ? 2 : 1); w++) {
            fill_rows(&p, l, w, back, n, buf[w]);
            assert_memory_equal(got[w], buf[w], n * p.row_bytes[w]);
        }
    }
    kv_pool_finish(&p);
    for (int w = 0; w < 2; w++) {
        free(buf[w]);
        free(got[w]);
        free(all[w]);
    }
    free(want);
    free(every);
    free(written);
    free(back);
    free(slots);
}

static void test_kv_rows_scattered(void **state)
{
    (void)state;
    for (size_t i = 0; i < NSHAPES; i++) {
        printf("# %s\n", shapes[i].name);
        rows_scattered(&shapes[i].g, 600, 500);
    }
    printf("# rows of 32 KiB, three staging chunks\n");
    rows_scattered(&big_rows, 2048, 1300);
}

#ifdef KVT_HAVE_KERNELS
static bool gpu_is_sm90_or_newer(void)
{
    int dev = 0, major = 0;

    return cudaGetDevice(&dev) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
           major >= 9;
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_auto),
        cmocka_unit_test(test_round_trip_kernel),
        cmocka_unit_test(test_round_trip_dma),
        cmocka_unit_test(test_round_trip_auto_dma),
        cmocka_unit_test(test_auto_picks),
        cmocka_unit_test(test_bad_io),
        cmocka_unit_test(test_ring_many_ops),
        cmocka_unit_test(test_layer_wait_stream),
        cmocka_unit_test(test_backup_waits_ready),
        cmocka_unit_test(test_round_trip_kernel_one_block),
        cmocka_unit_test(test_round_trip_dma_hint),
        cmocka_unit_test(test_kv_rows_scattered),
    };

    if (dev_cuda_device_count() == 0)
        return T_EXIT_SKIP;
#ifdef KVT_HAVE_KERNELS
    kernels_expected = gpu_is_sm90_or_newer();
#endif
    return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* !KVT_HAVE_CUDA */

int main(void)
{
    return T_EXIT_SKIP;
}

#endif
