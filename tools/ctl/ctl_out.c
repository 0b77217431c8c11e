/* kvtier-ctl's output helpers (ctl.h): errors, hex, times and sizes, for every command. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "ctl.h"

int ctl_fail(const char *fmt, ...)
{
    va_list ap;

    fputs(PROG ": ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

void ctl_hex(const uint8_t *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}

void ctl_json_hex(const uint8_t *b, size_t n)
{
    char buf[2 * 256 + 1];

    ctl_hex(b, n < 256 ? n : 256, buf);
    printf("\"%s\"", buf);
}

const char *ctl_time(uint64_t ns, char *buf)
{
    time_t t = (time_t)(ns / 1000000000u);
    struct tm tm;

    if (!ns || !gmtime_r(&t, &tm))
        return strcpy(buf, "-");
    strftime(buf, 32, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return buf;
}

const char *ctl_bytes(uint64_t n, char *buf)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = (double)n;
    int u = 0;

    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, 32, "%llu B", (unsigned long long)n);
    else
        snprintf(buf, 32, "%.1f %s", v, units[u]);
    return buf;
}
