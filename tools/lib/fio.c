#include "fio.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_JSON_DEPTH 64

extern char **environ;

int fio_spawn_wait(char *const argv[], const char *log)
{
    posix_spawn_file_actions_t fa;
    pid_t pid;
    int st, rc;

    if (posix_spawn_file_actions_init(&fa))
        return -ENOMEM;
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
    rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc)
        return -rc;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -errno;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

char *fio_slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long len;

    if (!f)
        return NULL;
    if (!fseek(f, 0, SEEK_END) && (len = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
        (buf = malloc((size_t)len + 1))) {
        size_t got = fread(buf, 1, (size_t)len, f);

        buf[got] = '\0';
    }
    fclose(f);
    return buf;
}

void fio_first_line(const char *path, char *out, size_t len)
{
    char *text = fio_slurp(path);

    snprintf(out, len, "%s", text ? text : "(no output)");
    out[strcspn(out, "\n")] = '\0';
    free(text);
}

bool fio_find_program(const char *name, char *out, size_t len)
{
    const char *path = getenv("PATH");

    if (strchr(name, '/')) {
        snprintf(out, len, "%s", name);
        return access(out, X_OK) == 0;
    }
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");

        snprintf(out, len, "%.*s/%s", (int)n, n ? p : ".", name);
        if (access(out, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    return false;
}

int fio_version(const char *path, const char *log, char *out, size_t len)
{
    char *argv[] = {(char *)path, "--version", NULL};
    int rc = fio_spawn_wait(argv, log);

    if (rc == 0)
        fio_first_line(log, out, len);
    return rc;
}

void fio_job_init(struct fio_job *j, const struct fio_params *p)
{
    const size_t len = sizeof(j->args[0]);
    int n = 0;

    snprintf(j->args[n++], len, "--name=%s", p->name);
    snprintf(j->args[n++], len, "--filename=%s", p->file);
    snprintf(j->args[n++], len, "--ioengine=io_uring");
    snprintf(j->args[n++], len, "--direct=%u", (unsigned)p->direct);
    snprintf(j->args[n++], len, "--fixedbufs=%u", (unsigned)p->fixed_buffers);
    if (p->huge_buffers)
        snprintf(j->args[n++], len, "--iomem=shmhuge");
    snprintf(j->args[n++], len, "--fallocate=native");
    snprintf(j->args[n++], len, "--bs=%u", p->block_bytes);
    snprintf(j->args[n++], len, "--iodepth=%u", p->iodepth);
    snprintf(j->args[n++], len, "--rw=%s", p->rw);
    snprintf(j->args[n++], len, "--size=%" PRIu64, p->size);
    if (p->io_size)
        snprintf(j->args[n++], len, "--io_size=%" PRIu64, p->io_size);
    snprintf(j->args[n++], len, "--fdatasync=%" PRIu64, p->fdatasync);
    if (p->fdatasync)
        snprintf(j->args[n++], len, "--end_fsync=1");
    snprintf(j->args[n++], len, "--output=%s", p->json);
    j->argv[0] = (char *)p->fio;
    for (int i = 0; i < n; i++)
        j->argv[i + 1] = j->args[i];
    j->argv[n + 1] = "--output-format=json";
    j->argv[n + 2] = NULL;
}

/* ---- a small JSON reader: just enough to walk fio's report ---- */

static const char *ws(const char *p)
{
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
        p++;
    return p;
}

/* p at a quote: past the closing one, or NULL. */
static const char *skip_string(const char *p)
{
    for (p++; *p && *p != '"'; p++)
        if (*p == '\\' && p[1])
            p++;
    return *p ? p + 1 : NULL;
}

static const char *skip_value(const char *p, int depth);

/* One "key": value of an object, p at the key; past the value, or NULL. */
static const char *skip_member(const char *p, int depth)
{
    if (*p != '"' || !(p = skip_string(p)))
        return NULL;
    p = ws(p);
    return *p == ':' ? skip_value(ws(p + 1), depth) : NULL;
}

static const char *skip_container(const char *p, int depth)
{
    char close = *p == '{' ? '}' : ']';

    p = ws(p + 1);
    if (*p == close)
        return p + 1;
    for (;;) {
        p = close == '}' ? skip_member(p, depth + 1) : skip_value(p, depth + 1);
        if (!p)
            return NULL;
        p = ws(p);
        if (*p != ',')
            return *p == close ? p + 1 : NULL;
        p = ws(p + 1);
    }
}

static const char *skip_value(const char *p, int depth)
{
    const char *start = p;

    if (depth > MAX_JSON_DEPTH)
        return NULL;
    if (*p == '"')
        return skip_string(p);
    if (*p == '{' || *p == '[')
        return skip_container(p, depth);
    while (*p && !strchr(",}] \t\r\n", *p))
        p++;
    return p > start ? p : NULL;
}

/* The value of key in the object at p; NULL when absent or malformed. */
static const char *json_member(const char *p, const char *key)
{
    size_t klen = strlen(key);

    if (!p || *(p = ws(p)) != '{')
        return NULL;
    for (p = ws(p + 1); *p == '"';) {
        const char *k = p + 1, *end = skip_string(p), *val;

        if (!end || *(val = ws(end)) != ':')
            return NULL;
        val = ws(val + 1);
        if ((size_t)(end - 1 - k) == klen && !strncmp(k, key, klen))
            return val;
        if (!(p = skip_value(val, 0)) || *(p = ws(p)) != ',')
            return NULL;
        p = ws(p + 1);
    }
    return NULL;
}

static const char *json_first(const char *p)
{
    if (!p || *(p = ws(p)) != '[' || *(p = ws(p + 1)) == ']')
        return NULL;
    return p;
}

static bool json_number(const char *p, double *out)
{
    char *end;

    if (!p)
        return false;
    *out = strtod(p, &end);
    return end != p;
}

/* From fio's JSON: the job's bytes and bandwidth in direction dir ("read" or "write"). */
static int fio_parse(const char *text, const char *dir, double *io_bytes, double *bw_bytes)
{
    const char *root = text ? strchr(text, '{') : NULL;
    const char *job = json_first(json_member(root, "jobs"));
    const char *d = json_member(job, dir);
    double err = 0;

    if (!json_number(json_member(job, "error"), &err) || err != 0)
        return -1;
    if (!json_number(json_member(d, "io_bytes"), io_bytes) ||
        !json_number(json_member(d, "bw_bytes"), bw_bytes) || *bw_bytes <= 0)
        return -1;
    return 0;
}

int fio_read_report(const char *path, const char *dir, double *io_bytes, double *bw_bytes)
{
    char *text = fio_slurp(path);
    int rc = fio_parse(text, dir, io_bytes, bw_bytes);

    free(text);
    return rc;
}
