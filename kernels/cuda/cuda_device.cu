/*
 * CUDA device discovery and self-test (see cuda_device.h).
 *
 * Compiled as C++ by nvcc; everything public is extern "C".  No function here
 * aborts: a missing driver or device is an ordinary answer on most machines
 * fusebox runs on, so every runtime error is turned into an fb_err code and a
 * message, and the runtime's last-error state is cleared after it.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "errors.h"
}
#include "cuda_device.h"

/* Formats msg (NUL-terminated when cap > 0) and returns err.  Local instead
 * of fb_errf so that kernels/ does not link against fb_api. */
static int dev_errf(char *msg, size_t msg_cap, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int dev_errf(char *msg, size_t msg_cap, int err, const char *fmt, ...)
{
    if (msg && msg_cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_cap, fmt, ap);
        va_end(ap);
    }
    return err;
}

/* Which fb_err a runtime error is.  Driver problems mean CUDA is not usable
 * on this machine at all; a missing ordinal means the device does not exist. */
static int dev_err_from_cuda(cudaError_t e)
{
    switch (e) {
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
        return FB_ERR_NOT_FOUND;
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorInitializationError:
        return FB_ERR_UNSUPPORTED;
    case cudaErrorMemoryAllocation:
        return FB_ERR_NOMEM;
    default:
        return FB_ERR_IO;
    }
}

/* Reports a failed runtime call and clears the runtime's last error. */
static int dev_fail_cuda(char *msg, size_t msg_cap, cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return dev_errf(msg, msg_cap, dev_err_from_cuda(e), "CUDA: %s failed: %s (%s)", what,
                    cudaGetErrorName(e), cudaGetErrorString(e));
}

/* FB_OK when `device` names an existing device, else the reason. */
static int dev_check_ordinal(int device, char *msg, size_t msg_cap)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorNoDevice) {
        (void)cudaGetLastError();
        return dev_errf(msg, msg_cap, FB_ERR_NOT_FOUND, "CUDA: no device");
    }
    if (e != cudaSuccess) return dev_fail_cuda(msg, msg_cap, e, "cudaGetDeviceCount");
    if (device < 0 || device >= n)
        return dev_errf(msg, msg_cap, FB_ERR_NOT_FOUND,
                        "CUDA: device %d does not exist (%d present)", device, n);
    return FB_OK;
}

extern "C" int fb_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n > 0 ? n : 0;
}

extern "C" int fb_cuda_device_info(int device, struct fb_cuda_device_info *out, char *msg,
                                   size_t msg_cap)
{
    struct fb_cuda_device_info info;
    cudaDeviceProp prop;
    size_t free_b = 0, total_b = 0;
    int prev = -1;
    cudaError_t e;
    int rc;

    if (!out) return dev_errf(msg, msg_cap, FB_ERR_INTERNAL, "fb_cuda_device_info: out is NULL");
    rc = dev_check_ordinal(device, msg, msg_cap);
    if (rc != FB_OK) return rc;
    if (cudaGetDevice(&prev) != cudaSuccess) {
        (void)cudaGetLastError();
        prev = -1;
    }

    memset(&info, 0, sizeof info);
    e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) return dev_fail_cuda(msg, msg_cap, e, "cudaGetDeviceProperties");
    e = cudaSetDevice(device);
    if (e != cudaSuccess) return dev_fail_cuda(msg, msg_cap, e, "cudaSetDevice");
    e = cudaMemGetInfo(&free_b, &total_b);
    if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
    if (e != cudaSuccess) return dev_fail_cuda(msg, msg_cap, e, "cudaMemGetInfo");

    info.device = device;
    snprintf(info.name, sizeof info.name, "%s", prop.name);
    info.total_bytes = (uint64_t)prop.totalGlobalMem;
    info.free_bytes = (uint64_t)free_b;
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.sm_count = prop.multiProcessorCount;
    *out = info;
    return FB_OK;
}

/* y[i] = a * x[i] + y[i] for i < n; x, y: [n].  Grid-stride, so any grid size
 * covers any n. */
__global__ static void fb_selftest_saxpy(int n, float a, const float *x, float *y)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x)
        y[i] = a * x[i] + y[i];
}

/* Relative difference with a floor of 1 on the scale. */
static double rel_diff(double got, double want)
{
    double s = fabs(want) > 1.0 ? fabs(want) : 1.0;
    return fabs(got - want) / s;
}

#define SAXPY_N ((1 << 20) + 3) /* odd, so the last block is partial */
#define GEMM_M 37
#define GEMM_N 29
#define GEMM_K 53

