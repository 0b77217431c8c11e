/*
 * The transfer engine: moves whole pages between the device KV pool and the host pool.
 *
 * Two streams, as SGLang's cache controller has: loads (host -> device) run on the load
 * stream, backups (device -> host) on the write stream. Ops on one stream complete in the
 * order they were submitted, so an op is named by a sequence number and "done" is a single
 * watermark per stream: op id is done once the stream's watermark reaches it.
 *
 * A load copies layer by layer and marks each layer as it lands, so the caller can start
 * layer k while k+1 is still on its way (xfer_wait_layer). A backup copies the pages whole.
 * Pages whose device and host numbers both run consecutively are copied as one run.
 *
 * A sliding-window model (xfer_config.swa) keeps its device KV in two pools (device/swa_pool.h):
 * the full-attention layers in swa->full, the sliding-window layers in swa->swa, while a host
 * page still holds every model layer. Each page then names its full-pool page and its SWA-pool
 * page (xfer_submit_swa), 0 where it has none: its sliding-window layers are skipped, on both
 * sides, and the host page's rows of those layers are left as they were. Layers, layer marks
 * and waits count model layers. sim only: cuda refuses such an engine (not yet run on a GPU).
 *
 * sim: one worker thread per stream does the copies with memcpy, so the asynchrony is real:
 * submit returns at once and the wait functions block on the CPU.
 * cuda: two non-blocking streams, one event per layer for loads, and a host callback that
 * moves the watermark. Each op goes by one of two paths, as xfer_config.io says:
 * - kernel: gather/scatter kernels (kernels/kv_copy.h) read and write the pinned host pool
 *   through its device mapping; one launch per layer for a load (its event follows), one
 *   launch over all layers for a backup. The page numbers reach the device through a
 *   per-stream ring (pinned staging, copied on the op's stream); an op that finds no room
 *   there (64 Ki pages already in flight on its stream) goes by dma instead.
 * - dma: the copy engine, one copy per run and layer (per page and layer in page_first),
 *   submitted with cudaMemcpyBatchAsync where the toolkit has it, else cudaMemcpyAsync.
 * - auto: kernel when the op's copies would be short (mean below auto_dma_min_bytes), dma
 *   when they are long enough to run the link at full speed without the SMs.
 *
 * Threading: submit, wait and the queries are called from the engine's owner thread only;
 * the workers never touch the tree or the allocators.
 */
#ifndef KVT_HOST_TRANSFER_H
#define KVT_HOST_TRANSFER_H

#include <stddef.h>
#include <stdint.h>

#include "device/kv_pool.h"
#include "host/host_pool.h"

enum xfer_dir {
    XFER_LOAD = 0,   /* host -> device, per layer */
    XFER_BACKUP = 1, /* device -> host */
};

struct xfer_config {
    uint32_t io; /* enum kvt_io: how cuda copies; sim ignores it */
    /* Test seam (sim only): before each op the worker sleeps a random 0..max_delay_us,
     * drawn from seed, so tests see completions arrive late and in varied timing. */
    uint32_t max_delay_us;
    uint64_t seed;
    /* Test seam (sim only): a load's worker sleeps this long between layers, so a test can
     * see a layer land while later ones are still on their way. */
    uint32_t layer_delay_us;
    /* io=auto: an op whose copy-engine copies would average at least this many bytes goes
     * by DMA, a shorter one by the kernels; 0 means XFER_AUTO_DMA_MIN_BYTES. */
    uint64_t auto_dma_min_bytes;
    /* sim only: copy each op on the submitting thread before xfer_submit returns, so what
     * has landed never depends on timing (kvt_options.sim_serial). */
    bool serial;
    /* NULL: one device pool (dev) holds every layer. Else the pools of a sliding-window model,
     * which must outlive the engine; dev must be &swa->full, and the host pool's layers are
     * the model's, at the rows of both pools. */
    const struct swa_pool *swa;
    /* cuda kernel path: blocks (8 warps each) per layer of a copy at most; 0 means
     * XFER_KERNEL_BLOCKS. Fewer leave more SMs to the forward (docs/measurements.md). */
    uint32_t kernel_blocks;
    /* cuda: loads go on a stream of the device's highest priority, so that a load's copies
     * get the SMs or the copy engine ahead of the forward's work that waits for them. */
    bool high_priority_loads;
    /* cuda, copy engine: ask cudaMemcpyBatchAsync to prefer overlapping compute
     * (cudaMemcpyFlagPreferOverlapWithCompute, a hint). On an H200 the batches without it lost
     * 29-40% beside a forward that fills the SMs; with it: not yet measured on a GPU, so off
     * by default. */
    bool dma_prefer_overlap;
};

