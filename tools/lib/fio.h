/* Running fio beside a benchmark: finding it, spawning it, and reading the one figure wanted
 * out of its JSON report (a minimal walk, not a JSON library). */
#ifndef KVT_TOOLS_FIO_H
#define KVT_TOOLS_FIO_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* name as given when it holds a slash, else the first executable of that name on PATH, into
 * out; false when there is none. */
bool fio_find_program(const char *name, char *out, size_t len);

/* Run argv (argv[0] a path) with stdin from /dev/null and stdout and stderr into the file log;
 * its exit status, 128 + the signal that ended it, or -errno when it could not run. */
int fio_spawn_wait(char *const argv[], const char *log);

/* Run "<path> --version" with its output into log, and its first line into out: 0, or what
 * fio_spawn_wait returned when that was not 0. */
int fio_version(const char *path, const char *log, char *out, size_t len);

/* One io_uring job on one file, as a disk benchmark compares itself with. */
struct fio_params {
    const char *fio;  /* the program, a path */
    const char *name; /* the job's */
    const char *file; /* the file it reads and writes */
    const char *rw;   /* write, read or randread */
    bool direct, fixed_buffers;
    bool huge_buffers; /* its buffers on huge pages (hugetlb: --iomem=shmhuge) */
    uint32_t block_bytes, iodepth;
    uint64_t size;      /* bytes of the file */
    uint64_t io_size;   /* bytes the job moves, 0: size (--io_size) */
    uint64_t fdatasync; /* writes between syncs, 0 for none; when not 0, one more at the end */
    const char *json;   /* where its JSON report goes */
};

/* A job's command line; the strings live in the struct. */
struct fio_job {
    char args[16][PATH_MAX + 32];
    char *argv[20];
};

/* The command line of p's job into j: "fio --name=... --output-format=json". */
void fio_job_init(struct fio_job *j, const struct fio_params *p);

/* A whole small file, NUL-terminated, for the caller to free; NULL when unreadable. */
char *fio_slurp(const char *path);

/* The first line of a file (or "(no output)") into out, for a note. */
void fio_first_line(const char *path, char *out, size_t len);

/* From fio's JSON report at path: the first job's bytes and bandwidth (bytes a second) in
 * direction dir ("read" or "write"). 0, or -1 when the report is unreadable, the job reports
 * an error, or either figure is missing (or the bandwidth is not positive). */
int fio_read_report(const char *path, const char *dir, double *io_bytes, double *bw_bytes);

#endif
