/*
 * Paths the server takes from its database or from clients and must keep
 * inside a directory it owns: checkpoints and models under the artifacts
 * directory.  A recorded path is relative and is resolved with every
 * symbolic link followed before it is opened, so that neither "..", nor an
 * absolute path, nor a link planted inside the directory can make the
 * server read a file outside it.
 */
#ifndef FB_SERVER_PATHS_H
#define FB_SERVER_PATHS_H

#include <stdbool.h>
#include <stddef.h>

/* True when p is a relative path without empty, "." or ".." segments (a
 * trailing slash aside). */
bool fb_path_safe_relative(const char *p);

/*
 * Opens root/rel for reading when rel is fb_path_safe_relative and the file
 * it resolves to, all symbolic links followed, is a regular file inside
 * root (itself resolved the same way).  The descriptor is checked after the
 * open, so that a path swapped between the check and the open is caught.
 * Returns the descriptor (the caller closes it), or -1 with errno set
 * (EACCES for a path that leaves root); nothing is left open on failure.
 */
int fb_path_open_under(const char *root, const char *rel);

/*
 * Where an installed program finds what was installed with it: rel is a
 * path relative to the directory of this process's executable (as the
 * install rules lay it out, "../share/fusebox/schema" under bin/), joined
 * into out (cap bytes).  True when that path exists; false (out "") when it
 * does not, the executable cannot be read or the path does not fit: a
 * program run from its build tree then keeps its build-tree defaults.
 */
bool fb_path_beside_exe(const char *rel, char *out, size_t cap);

#endif
