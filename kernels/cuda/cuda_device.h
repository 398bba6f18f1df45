/*
 * CUDA device discovery and a self-test, behind a plain C ABI.
 *
 * This is how the rest of fusebox learns whether a CUDA device is usable
 * without including any CUDA header: a worker counts devices and reads their
 * properties before it registers with the server, and tests and scripts run
 * the self-test to prove that the driver, the runtime, cuBLAS, cuDNN and NCCL
 * all load and compute correctly on a device.  Every function is safe to call
 * on a machine without a driver or a GPU: it reports zero devices or an error
 * code, never aborts.  Error codes are the negative fb_err values of
 * base/errors.h.
 */
#ifndef FB_KERNELS_CUDA_DEVICE_H
#define FB_KERNELS_CUDA_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FB_CUDA_NAME_MAX 256

/* What fusebox needs to know about one device to place work on it. */
struct fb_cuda_device_info {
    int device;                  /* ordinal as the CUDA runtime numbers it */
    char name[FB_CUDA_NAME_MAX]; /* e.g. "NVIDIA H200", NUL-terminated */
    uint64_t total_bytes;        /* global memory */
    uint64_t free_bytes;         /* free global memory when queried */
    int cc_major, cc_minor;      /* compute capability */
    int sm_count;                /* streaming multiprocessors */
};

/*
 * Number of CUDA devices this process can use.  Returns 0 when there is no
 * driver, no device, or the runtime fails to initialise; the runtime's sticky
 * error state is cleared so later CUDA calls are not poisoned by the probe.
 */
int fb_cuda_device_count(void);

/*
 * Fills *out with the properties of device `device` (0-based).  Queries free
 * memory, which creates the device's primary context.  The calling thread's
 * current device is restored afterwards.  Returns FB_OK; FB_ERR_NOT_FOUND
 * when no such device exists; FB_ERR_UNSUPPORTED when no usable driver is
 * present; FB_ERR_IO when a runtime call fails.  On failure msg (capacity cap,
 * NUL-terminated when cap > 0) says why and *out is left untouched.
 */
int fb_cuda_device_info(int device, struct fb_cuda_device_info *out, char *msg, size_t msg_cap);

/*
 * Proves that device `device` computes correctly: runs a saxpy kernel of our
 * own, one cuBLAS SGEMM on a small odd-shaped matrix, creates and destroys a
 * cuDNN handle, reads the NCCL version, and compares the numeric results with
 * the host.  Returns FB_OK and writes a one-line summary into msg; on failure
 * returns FB_ERR_NOT_FOUND (no such device), FB_ERR_UNSUPPORTED (no driver),
 * FB_ERR_NOMEM (device allocation failed), FB_ERR_IO (a library call failed)
 * or FB_ERR_INTERNAL (a result differs from the host), with the reason in msg.
 * Frees everything it allocated on every path.
 */
int fb_cuda_selftest(int device, char *msg, size_t msg_cap);

#ifdef __cplusplus
}
#endif

#endif
