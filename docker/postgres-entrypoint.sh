#!/bin/sh
# Makes the database cluster on the first start of an empty volume, as the
# postgres:15 image does (POSTGRES_USER, POSTGRES_DB, POSTGRES_PASSWORD_FILE
# or POSTGRES_PASSWORD), then runs the command (postgres and its flags).
# The cluster is made while nothing listens on TCP, so a health check over
# TCP (pg_isready -h 127.0.0.1) passes only once it is ready.
set -eu
if [ "${1:-}" != postgres ]; then
    exec "$@"
fi
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    user=${POSTGRES_USER:-postgres}
    db=${POSTGRES_DB:-$user}
    if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
        if [ ! -r "$POSTGRES_PASSWORD_FILE" ]; then
            echo "postgres-entrypoint: cannot read POSTGRES_PASSWORD_FILE ($POSTGRES_PASSWORD_FILE)" >&2
            exit 2
        fi
        password=$(cat "$POSTGRES_PASSWORD_FILE")
    else
        password=${POSTGRES_PASSWORD:-}
    fi
    if [ -z "$password" ]; then
        echo "postgres-entrypoint: no password (POSTGRES_PASSWORD_FILE or POSTGRES_PASSWORD)" >&2
        exit 2
    fi
    pwfile=$(mktemp)
    printf '%s\n' "$password" >"$pwfile"
    initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    # clients come from other containers: any address, with the password
    printf 'host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n' \
        >>"$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    if [ "$db" != postgres ]; then
        pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
        createdb -U "$user" "$db"
        pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    fi
    echo "postgres-entrypoint: made the cluster in $PGDATA (user $user, database $db)"
fi
exec "$@"
