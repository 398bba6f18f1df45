/*
 * Resolving recorded paths inside a directory of the server's (paths.h).
 */
#include "paths.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

bool fb_path_safe_relative(const char *p)
{
    if (!p || !p[0] || p[0] == '/') return false;
    const char *s = p;
    while (*s) {
        const char *e = strchr(s, '/');
        size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
            return false;
        s += n;
        if (*s == '/') s++;
    }
    return true;
}

bool fb_path_beside_exe(const char *rel, char *out, size_t cap)
{
    char exe[PATH_MAX];
    if (cap) out[0] = '\0';
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return false;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return false;
    *slash = '\0';
    int m = snprintf(out, cap, "%s/%s", exe, rel);
    if (m < 0 || (size_t)m >= cap || access(out, F_OK) != 0) {
        if (cap) out[0] = '\0';
        return false;
    }
    return true;
}

int fb_path_open_under(const char *root, const char *rel)
{
    char root_real[PATH_MAX], joined[PATH_MAX], real[PATH_MAX];
    if (!root || !fb_path_safe_relative(rel)) {
        errno = EACCES;
        return -1;
    }
    if (!realpath(root, root_real)) return -1;
    int n = snprintf(joined, sizeof joined, "%s/%s", root_real, rel);
    if (n < 0 || (size_t)n >= sizeof joined) {
        errno = ENAMETOOLONG;
        return -1;
    }
    /* every link resolved: what is left must still lie under root */
    if (!realpath(joined, real)) return -1;
    size_t len = strlen(root_real);
    bool inside =
        strcmp(root_real, "/") == 0 || (strncmp(real, root_real, len) == 0 && real[len] == '/');
    if (!inside) {
        errno = EACCES;
        return -1;
    }
    /* O_NONBLOCK: a FIFO planted under root must not hang the caller */
    int fd = open(real, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return -1;
    char proc[64], seen[PATH_MAX];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    ssize_t m = readlink(proc, seen, sizeof seen - 1);
    struct stat st;
    if (m < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EACCES;
        return -1;
    }
    seen[m] = '\0';
    if (strcmp(seen, real) != 0) {
        close(fd);
        errno = EACCES;
        return -1;
    }
    /* reads are blocking again, as callers expect */
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
}
