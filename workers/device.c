/*
 * Device discovery.  CUDA devices win when there are any: a worker with GPUs
 * offers them and not its CPU, since a group placed on the CPU of a GPU
 * machine would only slow down the groups on its GPUs.  A CPU device may own
 * cores: the threads that compute for it are pinned to them, so that what
 * runs on one device does not take the cores of another.
 */
#define _GNU_SOURCE
#include "device.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "errors.h"

#ifdef FB_HAVE_CUDA
#include "cuda/cuda_device.h"
#endif

int fb_devices_discover(int cpu_devices, uint64_t host_memory_bytes, fb_device *out, int cap,
                        char *msg, size_t msg_cap)
{
    if (!out || cap < 1)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "no room for devices");
#ifdef FB_HAVE_CUDA
    int n_gpu = fb_cuda_device_count();
    if (n_gpu > cap) n_gpu = cap;
    int found = 0;
    for (int i = 0; i < n_gpu; i++) {
        struct fb_cuda_device_info info;
        char m[128];
        fb_backend *be = fb_backend_cuda(i);
        if (!be || fb_cuda_device_info(i, &info, m, sizeof m) != FB_OK) continue;
        found++;
    }
    if (found > 0) {
        int k = 0;
        for (int i = 0; i < n_gpu; i++) {
            struct fb_cuda_device_info info;
            char m[128];
            fb_backend *be = fb_backend_cuda(i);
            if (!be || fb_cuda_device_info(i, &info, m, sizeof m) != FB_OK) continue;
            fb_device *d = &out[k++];
            memset(d, 0, sizeof *d);
            d->kind = FB_DEVICE_CUDA;
            d->ordinal = i;
            snprintf(d->name, sizeof d->name, "%s", info.name);
            d->memory_bytes = info.total_bytes;
            d->be = be;
        }
        return k;
    }
#endif
    if (cpu_devices < 1 || cpu_devices > cap)
        return fb_errf(msg, msg_cap, FB_ERR_OUT_OF_RANGE, "cpu devices must be 1..%d, not %d",
                       cap, cpu_devices);
    fb_devices_cpu(cpu_devices, host_memory_bytes, fb_backend_cpu(), out);
    return cpu_devices;
}

void fb_devices_cpu(int n, uint64_t host_memory_bytes, fb_backend *be, fb_device *out)
{
    for (int i = 0; i < n; i++) {
        fb_device *d = &out[i];
        memset(d, 0, sizeof *d);
        d->kind = FB_DEVICE_CPU;
        d->ordinal = i;
        snprintf(d->name, sizeof d->name, "cpu%d", i);
        uint64_t share = host_memory_bytes / (uint64_t)n;
        d->memory_bytes = share > 0 ? share : 1;
        d->be = be;
    }
}

int fb_device_pin_thread(const fb_device *d, char *msg, size_t msg_cap)
{
    if (!d || d->kind != FB_DEVICE_CPU || d->cpu_count < 1) return FB_OK;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1) cores = 1;
    if (cores > CPU_SETSIZE) cores = CPU_SETSIZE;
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < d->cpu_count && i < cores; i++)
        CPU_SET((int)(((long)d->cpu_first + i) % cores), &set);
    int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    if (rc != 0)
        return fb_errf(msg, msg_cap, FB_ERR_IO, "cannot pin a thread of %s to cores %d..%d: %s",
                       d->name, d->cpu_first, d->cpu_first + d->cpu_count - 1, strerror(rc));
    return FB_OK;
}
