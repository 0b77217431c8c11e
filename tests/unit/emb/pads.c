/* Image tokens in the prefix cache: an item's pad tokens (kvt_emb_pad_tokens) part prefixes
 * with different items and share those with the same one; namespaces (LoRA, cache_salt) keep
 * their own KV and embeddings; and what a collision of pad values does, in SGLang's scheme
 * before 0.5 (one value, the hash mod 2^30) and in kvtier's (8 words of 31 bits). */
#include "emb_test.h"

#define PS 4
#define KEY 32

/* Insert tokens[0..KEY) in namespace ns with fresh slots (the cache keeps what it lacked). */
static void insert(kvt_engine *e, const uint32_t *tokens, const char *ns)
{
    struct kvt_key k = {tokens, KEY, ns, ns ? strlen(ns) : 0};
    int32_t slots[KEY];
    size_t have = 0;

    assert_int_equal(kvt_alloc(e, KEY, slots), 0);
    assert_int_equal(kvt_insert(e, &k, slots, 0, &have), 0);
    assert_int_equal(kvt_free(e, slots, have), 0);
}

static size_t matched(kvt_engine *e, const uint32_t *tokens, const char *ns)
{
    struct kvt_key k = {tokens, KEY, ns, ns ? strlen(ns) : 0};
    struct kvt_match m;

    assert_int_equal(kvt_match(e, &k, NULL, &m), 0);
    return m.device_len;
}

/* text tokens [0, at), the pads of an item of hash h [at, at + 16), text after: the same
 * text for every item. */
static void prompt(uint32_t *t, size_t at, const uint8_t *h)
{
    for (size_t i = 0; i < KEY; i++)
        t[i] = (uint32_t)(1000 + i);
    kvt_emb_pad_tokens(h, t + at, 16);
}

static kvt_engine *kv_engine(void)
{
    struct emb_cfg cfg = {.device = 64 * 1024};

    return emb_engine(&cfg);
}

/* The helper's tokens: bit 31 set, 31 bits of each hash word in turn, 8 words a cycle. */
void test_pad_tokens(void **state)
{
    (void)state;
    uint8_t h[32];
    uint32_t t[20], u[20];

    for (int i = 0; i < 32; i++)
        h[i] = (uint8_t)(i * 37 + 1);
    memset(t, 0, sizeof(t));
    kvt_emb_pad_tokens(h, t, 20);
    for (size_t i = 0; i < 20; i++) {
        const uint8_t *w = h + 4 * (i % 8);
        uint32_t v = w[0] | w[1] << 8 | w[2] << 16 | (uint32_t)w[3] << 24;
        assert_int_equal(t[i], 0x80000000u | (v & 0x7fffffff));
    }
    assert_int_equal(t[8], t[0]);
    assert_true(t[1] != t[0]);
    memcpy(u, t, sizeof(u));
    kvt_emb_pad_tokens(NULL, t, 20); /* nothing */
    kvt_emb_pad_tokens(h, NULL, 20);
    assert_memory_equal(t, u, sizeof(t));
    /* The prefix limit: never fewer than 8 tokens into an item. */
    size_t starts[2] = {6, 30};
    assert_int_equal(kvt_emb_prefix_limit(starts, 2, 32, PS), 28); /* 2 into item 1 */
    assert_int_equal(kvt_emb_prefix_limit(starts, 2, 12, PS), 4);  /* 6 into item 0 */
    assert_int_equal(kvt_emb_prefix_limit(starts, 2, 14, PS), 4);  /* 12, then as 12 */
    assert_int_equal(kvt_emb_prefix_limit(starts, 2, 16, PS), 16); /* 10 into it */
    assert_int_equal(kvt_emb_prefix_limit(starts, 2, 36, PS), 28); /* 6 into item 1 */
    assert_int_equal(kvt_emb_prefix_limit(starts, 2, 40, PS), 40); /* 10 into item 1 */
    assert_int_equal(kvt_emb_prefix_limit(starts, 2, 4, PS), 4);
    assert_int_equal(kvt_emb_prefix_limit(NULL, 0, 9, PS), 8);
    assert_int_equal(kvt_emb_prefix_limit(NULL, 1, 9, PS), 0);
    assert_int_equal(kvt_emb_prefix_limit(starts, 2, 9, 0), 0);
    /* An item of 2 tokens right before another: a cut into the second lands in the first. */
    size_t close[2] = {5, 7};
    assert_int_equal(kvt_emb_prefix_limit(close, 2, 8, PS), 4);
    size_t later[2] = {1, 8}; /* cut to 8 by the second, which is 7 into the first */
    assert_int_equal(kvt_emb_prefix_limit(later, 2, 12, PS), 0);
}

/* Two images after the same text share nothing past the text; the same image twice shares
 * everything; the page where the image starts is shared only when its pads match. */
void test_image_prefixes(void **state)
{
    (void)state;
    kvt_engine *e = kv_engine();
    uint8_t h1[32], h2[32];
    uint32_t a[KEY], b[KEY], c[KEY];

    item_hash(1, h1);
    item_hash(2, h2);
    prompt(a, 6, h1);
    prompt(b, 6, h2);
    prompt(c, 6, h1);
    insert(e, a, NULL);
    assert_int_equal(matched(e, b, NULL), 4); /* page 1 holds the pads' first two: parted */
    assert_int_equal(matched(e, c, NULL), KEY);
    /* Image at a page boundary: the text's two pages only. */
    prompt(a, 8, h1);
    prompt(b, 8, h2);
    insert(e, a, NULL);
    assert_int_equal(matched(e, b, NULL), 8);
    /* Text differing before the same image: nothing shared (KV depends on all before it);
     * the embedding is the same one all the same, which the embedding cache serves. */
    prompt(c, 8, h1);
    c[0] = 1;
    assert_int_equal(matched(e, c, NULL), 0);
    kvt_close(e);
}

