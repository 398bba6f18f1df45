#!/bin/sh
# Starts fuseboxd with the database password read from a file (a compose
# secret) rather than from the environment the container is created with, so
# that `docker inspect` and the compose file never show it.  libpq reads
# PGPASSWORD when the connection URL has no password.
set -eu
if [ -n "${PGPASSWORD_FILE:-}" ]; then
    if [ ! -r "$PGPASSWORD_FILE" ]; then
        echo "fuseboxd-entrypoint: cannot read PGPASSWORD_FILE ($PGPASSWORD_FILE)" >&2
        exit 2
    fi
    PGPASSWORD=$(cat "$PGPASSWORD_FILE")
    export PGPASSWORD
    unset PGPASSWORD_FILE
fi
exec fuseboxd "$@"
