#include "backend.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>

#include "kvtier.h"

/* Anonymous mappings: zero pages cost nothing until touched, like a fresh device pool. */
static int sim_alloc(size_t bytes, void **ptr)
{
    void *p =
        mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    if (p == MAP_FAILED)
        return -ENOMEM;
    *ptr = p;
    return 0;
}

static void sim_free(void *ptr, size_t bytes)
{
    if (ptr)
        munmap(ptr, bytes ? bytes : 1);
}

static int sim_copy(void *dst, const void *src, size_t n)
{
    memcpy(dst, src, n);
    return 0;
}

const struct dev_backend dev_backend_sim = {
    .name = "sim",
    .kind = KVT_BACKEND_SIM,
    .alloc = sim_alloc,
    .free = sim_free,
    .to_device = sim_copy,
    .to_host = sim_copy,
};

int dev_backend_select(uint32_t want, const struct dev_backend **out)
{
    switch (want) {
    case KVT_BACKEND_SIM:
        *out = &dev_backend_sim;
        return 0;
    case KVT_BACKEND_CUDA:
    case KVT_BACKEND_AUTO:
#ifdef KVT_HAVE_CUDA
        if (dev_cuda_device_count() > 0) {
            *out = &dev_backend_cuda;
            return 0;
        }
#endif
        if (want == KVT_BACKEND_CUDA)
            return KVT_ENOBACKEND;
        *out = &dev_backend_sim;
        return 0;
    default:
        return -EINVAL;
    }
}
