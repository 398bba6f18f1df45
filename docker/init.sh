#!/bin/sh
# First start of the compose deployment on one machine, and adding the GPU
# worker later (`./init.sh --gpu`).  Safe to run again: it keeps every
# password and key it finds and only adds what is missing.
#   1. secrets/postgres_password, a random database password;
#   2. builds the images and starts PostgreSQL and fuseboxd, which creates
#      its CURVE keypair and the admin key on first start;
#   3. for each worker: a keypair in the worker's volume (never copied out),
#      its public key appended to the server's allow-list, and the server's
#      public key copied into the worker's volume;
#   4. starts the workers and says where the admin key is.
# Needs `docker compose` (or docker-compose) and a running Docker engine.
set -eu
cd "$(dirname "$0")"

services="worker-cpu"
gpu=""
case "${1:-}" in
"") ;;
--gpu)
    services="worker-cpu worker-gpu"
    gpu=1
    ;;
*)
    echo "usage: $0 [--gpu]" >&2
    exit 2
    ;;
esac

if docker compose version >/dev/null 2>&1; then
    dc="docker compose"
elif command -v docker-compose >/dev/null 2>&1; then
    dc="docker-compose"
else
    echo "init.sh: neither 'docker compose' nor docker-compose is installed" >&2
    exit 1
fi
# compose [args...]: the compose command, with the gpu profile when asked
compose() {
    if [ -n "$gpu" ]; then set -- --profile gpu "$@"; fi
    # shellcheck disable=SC2086 # $dc is one or two words on purpose
    $dc "$@"
}

# The directory keeps the password from other users of this machine; the
# file itself must be readable inside the containers (postgres runs as uid
# 999, fuseboxd as 10001), which a bind-mounted secret does not remap.
umask 077
mkdir -p secrets import
chmod 0700 secrets
if [ ! -s secrets/postgres_password ]; then
    od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >secrets/postgres_password
    echo "init.sh: wrote secrets/postgres_password"
fi
chmod 0644 secrets/postgres_password
chmod 0755 import

compose build
compose up -d postgres fuseboxd

echo "init.sh: waiting for fuseboxd to be ready"
i=0
until compose exec -T fuseboxd test -s /var/lib/fusebox/server.key.pub 2>/dev/null &&
    compose exec -T fuseboxd curl -fsS -o /dev/null http://127.0.0.1:8080/readyz 2>/dev/null; do
    i=$((i + 1))
    if [ "$i" -gt 90 ]; then
        echo "init.sh: fuseboxd is not ready after 3 minutes; see: docker compose logs fuseboxd" >&2
        exit 1
    fi
    sleep 2
done

server_pub=$(compose exec -T fuseboxd cat /var/lib/fusebox/server.key.pub)
for svc in $services; do
    # shellcheck disable=SC2016 # expanded by the container's shell
    # the key is made inside the worker's volume, as the worker's user
    pub=$(compose run --rm --no-deps -T --entrypoint sh "$svc" -c '
        k=/var/lib/fusebox-worker/worker.key
        [ -e "$k" ] || fusebox-worker --gen-key "$k" >/dev/null
        sed -n "s/^public: *//p" "$k"')
    if [ -z "$pub" ]; then
        echo "init.sh: no public key from $svc" >&2
        exit 1
    fi
    # shellcheck disable=SC2016 # expanded by the container's shell
    # fuseboxd rereads the allow-list when it changes; no restart needed
    compose exec -T fuseboxd sh -c '
        f=/var/lib/fusebox/worker-keys
        grep -qxF "$1" "$f" 2>/dev/null || printf "# %s\n%s\n" "$2" "$1" >>"$f"' sh "$pub" "$svc"
    printf '%s\n' "$server_pub" | compose run --rm --no-deps -T --entrypoint sh "$svc" -c \
        'cat >/var/lib/fusebox-worker/server.key.pub.tmp &&
         mv /var/lib/fusebox-worker/server.key.pub.tmp /var/lib/fusebox-worker/server.key.pub'
    echo "init.sh: $svc allowed (public key $pub)"
done

compose up -d
echo "init.sh: done.  The admin API key:  docker compose exec fuseboxd cat /var/lib/fusebox/admin.key"
echo "init.sh: the dashboard:             http://127.0.0.1:8080/ (FB_HTTP_PORT in .env)"
