#!/usr/bin/env bash
# Throwaway PostgreSQL 15 server for the storage tests.
#
#   eval "$(bash .ci/postgres.sh start [BASEDIR])"   # exports GEOFL_TEST_POSTGRES_URL
#   python -m pytest tests/storage -q
#   bash .ci/postgres.sh stop "$GEOFL_TEST_POSTGRES_DATADIR"
#
# `start` creates BASEDIR (default: a new `mktemp -d`), runs initdb and pg_ctl as the
# `postgres` user (via runuser when run as root) with the data directory and the unix
# socket directory inside BASEDIR, listens on 127.0.0.1 on a free port with trust
# authentication, waits until the server accepts connections, and prints `export ...`
# lines on stdout; progress and errors go to stderr. fsync is off: the data is disposable.
# BASEDIR and its parents must be reachable by the postgres user.
set -euo pipefail

PG_VERSION=${PG_VERSION:-15}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/${PG_VERSION}/bin}
PYTHON=${PYTHON:-python3}

log() { echo "postgres.sh: $*" >&2; }
die() { log "$*"; exit 1; }

as_postgres() {
    if [ "$(id -u)" -eq 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

require_postgres() {
    if [ ! -x "$PG_BIN/initdb" ] || [ ! -x "$PG_BIN/pg_ctl" ]; then
        die "PostgreSQL ${PG_VERSION} is not installed (no $PG_BIN/initdb); install it with: apt-get install -y postgresql"
    fi
    if [ "$(id -u)" -eq 0 ] && ! id postgres >/dev/null 2>&1; then
        die "user 'postgres' does not exist; install the postgresql package"
    fi
}

free_port() {
    "$PYTHON" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()'
}

start() {
    require_postgres
    local base=${1:-}
    if [ -z "$base" ]; then
        base=$(mktemp -d -t geofl-postgres.XXXXXX)
    fi
    mkdir -p "$base"
    base=$(cd "$base" && pwd)
    local data="$base/data" sockets="$base/sockets" port
    [ -e "$data" ] && die "$data already exists; pass an empty BASEDIR"
    mkdir -p "$sockets"
    if [ "$(id -u)" -eq 0 ]; then
        chown postgres "$base" "$sockets"
    fi
    port=$(free_port)
    log "initdb in $data"
    as_postgres "$PG_BIN/initdb" -D "$data" -U postgres --auth=trust -E UTF8 --locale=C \
        >"$base/initdb.log" 2>&1 || { cat "$base/initdb.log" >&2; die "initdb failed"; }
    log "starting on 127.0.0.1:$port"
    as_postgres "$PG_BIN/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $sockets -c fsync=off -c full_page_writes=off" \
        start >&2 || { cat "$data/server.log" >&2 || true; die "pg_ctl start failed"; }
    local tries=0
    until "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; do
        tries=$((tries + 1))
        [ "$tries" -ge 60 ] && die "server on port $port not ready after 30 s (log: $data/server.log)"
        sleep 0.5
    done
    log "ready"
    echo "export GEOFL_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:${port}/postgres"
    echo "export GEOFL_TEST_POSTGRES_DATADIR=${data}"
    echo "# stop with: bash .ci/postgres.sh stop ${data}"
}

stop() {
    require_postgres
    local data=${1:-${GEOFL_TEST_POSTGRES_DATADIR:-}}
    [ -n "$data" ] || die "usage: postgres.sh stop DATADIR"
    [ -f "$data/PG_VERSION" ] || die "$data is not a PostgreSQL data directory"
    as_postgres "$PG_BIN/pg_ctl" -D "$data" -m fast -w stop >&2
}

case "${1:-}" in
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    *) die "usage: postgres.sh start [BASEDIR] | stop DATADIR" ;;
esac
