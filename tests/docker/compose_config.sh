#!/bin/sh
# `docker-compose config` parses docker/docker-compose.yml against the
# Compose schema, with and without the gpu profile; it needs no Docker
# engine.  Exit 77 (skipped) when no compose command is installed.
set -eu
src=${FB_SOURCE_DIR:?FB_SOURCE_DIR is not set}
file=$src/docker/docker-compose.yml
if command -v docker-compose >/dev/null 2>&1; then
    set -- docker-compose
elif command -v docker >/dev/null 2>&1 && docker compose version >/dev/null 2>&1; then
    set -- docker compose
else
    echo "SKIP: neither docker-compose nor 'docker compose' is installed"
    exit 77
fi
"$@" -f "$file" config -q
"$@" -f "$file" --profile gpu config -q
# the gpu service must only exist under its profile, with its device reservation
"$@" -f "$file" --profile gpu config | grep -q 'driver: nvidia' || {
    echo "FAIL: the gpu profile has no NVIDIA device reservation"
    exit 1
}
echo "ok: $file is valid (also with --profile gpu)"
