#include "hicache_test.h"

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layer_wait),        cmocka_unit_test(test_match_pending_load),
        cmocka_unit_test(test_write_through),     cmocka_unit_test(test_selective),
        cmocka_unit_test(test_write_back),        cmocka_unit_test(test_load_back_min),
        cmocka_unit_test(test_device_pressure),   cmocka_unit_test(test_pressure_waits_for_load),
        cmocka_unit_test(test_load_back_no_room), cmocka_unit_test(test_ref_dies_with_device_copy),
        cmocka_unit_test(test_close_busy),        cmocka_unit_test(test_unfinished_pending_load),
        cmocka_unit_test(test_host_sizing),       cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_no_host),           cmocka_unit_test(test_random_page1),
        cmocka_unit_test(test_random_page4),      cmocka_unit_test(test_disk_restart),
        cmocka_unit_test(test_disk_bad_options),  cmocka_unit_test(test_poll_budget),
        cmocka_unit_test(test_disk_corruption),   cmocka_unit_test(test_disk_prefetch_and_on_evict),
        cmocka_unit_test(test_random_disk),
    };
    /* On a GPU these cannot hold: they time their checks by the sim-only delay seams of
     * xfer_config, or watch a load still in flight that a GPU has long finished. */
    static const char *const sim_only[] = {"test_layer_wait", "test_match_pending_load",
                                           "test_pressure_waits_for_load", "test_close_busy",
                                           "test_unfinished_pending_load"};
    const size_t n_tests = sizeof(tests) / sizeof(tests[0]);
    struct CMUnitTest on_gpu[sizeof(tests) / sizeof(tests[0])];
    size_t n_gpu = 0;

    if (TEST_BACKEND != KVT_BACKEND_CUDA)
        return cmocka_run_group_tests(tests, NULL, NULL);
#ifdef KVT_HAVE_CUDA
    if (dev_cuda_device_count() == 0)
        return T_EXIT_SKIP;
#else
    return T_EXIT_SKIP;
#endif
    for (size_t i = 0; i < n_tests; i++) {
        int keep = 1;

        for (size_t j = 0; j < sizeof(sim_only) / sizeof(sim_only[0]); j++)
            keep = keep && strcmp(tests[i].name, sim_only[j]) != 0;
        if (keep)
            on_gpu[n_gpu++] = tests[i];
    }
    return _cmocka_run_group_tests("hicache_cuda", on_gpu, n_gpu, NULL, NULL);
}
