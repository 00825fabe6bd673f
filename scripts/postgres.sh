#!/usr/bin/env bash
# A private, throw-away PostgreSQL server for tests (never for production: trust auth, fsync off).
#
#   scripts/postgres.sh start DIR PORT   start a server with its files under DIR, listening on
#                                        127.0.0.1:PORT (and a unix socket in DIR); prints
#                                        postgresql+psycopg://postgres@127.0.0.1:PORT/gpusched
#   scripts/postgres.sh stop DIR         stop it (DIR is left as it is; delete it yourself)
#
# The server comes from Debian's `postgresql` package; if no initdb is found under
# /usr/lib/postgresql/*/bin, it is installed with apt-get (needs root, as in CI).
# initdb and postgres refuse to run as root, so as root they run as the `postgres` user and
# DIR is handed to that user (DIR's parents must let it through: /tmp/xyz is fine, a 0700
# home directory is not).
#
# Exit status: 0 on success, 3 if PostgreSQL is not available here and cannot be installed
# (tests skip on 3), 1 on any other failure (tests fail).
set -euo pipefail

usage() {
    echo "usage: $0 start DIR PORT | $0 stop DIR" >&2
    exit 2
}

find_bindir() {
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        if [[ -x "$dir/initdb" ]]; then
            echo "$dir"
            return 0
        fi
    done
    return 1
}

ensure_bindir() {
    if BINDIR=$(find_bindir); then
        return 0
    fi
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        echo "postgres.sh: no initdb under /usr/lib/postgresql/*/bin, and cannot install" \
            "the postgresql package (needs root and apt-get)" >&2
        exit 3
    fi
    echo "postgres.sh: installing postgresql with apt-get ..." >&2
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends postgresql; } >&2; then
        echo "postgres.sh: apt-get install postgresql failed" >&2
        exit 3
    fi
    BINDIR=$(find_bindir) || { echo "postgres.sh: still no initdb after install" >&2; exit 3; }
}

# Run a PostgreSQL program as the postgres user when we are root, else as ourselves.
as_pg() {
    if [[ $(id -u) -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

url() {
    echo "postgresql+psycopg://postgres@127.0.0.1:$1/gpusched"
}

# The port a running server in $DIR listens on (line 4 of postmaster.pid).
running_port() {
    sed -n 4p "$DIR/data/postmaster.pid" 2>/dev/null
}

start() {
    local port=$1
    ensure_bindir
    mkdir -p "$DIR"
    DIR=$(cd "$DIR" && pwd)
    if [[ -f "$DIR/data/PG_VERSION" ]] && as_pg "$BINDIR/pg_ctl" status -D "$DIR/data" >/dev/null 2>&1; then
        url "$(running_port)"
        return 0
    fi
    if [[ $(id -u) -eq 0 ]]; then
        chown -R postgres: "$DIR"
        if ! runuser -u postgres -- test -w "$DIR"; then
            echo "postgres.sh: user postgres cannot write to $DIR (is a parent directory" \
                "private?)" >&2
            exit 1
        fi
    fi
    if [[ ! -f "$DIR/data/PG_VERSION" ]]; then
        as_pg "$BINDIR/initdb" -D "$DIR/data" -U postgres --auth=trust -E UTF8 --locale=C \
            --no-sync >"$DIR/initdb.log" 2>&1 || {
            cat "$DIR/initdb.log" >&2
            exit 1
        }
    fi
    # Test settings: durability off (the data is thrown away), listen on loopback only.
    as_pg "$BINDIR/pg_ctl" start -D "$DIR/data" -l "$DIR/server.log" -s -o \
        "-c listen_addresses=127.0.0.1 -p $port -k '$DIR' -c fsync=off \
         -c synchronous_commit=off -c full_page_writes=off" >/dev/null || {
        cat "$DIR/server.log" >&2 || true
        exit 1
    }
    local waited=0
    until "$BINDIR/pg_isready" -q -h 127.0.0.1 -p "$port"; do
        if ((waited >= 300)); then
            echo "postgres.sh: server did not become ready in 30 s; its log:" >&2
            cat "$DIR/server.log" >&2 || true
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    if ! "$BINDIR/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'gpusched'" | grep -q 1; then
        "$BINDIR/createdb" -h 127.0.0.1 -p "$port" -U postgres gpusched
    fi
    url "$port"
}

stop() {
    BINDIR=$(find_bindir) || { echo "postgres.sh: no PostgreSQL installed" >&2; exit 3; }
    if [[ ! -f "$DIR/data/postmaster.pid" ]]; then
        echo "postgres.sh: no server running in $DIR" >&2
        return 0
    fi
    as_pg "$BINDIR/pg_ctl" stop -D "$DIR/data" -m fast -s
}

[[ $# -ge 2 ]] || usage
DIR=$2
case $1 in
start)
    [[ $# -eq 3 ]] || usage
    start "$3"
    ;;
stop)
    [[ $# -eq 2 ]] || usage
    stop
    ;;
*) usage ;;
esac
