#include "engine_test.h"

/* ---- the engine the tests open, and the checks they share ---- */

void base_options(struct kvt_options *o)
{
    fixture_engine_options(o, 2, 4);
}

kvt_engine *open_engine(void)
{
    struct kvt_options o;
    kvt_engine *e = NULL;

    base_options(&o);
    assert_int_equal(kvt_open(&o, &e), 0);
    return e;
}

void check(const kvt_engine *e)
{
    char why[200];

    if (engine_check(e, why, sizeof(why)))
        fail_msg("engine check: %s", why);
}

struct kvt_stats stats(const kvt_engine *e)
{
    struct kvt_stats st = {.size = sizeof(st)};

    assert_int_equal(kvt_stats(e, &st), 0);
    return st;
}

/* Everything a rejected call must leave as it was. */
void assert_same(const kvt_engine *e, const struct kvt_stats *before)
{
    struct kvt_stats now = stats(e);

    assert_int_equal(now.device_free_tokens, before->device_free_tokens);
    assert_int_equal(now.cached_tokens, before->cached_tokens);
    assert_int_equal(now.protected_tokens, before->protected_tokens);
    assert_int_equal(now.nodes, before->nodes);
    assert_int_equal(now.req_slots_free, before->req_slots_free);
    check(e);
}
