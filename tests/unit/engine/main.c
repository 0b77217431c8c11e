#include "engine_test.h"

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_backend_choice),
        cmocka_unit_test(test_strerror),
        cmocka_unit_test(test_fingerprint),
        cmocka_unit_test(test_insert_ownership),
        cmocka_unit_test(test_finished),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_unfinished),
        cmocka_unit_test(test_request_errors),
        cmocka_unit_test(test_bad_calls),
        cmocka_unit_test(test_kv_data),
        cmocka_unit_test(test_release_empty),
        cmocka_unit_test(test_stats_socket),
        cmocka_unit_test(test_alloc_enomem_keeps_cache),
        cmocka_unit_test(test_alloc_extend_evicts_own_prefix),
        cmocka_unit_test(test_finished_frees_row),
        cmocka_unit_test(test_stale_request),
        cmocka_unit_test(test_older_caller),
        cmocka_unit_test(test_remote_url),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_newer_caller),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