#define TRY_CUDA(call, what)                                                                       \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            rc = dev_fail_cuda(msg, msg_cap, e_, what);                                            \
            goto fail;                                                                             \
        }                                                                                          \
    } while (0)

/* Our own kernel: y = a x + y over SAXPY_N floats, checked against the host.
 * Values are small multiples of a power of two, so the result is exact.
 * Sets *err to the largest relative difference seen. */
static int selftest_saxpy(char *msg, size_t msg_cap, double *err)
{
    const size_t n = SAXPY_N;
    const float a = 1.5f;
    float *hx = NULL, *hy = NULL, *hr = NULL, *dx = NULL, *dy = NULL;
    int blocks, rc = FB_OK;

    *err = 0.0;
    hx = (float *)malloc(n * sizeof *hx);
    hy = (float *)malloc(n * sizeof *hy);
    hr = (float *)malloc(n * sizeof *hr);
    if (!hx || !hy || !hr) {
        rc = dev_errf(msg, msg_cap, FB_ERR_NOMEM, "self-test: host allocation failed");
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        hx[i] = 0.25f * (float)((int)(i % 17) - 8);
        hy[i] = 0.5f * (float)(i % 5);
    }
    TRY_CUDA(cudaMalloc((void **)&dx, n * sizeof *dx), "cudaMalloc");
    TRY_CUDA(cudaMalloc((void **)&dy, n * sizeof *dy), "cudaMalloc");
    TRY_CUDA(cudaMemcpy(dx, hx, n * sizeof *hx, cudaMemcpyHostToDevice), "cudaMemcpy");
    TRY_CUDA(cudaMemcpy(dy, hy, n * sizeof *hy, cudaMemcpyHostToDevice), "cudaMemcpy");
    blocks = (int)((n + 255) / 256);
    if (blocks > 4096) blocks = 4096;
    fb_selftest_saxpy<<<blocks, 256>>>((int)n, a, dx, dy);
    TRY_CUDA(cudaGetLastError(), "saxpy launch");
    TRY_CUDA(cudaDeviceSynchronize(), "saxpy");
    TRY_CUDA(cudaMemcpy(hr, dy, n * sizeof *hr, cudaMemcpyDeviceToHost), "cudaMemcpy");
    for (size_t i = 0; i < n; i++) {
        double want = (double)a * hx[i] + hy[i];
        double d = rel_diff(hr[i], want);
        if (d > *err) *err = d;
        if (d > 1e-6) {
            rc = dev_errf(msg, msg_cap, FB_ERR_INTERNAL,
                          "self-test: saxpy y[%zu] = %.9g on the device, %.9g on the host", i,
                          (double)hr[i], want);
            goto fail;
        }
    }
fail:
    cudaFree(dy);
    cudaFree(dx);
    free(hr);
    free(hy);
    free(hx);
    return rc;
}

/* cuBLAS: C = alpha A B + beta C with A [M,K], B [K,N], C [M,N], all
 * column-major as cuBLAS expects.  Small integers, so every product and sum
 * is exact in fp32 and in TF32 and the GPU must match the host.  Sets *err to
 * the largest relative difference seen. */