/* Below about this size a copy-engine copy pays more in its fixed cost (a microsecond or
 * two to issue and start) than it moves at link speed (about 50 GB/s on PCIe 5); the
 * kernels keep the link full with scattered pages instead. On an H200 (2026-11-26), 32 KiB
 * pieces: kernels 0.90 of one copy's speed loading and 0.93 backing up, the copy engine 0.95
 * and 0.87 but far behind the kernels beside a forward (docs/measurements.md); where long
 * runs start to favour the copy engine is not measured yet. */
#define XFER_AUTO_DMA_MIN_BYTES ((uint64_t)512 << 10)

/* On an H200 (2026-11-26), 16 blocks per layer kept a load's kernels at the link's speed
 * (0.90 of one cudaMemcpyAsync, as with no cap) while a prefill kernel beside them lost 1.3%
 * against 3.8% with a block per 8 page parts; 8 blocks lost link speed. */
#define XFER_KERNEL_BLOCKS 16

struct xfer_engine;
struct swa_pool;

/* Start the streams (sim: the worker threads) for copies between dev and host, which must
 * outlive the engine. cfg may be NULL. -EINVAL for an io that is not an enum kvt_io (on sim
 * too), or pools that disagree (cfg->swa: see there); KVT_ENOBACKEND for io=kernel where the
 * kernels cannot run (not built, no code for this GPU, host pool not mapped for the device),
 * and for cfg->swa on cuda. */
int xfer_create(struct kv_pool *dev, struct host_pool *host, const struct xfer_config *cfg,
                struct xfer_engine **out);

/* Wait for every op in flight, then stop. NULL is a no-op. */
void xfer_destroy(struct xfer_engine *x);

/* Queue a copy of n pages: device page dev_pages[i] <-> host page host_pages[i], every
 * layer. The arrays are copied. ready (cuda only; may be NULL) is a cudaEvent_t the copy
 * waits for first: for a backup, the event recorded after the forward that wrote the pages.
 * *id gets the op's id (ids start at 1 and grow by one per op and direction). -EINVAL for
 * pages out of range; -ENOMEM when the op cannot be queued. On a sliding-window engine the
 * pages have no SWA part: their sliding-window layers are skipped (xfer_submit_swa). */
int xfer_submit(struct xfer_engine *x, enum xfer_dir dir, const uint32_t *dev_pages,
                const uint32_t *host_pages, size_t n, void *ready, uint64_t *id);

/* xfer_submit for a sliding-window engine: dev_pages are full-pool pages, swa_pages[i] the
 * SWA pool's page (its rows / page_size) paired with page i, 0 for none: page i's
 * sliding-window layers are skipped. swa_pages NULL: all 0. Runs need consecutive pages on
 * both sides of a pool, none 0. -EINVAL for an SWA page past the SWA pool, or any nonzero
 * one on an engine without cfg->swa. */
int xfer_submit_swa(struct xfer_engine *x, enum xfer_dir dir, const uint32_t *dev_pages,
                    const uint32_t *swa_pages, const uint32_t *host_pages, size_t n, void *ready,
                    uint64_t *id);

/* The highest op id of dir known to be complete: every op up to it has landed. */
uint64_t xfer_done(struct xfer_engine *x, enum xfer_dir dir);

/* 0 when every op of dir up to id completed without error, or the first error. Does not
 * wait: -EINPROGRESS while id is not done. */
int xfer_status(struct xfer_engine *x, enum xfer_dir dir, uint64_t id);

/* Make the caller wait until layer of load id has landed. sim: blocks on the CPU. cuda: makes
 * stream (a cudaStream_t; NULL is the legacy default stream) wait on that layer's event and
 * returns at once. A done op returns at once. */
int xfer_wait_layer(struct xfer_engine *x, uint64_t id, uint32_t layer, void *stream);

/* Block the calling thread until op id of dir is complete; its status. */
int xfer_wait(struct xfer_engine *x, enum xfer_dir dir, uint64_t id);

/* Bytes copied so far per direction (completed ops only; skipped SWA layers not counted). */
uint64_t xfer_bytes(const struct xfer_engine *x, enum xfer_dir dir);

/* Ops the cuda backend has sent by the kernels and by the copy engine so far, both
 * directions (ops of no pages count in neither; both 0 on sim). Owner thread. */
void xfer_path_ops(const struct xfer_engine *x, uint64_t *kernel_ops, uint64_t *dma_ops);

#endif
