#include "disk_engine_test.h"

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checksum_running),
        cmocka_unit_test(test_faults),
        cmocka_unit_test_teardown(test_faults_grouped, store_pages_reset),
        cmocka_unit_test(test_sync_waits_for_drops),
        cmocka_unit_test(test_mem_store),
        cmocka_unit_test(test_chain_store),
        cmocka_unit_test_teardown(test_chain_store_grouped, store_pages_reset),
        cmocka_unit_test(test_store_geometry),
        cmocka_unit_test(test_store_pages),
        cmocka_unit_test(test_store_pages_random),
        cmocka_unit_test_teardown(test_store_pages_mixed, store_pages_reset),
        cmocka_unit_test(test_store_pages_auto_size),
        cmocka_unit_test(test_store_pages_auto_compat),
        cmocka_unit_test(test_crash),
        cmocka_unit_test(test_crash_relaxed),
        cmocka_unit_test_teardown(test_crash_grouped, store_pages_reset),
#ifdef KVT_HAVE_REDIS
        cmocka_unit_test_setup_teardown(test_redis_shared, redis_setup, redis_teardown),
        cmocka_unit_test_setup_teardown(test_redis_faults, redis_setup, redis_teardown),
        cmocka_unit_test_setup_teardown(test_redis_evicting, redis_setup, redis_teardown),
#endif
    };

    if (getenv("KVT_TEST_FILTER"))
        cmocka_set_test_filter(getenv("KVT_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
