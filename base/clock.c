/* The process clock: monotonic, or manual for tests (clock.h). */
#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define POLL_MS 2 /* the real sleep between readings of a manual clock */

enum { CLOCK_MONO, CLOCK_MEMORY, CLOCK_FILE };

static int mode = CLOCK_MONO;
static int64_t memory_ns;           /* CLOCK_MEMORY's time, read and written atomically */
static const int64_t *file_ns;      /* CLOCK_FILE's mapped time */

struct fb_clock_file {
    int64_t *ns;
};

static int64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t fb_clock_ns(void)
{
    switch (__atomic_load_n(&mode, __ATOMIC_ACQUIRE)) {
    case CLOCK_MEMORY: return __atomic_load_n(&memory_ns, __ATOMIC_ACQUIRE);
    case CLOCK_FILE: return __atomic_load_n(file_ns, __ATOMIC_ACQUIRE);
    default: return mono_ns();
    }
}

int64_t fb_clock_ms(void) { return fb_clock_ns() / 1000000; }

double fb_clock_s(void) { return (double)fb_clock_ns() * 1e-9; }

bool fb_clock_is_manual(void) { return __atomic_load_n(&mode, __ATOMIC_ACQUIRE) != CLOCK_MONO; }

int fb_clock_wait_ms(int64_t deadline_ms, int cap_ms)
{
    if (cap_ms < 0) cap_ms = 0;
    int64_t left = deadline_ms - fb_clock_ms();
    if (left <= 0) return 0;
    if (fb_clock_is_manual()) return cap_ms < POLL_MS ? cap_ms : POLL_MS;
    return left < cap_ms ? (int)left : cap_ms;
}

void fb_clock_manual(int64_t start_ns)
{
    __atomic_store_n(&memory_ns, start_ns, __ATOMIC_RELEASE);
    __atomic_store_n(&mode, CLOCK_MEMORY, __ATOMIC_RELEASE);
}

bool fb_clock_set(int64_t ns)
{
    int64_t cur = __atomic_load_n(&memory_ns, __ATOMIC_ACQUIRE);
    if (ns < cur) return false;
    __atomic_store_n(&memory_ns, ns, __ATOMIC_RELEASE);
    return true;
}

void fb_clock_advance(int64_t ns)
{
    if (ns > 0) __atomic_add_fetch(&memory_ns, ns, __ATOMIC_ACQ_REL);
}

/* Maps the 8 bytes of the clock file at path, for reading or writing. */
static int64_t *map_file(const char *path, bool create, int64_t start_ns, char *msg, size_t msg_cap)
{
    if (!path || !path[0]) {
        snprintf(msg, msg_cap, "clock file: no path given");
        return NULL;
    }
    int fd = open(path, create ? O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC : O_RDONLY | O_CLOEXEC,
                  0600);
    if (fd < 0) {
        snprintf(msg, msg_cap, "clock file %s: %s", path, strerror(errno));
        return NULL;
    }
    if (create) {
        unsigned char b[8];
        for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)start_ns >> (8 * i));
        if (write(fd, b, sizeof b) != (ssize_t)sizeof b) {
            snprintf(msg, msg_cap, "clock file %s: cannot write: %s", path, strerror(errno));
            close(fd);
            return NULL;
        }
    } else {
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != 8) {
            snprintf(msg, msg_cap, "clock file %s: not a regular file of 8 bytes", path);
            close(fd);
            return NULL;
        }
    }
    void *p = mmap(NULL, 8, create ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        snprintf(msg, msg_cap, "clock file %s: cannot map: %s", path, strerror(errno));
        return NULL;
    }
    return p;
}

int fb_clock_use_file(const char *path, char *msg, size_t msg_cap)
{
    const int64_t *p = map_file(path, false, 0, msg, msg_cap);
    if (!p) return -1;
    if (__atomic_load_n(p, __ATOMIC_ACQUIRE) < 0) {
        snprintf(msg, msg_cap, "clock file %s: holds a negative time", path);
        munmap((void *)p, 8);
        return -1;
    }
    file_ns = p;
    __atomic_store_n(&mode, CLOCK_FILE, __ATOMIC_RELEASE);
    return 0;
}

fb_clock_file *fb_clock_file_create(const char *path, int64_t start_ns, char *msg, size_t msg_cap)
{
    if (start_ns < 0) {
        snprintf(msg, msg_cap, "clock file %s: start time %lld is negative", path ? path : "",
                 (long long)start_ns);
        return NULL;
    }
    int64_t *p = map_file(path, true, start_ns, msg, msg_cap);
    if (!p) return NULL;
    fb_clock_file *f = malloc(sizeof *f);
    if (!f) {
        munmap(p, 8);
        snprintf(msg, msg_cap, "clock file %s: out of memory", path);
        return NULL;
    }
    f->ns = p;
    return f;
}

bool fb_clock_file_set(fb_clock_file *f, int64_t ns)
{
    if (ns < __atomic_load_n(f->ns, __ATOMIC_ACQUIRE)) return false;
    __atomic_store_n(f->ns, ns, __ATOMIC_RELEASE);
    return true;
}

void fb_clock_file_advance(fb_clock_file *f, int64_t ns)
{
    if (ns > 0) __atomic_add_fetch(f->ns, ns, __ATOMIC_ACQ_REL);
}

int64_t fb_clock_file_get(const fb_clock_file *f) { return __atomic_load_n(f->ns, __ATOMIC_ACQUIRE); }

void fb_clock_file_close(fb_clock_file *f)
{
    if (!f) return;
    munmap(f->ns, 8);
    free(f);
}
