/*
 * The small engine the unit suites share, and its data dirs. Include after kvtier.h.
 */
#ifndef KVT_TESTS_ENGINE_FIXTURE_H
#define KVT_TESTS_ENGINE_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

/* kvt_options_init, then the test geometry: MHA, `layers` layers of one KV head of `head_dim`
 * 2-byte elements, on the sim backend, 4-token pages, 64 device tokens, 4 requests of 64
 * tokens at most, no host or disk tier. A test sets what it is about after this. */
void fixture_engine_options(struct kvt_options *o, uint32_t layers, uint32_t head_dim);

/* A fresh directory TMPDIR/kvt-<what>-XXXXXX (/tmp without TMPDIR) in dir; 0 or -errno. What
 * fixture_remove_tree has not removed by the time the process exits (a test that failed) is
 * removed then. */
int fixture_data_dir(char *dir, size_t len, const char *what);

/* Bytes of the slot a page of page_bytes with page_tokens tokens takes in a disk tier's slab
 * (docs/formats.md, format 3), so a test can size a disk tier in pages. */
uint64_t fixture_disk_slot(uint64_t page_bytes, uint32_t page_tokens);

/* Flip n bytes (at most 64) of file path at off, as a damaged disk would: 0 or -errno. */
int fixture_flip_bytes(const char *path, uint64_t off, size_t n);

/* Removes dir and everything below it. */
void fixture_remove_tree(const char *dir);

/* A dir fixture_data_dir made stays after the process (to be looked at). */
void fixture_keep_tree(const char *dir);

#endif