/* LoRA adapters and cache salts are namespaces: the same prompt, image included, shares
 * nothing across them, and the same item hash names two embeddings. */
void test_namespaces(void **state)
{
    (void)state;
    kvt_engine *e = kv_engine();
    uint8_t h1[32];
    uint32_t a[KEY];
    struct kvt_emb x, y;

    item_hash(1, h1);
    prompt(a, 6, h1);
    insert(e, a, "lora:7");
    assert_int_equal(matched(e, a, "lora:7"), KEY);
    assert_int_equal(matched(e, a, NULL), 0);
    assert_int_equal(matched(e, a, "lora:8"), 0);
    assert_int_equal(matched(e, a, "salt:7"), 0);
    insert(e, a, NULL);
    assert_int_equal(matched(e, a, NULL), KEY);
    assert_int_equal(put_item(e, "lora:7", 1, 1000, NULL), 0);
    assert_int_equal(where(e, NULL, 1), -ENOENT);
    assert_int_equal(put_item(e, NULL, 1, 3000, NULL), 0);
    assert_int_equal(fetch_item(e, "lora:7", 1, &x), 0);
    assert_int_equal(fetch_item(e, NULL, 1, &y), 0);
    assert_int_equal(x.len, 1000);
    assert_int_equal(y.len, 3000);
    assert_true(x.ptr != y.ptr);
    assert_int_equal(kvt_emb_release(e, &x), 0);
    assert_int_equal(kvt_emb_release(e, &y), 0);
    kvt_close(e);
}

/* A collision of pad values. SGLang before 0.5 padded an image with one value, its hash mod
 * 2^30: two images agreeing on those 30 bits have the same tokens, and the prefix cache
 * shares the whole of the first image's KV with the second (wrong KV: keys are token ids, in
 * kvtier as in SGLang); the embedding cache, keyed by the whole hash, still keeps them apart.
 * kvtier's pads take 248 bits of the hash: agreeing on the first word's 31 bits shares only
 * the page where the image starts, when it holds fewer than 8 of its pads, and
 * kvt_emb_prefix_limit keeps a request from using such a page; only hashes agreeing on all
 * 248 bits share the image's KV. */
void test_pad_collision(void **state)
{
    (void)state;
    kvt_engine *e = kv_engine();
    uint8_t h1[32], h2[32];
    uint32_t a[KEY], b[KEY];
    struct kvt_emb x, y;

    /* SGLang's old scheme: two hashes equal mod 2^30, different above. */
    item_hash(1, h1);
    memcpy(h2, h1, 32);
    h2[31] ^= 0x40;
    uint32_t v1, v2;
    memcpy(&v1, h1, 4);
    memcpy(&v2, h2, 4);
    for (size_t i = 0; i < KEY; i++)
        a[i] = b[i] = (uint32_t)(1000 + i);
    for (size_t i = 6; i < 22; i++) {
        a[i] = v1 % (1u << 30);
        b[i] = v2 % (1u << 30);
    }
    insert(e, a, NULL);
    assert_int_equal(matched(e, b, NULL), KEY); /* the whole image's KV: the hazard */
    /* The embeddings stay apart: the cache keys the whole 32 bytes. */
    uint8_t buf1[64], buf2[64];
    memset(buf1, 1, sizeof(buf1));
    memset(buf2, 2, sizeof(buf2));
    assert_int_equal(kvt_emb_put(e, &(struct kvt_emb_key){h1, NULL, 0}, buf1, 64, &x), 0);
    assert_int_equal(kvt_emb_put(e, &(struct kvt_emb_key){h2, NULL, 0}, buf2, 64, &y), 0);
    assert_true(x.ptr != y.ptr);
    assert_memory_equal(y.ptr, buf2, 64); /* sim: device memory is host memory */
    assert_int_equal(kvt_emb_release(e, &x), 0);
    assert_int_equal(kvt_emb_release(e, &y), 0);
    /* kvtier's pads, the same 30 bits (and more: the whole first word): image at 7, so page
     * 1 holds one pad. That page is shared; the next is not. */
    memcpy(h2, h1, 32);
    h2[4] ^= 1; /* word 1 differs */
    prompt(a, 7, h1);
    prompt(b, 7, h2);
    insert(e, a, NULL);
    assert_int_equal(matched(e, b, NULL), 8);
    size_t starts[1] = {7};
    assert_int_equal(kvt_emb_prefix_limit(starts, 1, matched(e, b, NULL), PS), 4);
    assert_int_equal(kvt_emb_prefix_limit(starts, 1, matched(e, a, NULL), PS), KEY);
    /* Hashes equal but for bit 31 of each word (not in the pads): the same tokens, the
     * image's KV shared, as for any collision of the pads' 248 bits. */
    memcpy(h2, h1, 32);
    for (int w = 0; w < 8; w++)
        h2[4 * w + 3] ^= 0x80;
    prompt(b, 7, h2);
    assert_int_equal(matched(e, b, NULL), KEY);
    kvt_close(e);
}
