/*
 * The public API: options, bad input, and the request lifecycle across cache and allocator.
 *
 * One program (meson test `engine`): options.c (options, versions, error strings),
 * requests.c (the request lifecycle, ownership, bad calls), stats_socket.c, over helpers.c;
 * main.c holds the table. This header is theirs alone.
 */
#ifndef KVT_TESTS_UNIT_ENGINE_H
#define KVT_TESTS_UNIT_ENGINE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine_fixture.h"

/* helpers.c */
void base_options(struct kvt_options *o);
kvt_engine *open_engine(void);
void check(const kvt_engine *e);
struct kvt_stats stats(const kvt_engine *e);
void assert_same(const kvt_engine *e, const struct kvt_stats *before);

/* options.c */
void test_options(void **state);
void test_older_caller(void **state);
void test_newer_caller(void **state);
void test_backend_choice(void **state);
void test_strerror(void **state);
void test_version(void **state);
void test_fingerprint(void **state);
void test_remote_url(void **state);

/* requests.c */
void test_insert_ownership(void **state);
void test_finished(void **state);
void test_duplicates(void **state);
void test_unfinished(void **state);
void test_request_errors(void **state);
void test_release_empty(void **state);
void test_bad_calls(void **state);
void test_alloc_enomem_keeps_cache(void **state);
void test_alloc_extend_evicts_own_prefix(void **state);
void test_finished_frees_row(void **state);
void test_stale_request(void **state);
void test_kv_data(void **state);

/* stats_socket.c */
void test_stats_socket(void **state);

#endif