static int selftest_sgemm(char *msg, size_t msg_cap, double *err)
{
    const int m = GEMM_M, n = GEMM_N, k = GEMM_K;
    const float alpha = 1.0f, beta = 0.5f;
    float *ha = NULL, *hb = NULL, *hc = NULL, *hcr = NULL, *da = NULL, *db = NULL, *dc = NULL;
    cublasHandle_t blas = NULL;
    cublasStatus_t bs;
    int rc = FB_OK;

    *err = 0.0;
    ha = (float *)malloc((size_t)m * k * sizeof *ha);
    hb = (float *)malloc((size_t)k * n * sizeof *hb);
    hc = (float *)malloc((size_t)m * n * sizeof *hc);
    hcr = (float *)malloc((size_t)m * n * sizeof *hcr);
    if (!ha || !hb || !hc || !hcr) {
        rc = dev_errf(msg, msg_cap, FB_ERR_NOMEM, "self-test: host allocation failed");
        goto fail;
    }
    for (int i = 0; i < m * k; i++)
        ha[i] = (float)((i * 7) % 9 - 4);
    for (int i = 0; i < k * n; i++)
        hb[i] = (float)((i * 5) % 7 - 3);
    for (int i = 0; i < m * n; i++)
        hc[i] = (float)(i % 3 - 1);
    TRY_CUDA(cudaMalloc((void **)&da, (size_t)m * k * sizeof *da), "cudaMalloc");
    TRY_CUDA(cudaMalloc((void **)&db, (size_t)k * n * sizeof *db), "cudaMalloc");
    TRY_CUDA(cudaMalloc((void **)&dc, (size_t)m * n * sizeof *dc), "cudaMalloc");
    TRY_CUDA(cudaMemcpy(da, ha, (size_t)m * k * sizeof *ha, cudaMemcpyHostToDevice), "cudaMemcpy");
    TRY_CUDA(cudaMemcpy(db, hb, (size_t)k * n * sizeof *hb, cudaMemcpyHostToDevice), "cudaMemcpy");
    TRY_CUDA(cudaMemcpy(dc, hc, (size_t)m * n * sizeof *hc, cudaMemcpyHostToDevice), "cudaMemcpy");
    bs = cublasCreate(&blas);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        blas = NULL;
        rc = dev_errf(msg, msg_cap, bs == CUBLAS_STATUS_ALLOC_FAILED ? FB_ERR_NOMEM : FB_ERR_IO,
                      "cuBLAS: cublasCreate failed: %s", cublasGetStatusString(bs));
        goto fail;
    }
    bs = cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &alpha, da, m, db, k, &beta, dc, m);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        rc = dev_errf(msg, msg_cap, FB_ERR_IO, "cuBLAS: cublasSgemm failed: %s",
                      cublasGetStatusString(bs));
        goto fail;
    }
    TRY_CUDA(cudaDeviceSynchronize(), "sgemm");
    TRY_CUDA(cudaMemcpy(hcr, dc, (size_t)m * n * sizeof *hcr, cudaMemcpyDeviceToHost),
             "cudaMemcpy");
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < m; i++) {
            double want = (double)beta * hc[i + j * m];
            for (int p = 0; p < k; p++)
                want += (double)alpha * ha[i + p * m] * hb[p + j * k];
            double d = rel_diff(hcr[i + j * m], want);
            if (d > *err) *err = d;
            if (d > 1e-5) {
                rc = dev_errf(msg, msg_cap, FB_ERR_INTERNAL,
                              "self-test: sgemm C[%d,%d] = %.9g on the device, %.9g on the host", i,
                              j, (double)hcr[i + j * m], want);
                goto fail;
            }
        }
    }
fail:
    if (blas) cublasDestroy(blas);
    cudaFree(dc);
    cudaFree(db);
    cudaFree(da);
    free(hcr);
    free(hc);
    free(hb);
    free(ha);
    return rc;
}

/* cuDNN and NCCL: the libraries load and answer with their versions. */
static int selftest_libraries(char *msg, size_t msg_cap, size_t *cudnn_version, int *nccl_version)
{
    cudnnHandle_t dnn = NULL;
    cudnnStatus_t ds = cudnnCreate(&dnn);
    if (ds != CUDNN_STATUS_SUCCESS)
        return dev_errf(msg, msg_cap, FB_ERR_IO, "cuDNN: cudnnCreate failed: %s",
                        cudnnGetErrorString(ds));
    *cudnn_version = cudnnGetVersion();
    cudnnDestroy(dnn);
    ncclResult_t ns = ncclGetVersion(nccl_version);
    if (ns != ncclSuccess)
        return dev_errf(msg, msg_cap, FB_ERR_IO, "NCCL: ncclGetVersion failed: %s",
                        ncclGetErrorString(ns));
    return FB_OK;
}

extern "C" int fb_cuda_selftest(int device, char *msg, size_t msg_cap)
{
    cudaDeviceProp prop;
    double err_saxpy = 0.0, err_gemm = 0.0;
    int nccl_version = 0;
    size_t cudnn_version = 0;
    int prev = -1, rc;

    rc = dev_check_ordinal(device, msg, msg_cap);
    if (rc != FB_OK) return rc;
    if (cudaGetDevice(&prev) != cudaSuccess) {
        (void)cudaGetLastError();
        prev = -1;
    }
    TRY_CUDA(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    TRY_CUDA(cudaSetDevice(device), "cudaSetDevice");
    rc = selftest_saxpy(msg, msg_cap, &err_saxpy);
    if (rc == FB_OK) rc = selftest_sgemm(msg, msg_cap, &err_gemm);
    if (rc == FB_OK) rc = selftest_libraries(msg, msg_cap, &cudnn_version, &nccl_version);
    if (rc == FB_OK)
        rc = dev_errf(msg, msg_cap, FB_OK,
                      "device %d %s (cc %d.%d, %d SMs): saxpy n=%zu max rel err %.3g, sgemm "
                      "%dx%dx%d max rel err %.3g, cuDNN %zu, NCCL %d",
                      device, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
                      (size_t)SAXPY_N, err_saxpy, GEMM_M, GEMM_N, GEMM_K, err_gemm, cudnn_version,
                      nccl_version);
fail:
    (void)cudaGetLastError();
    if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
    return rc;
}
