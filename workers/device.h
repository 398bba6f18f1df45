/*
 * The devices a worker trains on: CPU devices (each a thread with its own
 * workspace, running the fast CPU backend) and CUDA devices (one backend per
 * GPU, in CUDA builds where a GPU is present).  A group's fused array runs
 * on parallel.data x parallel.pipeline of them; each device carries the
 * backend its ops run on, so a worker chooses the backend per device.
 */
#ifndef FB_WORKERS_DEVICE_H
#define FB_WORKERS_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

typedef enum fb_device_kind { FB_DEVICE_CPU, FB_DEVICE_CUDA } fb_device_kind;

#define FB_DEVICE_NAME_MAX 64

typedef struct fb_device {
    fb_device_kind kind;
    int ordinal;             /* CUDA: the runtime's device number; CPU: 0.. */
    char name[FB_DEVICE_NAME_MAX];
    uint64_t memory_bytes;   /* what the device offers */
    fb_backend *be;        /* the backend its ops run on */
    /* CPU: the cores the threads that compute for it run on, cpu_first.. (modulo the
     * machine's cores), cpu_count of them; cpu_count 0 = wherever the kernel puts them */
    int cpu_first, cpu_count;
} fb_device;

/*
 * Lists the devices this process can train on into out[0..cap): every CUDA
 * device when the build has CUDA and fb_cuda_device_count() > 0 and
 * fb_backend_cuda() gives a backend for it, otherwise cpu_devices (1..cap)
 * CPU devices sharing host_memory_bytes evenly.  Returns the count (>= 1) or
 * a negative fb_err (FB_ERR_OUT_OF_RANGE for a bad cpu_devices or cap) with
 * msg filled; out is untouched on failure.
 */
int fb_devices_discover(int cpu_devices, uint64_t host_memory_bytes, fb_device *out, int cap,
                        char *msg, size_t msg_cap);

/* Fills out[0..n) with n CPU devices cpu0.. that share host_memory_bytes
 * evenly and compute on be, wherever the kernel puts their threads. */
void fb_devices_cpu(int n, uint64_t host_memory_bytes, fb_backend *be, fb_device *out);

/*
 * Pins the calling thread to d's cores (a CPU device with cpu_count > 0); a
 * thread it then starts (an OpenMP team) inherits them.  Does nothing for
 * other devices.  Returns FB_OK, or FB_ERR_IO when the kernel refuses.
 */
int fb_device_pin_thread(const fb_device *d, char *msg, size_t msg_cap);

#endif
