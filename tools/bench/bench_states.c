/* kvtier-bench's recurrent states (bench.h): a hybrid model's checkpoints, taken where SGLang
 * would take them and checked byte for byte when a request starts from one. */
#include <string.h>

#include "bench.h"

/* One recurrent layer's conv (part 0) or SSM (part 1) state after tokens [0, pos): a
 * function of their hash, with layer numbers apart from the KV layers'. */
static void fill_state(const struct bench *b, size_t pos, uint32_t layer, int part, uint8_t *buf)
{
    bench_fill_row(b->hash[pos - 1], 0x10000u + layer, part, buf, state_part_bytes(b, part));
}

/* The forward reached a checkpoint at pos: its state goes to the request's track slot. */
static int checkpoint(struct bench *b, const struct kvt_req *req, size_t pos)
{
    struct kvt_req_mamba m;
    int rc = kvt_req_mamba(b->e, req, &m);

    if (rc)
        return engine_error("kvt_req_mamba", rc);
    for (uint32_t l = 0; l < b->cfg->mamba.layers; l++)
        for (int part = 0; part < 2; part++) {
            fill_state(b, pos, l, part, b->state[part]);
            if ((rc = kvt_mamba_write(b->e, m.track_slot, l, part, b->state[part])))
                return engine_error("kvt_mamba_write", rc);
            b->c.bytes_compute += state_part_bytes(b, part);
        }
    if ((rc = kvt_req_mamba_track(b->e, req, pos, 0)))
        return engine_error("kvt_req_mamba_track", rc);
    b->c.checkpoints++;
    return 0;
}

/* The state the request starts from (a copy of the checkpoint at its cached prefix) must
 * be the state after that prefix, byte for byte. */
int bench_verify_state(struct bench *b, const struct kvt_req *req)
{
    size_t hit = req->protected_len;
    struct kvt_req_mamba m;
    int rc;

    if (!hybrid(b) || hit == 0)
        return 0;
    if ((rc = kvt_req_mamba(b->e, req, &m)))
        return engine_error("kvt_req_mamba", rc);
    for (uint32_t l = 0; l < b->cfg->mamba.layers; l++)
        for (int part = 0; part < 2; part++) {
            size_t n = state_part_bytes(b, part);
            if ((rc = kvt_mamba_read(b->e, m.slot, l, part, b->state[part])))
                return engine_error("kvt_mamba_read", rc);
            fill_state(b, hit, l, part, b->want);
            if (memcmp(b->want, b->state[part], n) != 0)
                bench_note_mismatch(b, hit - 1, l, 2 + part);
            b->c.bytes_verify += n;
        }
    b->c.states_checked++;
    return 0;
}

/* A checkpoint at `at` handed to the cache at once (as a chunked prefill's progress is), so
 * that later ones do not displace it. The row is read back: the cache may have kept its own
 * copy of our pages. */
static int cache_checkpoint(struct bench *b, struct kvt_req *req, size_t at)
{
    struct kvt_key key = {.tokens = b->tokens, .len = b->filled};
    int rc;

    if (at <= req->protected_len)
        return 0;
    if (checkpoint(b, req, at))
        return -1;
    if ((rc = kvt_req_cache_unfinished(b->e, req, &key)))
        return engine_error("kvt_req_cache_unfinished", rc);
    if ((rc = kvt_req_read(b->e, req, 0, b->filled, b->slots)))
        return engine_error("kvt_req_read", rc);
    return 0;
}

/* After the prefill, checkpoints where a later match can use them: at the branching point
 * the match named (SGLang's mamba_branching_seqlen), then at the last chunk multiple of the
 * input a match can reach (it matches all but the last input token). */
int bench_prefill_checkpoints(struct bench *b, struct kvt_req *req, size_t in)
{
    struct kvt_req_mamba m;
    int rc;

    if (!hybrid(b))
        return 0;
    if ((rc = kvt_req_mamba(b->e, req, &m)))
        return engine_error("kvt_req_mamba", rc);
    if (m.branch_len && cache_checkpoint(b, req, m.branch_len))
        return -1;
    return cache_checkpoint(b, req, (in - 1) / m.grid * m.grid);
}

/* A decode step that brought the sequence to seq tokens: a checkpoint every decode grid. */
int bench_decode_checkpoint(struct bench *b, const struct kvt_req *req, size_t seq)
{
    struct kvt_req_mamba m;
    int rc;

    if (!hybrid(b))
        return 0;
    if ((rc = kvt_req_mamba(b->e, req, &m)))
        return engine_error("kvt_req_mamba", rc);
    return seq % m.decode_grid == 0 && seq > req->protected_len ? checkpoint(b, req, seq) : 0;
}

/* Test seam: flip the first byte of every state slot's first conv state (the cached
 * checkpoints among them; no request runs now). The public calls write only a request's own
 * slots, so this goes through the buffer's address, which on the sim backend is host memory. */
int bench_corrupt_states(struct bench *b)
{
    struct kvt_stats st = {.size = sizeof(st)};
    void *base;
    size_t bytes;
    int rc;

    if (!hybrid(b))
        return 0;
    if ((rc = kvt_stats(b->e, &st)) || (rc = kvt_mamba_buffer(b->e, 0, 0, &base, &bytes)))
        return engine_error("kvt_mamba_buffer", rc);
    if (st.backend != KVT_BACKEND_SIM)
        return say("--corrupt-after: a hybrid model's states are damaged on the sim backend only");
    for (uint64_t s = 1; s <= st.mamba_slots; s++)
        ((uint8_t *)base)[s * bytes] ^= 0x5a;
    return 0;
}
