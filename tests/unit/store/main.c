#include "store_test.h"

/* ---- the two variants ---- */

static int probe_uring(void)
{
    char dir[64];
    struct fx f = {0};
    int rc;

    if ((rc = fixture_data_dir(dir, sizeof(dir), "store-probe")))
        return rc;
    snprintf(f.dir, sizeof(f.dir), "%s", dir);
    fx_options(&f);
    f.o.io = DSTORE_IO_URING;
    rc = dstore_open(&f.o, &f.s);
    dstore_close(f.s);
    rm_rf(dir);
    return rc;
}

static int use_uring(void **state)
{
    (void)state;
    io_kind = DSTORE_IO_URING;
    if (uring_err == 1)
        uring_err = probe_uring();
    if (uring_err)
        print_message("io_uring refused by this kernel or sandbox (%s): the io_uring variant "
                      "is skipped\n",
                      strerror(-uring_err));
    return 0;
}

static int use_psync(void **state)
{
    (void)state;
    io_kind = DSTORE_IO_PSYNC;
    return 0;
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(void)
{
    const struct CMUnitTest tests[] = {
        T(test_roundtrip_batched),
        T(test_buffered_round_trip),
        T(test_async_poll),
        T(test_duplicates),
        T(test_duplicates_shared_tag),
        T(test_bad_input),
        T(test_iterate),
        T(test_unaligned),
        T(test_direct_and_buffered),
        T(test_parts),
        T(test_parts_adjacent),
        T(test_small_pages_buffered),
        T(test_tmpfs),
        T(test_in_memory),
        T(test_registered_buffers),
        T(test_uring_refused),
        T(test_restart),
        T(test_relaxed_stamp),
        T(test_lost_index),
        T(test_hollow_index),
        T(test_fingerprint),
        T(test_foreign_dir),
        T(test_format_version),
        T(test_packed_slots),
        T(test_format2_dir),
        T(test_meta_damaged),
        T(test_meta_flipped),
        T(test_meta_flipped_no_slabs),
        T(test_locked),
        T(test_lock_probe),
        T(test_as_found),
        T(test_readonly),
        T(test_flipped_bytes),
        T(test_truncated_slab),
        T(test_garbled_index),
        T(test_faults),
        T(test_rebuild_failed),
        T(test_evict_keeps_batch_dup),
        T(test_lru_eviction),
        T(test_evict_ahead),
        T(test_chain_ends_first),
        T(test_batch_larger_than_store),
        T(test_capacity_lowered),
        T(test_disk_use),
        T(test_disk_use_big_pages),
        T(test_stripes),
        T(test_reader_beside_growth),
        T(test_not_regular_files),
        T(test_pinned_slot),
        T(test_wait_timeout),
        T(test_crash),
        T(test_crash_relaxed),
        T(test_pipe_order),
        T(test_pipe_same_key),
        T(test_group_commit),
        T(test_reads_before_writes),
        T(test_durable_flushes),
        T(test_relaxed_flushes),
        T(test_flush_fails_no_reuse),
        T(test_bad_reads_drop_together),
        T(test_bad_slots_before_eviction),
        T(test_power_cut_relaxed),
        T(test_power_cut_durable),
        T(test_power_cut_packed),
        T(test_reads_cost_no_flush),
        T(test_access_order_after_close),
        T(test_access_period),
        T(test_access_slot_only),
        T(test_access_crash),
        T(test_access_crash_relaxed),
    };
    int failed = 0;

    if (getenv("KVT_TEST_FILTER"))
        cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
    failed += cmocka_run_group_tests_name("store_uring", tests, use_uring, NULL);
    failed += cmocka_run_group_tests_name("store_psync", tests, use_psync, NULL);
    return failed;
}
