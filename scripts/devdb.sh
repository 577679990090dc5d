#!/usr/bin/env bash
# Manage the project-local PostgreSQL cluster used when DATABASE_URL is unset.
#
#   scripts/devdb.sh start    initdb if needed, start (or reuse) the cluster, create the db
#   scripts/devdb.sh stop     stop the cluster if it runs
#   scripts/devdb.sh destroy  stop it and delete its data folder (wherever it lives)
#   scripts/devdb.sh status   say where the cluster lives and whether it runs
#   scripts/devdb.sh psql     open psql on the project database
#
# PostgreSQL refuses to run as root, so as root the server runs as the `postgres`
# user. That user must be able to reach the data folder: when the checkout sits
# under a private home (e.g. /root), the cluster lives under the system temp dir.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
port=${SB_PG_PORT:-54329}
dbname=${SB_PG_DB:-switchboard}

log() { printf 'devdb: %s\n' "$*" >&2; }

find_bindir() {
    if command -v pg_config >/dev/null 2>&1 && [ -x "$(pg_config --bindir)/initdb" ]; then
        pg_config --bindir
        return
    fi
    local d
    for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$d/initdb" ] && { echo "$d"; return; }
    done
    command -v initdb >/dev/null 2>&1 && dirname "$(command -v initdb)"
}

bindir=$(find_bindir || true)
if [ -z "$bindir" ]; then
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        log "no PostgreSQL binaries found; installing Debian's postgresql"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
        bindir=$(find_bindir)
    else
        log "no PostgreSQL binaries found: install PostgreSQL (e.g. apt-get install postgresql) or set DATABASE_URL"
        exit 1
    fi
fi

. "$here/scripts/lib.sh"

datadir=$(pick_datadir "${SB_PG_DATA:-}" pgdata pg)

running() { as_server "$bindir/pg_ctl" -D "$datadir" status >/dev/null 2>&1; }

# The port the running cluster listens on (postmaster.pid's fourth line).
running_port() { sed -n 4p "$datadir/postmaster.pid" 2>/dev/null; }

# A cluster is this data folder on this port: one found running on another port
# is someone else's to stop or reuse (another checkout's SB_PG_PORT, say).
refuse_other_port() {
    local actual
    actual=$(running_port)
    if [ -n "$actual" ] && [ "$actual" != "$port" ]; then
        log "the cluster in $datadir runs on port $actual, not $port: nothing done"
        log "use SB_PG_PORT=$actual, or give a second cluster its own folder with SB_PG_DATA"
        exit 1
    fi
}

pg_ready() { "$bindir/pg_isready" -q -h 127.0.0.1 -p "$port" -U postgres; }

start() {
    if [ ! -s "$datadir/PG_VERSION" ]; then
        log "initdb in $datadir"
        mkdir -p "$datadir"
        if [ "$(id -u)" -eq 0 ]; then
            # /work/repo may be root-owned: let postgres own only its own folder.
            chown postgres: "$datadir"
        fi
        chmod 700 "$datadir"
        as_server "$bindir/initdb" -D "$datadir" -U postgres --auth=trust \
            --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    fi
    if running; then
        refuse_other_port
        log "reusing the running cluster in $datadir (port $port)"
    else
        if pg_ready; then
            log "port $port is taken by another PostgreSQL; set SB_PG_PORT or DATABASE_URL"
            exit 1
        fi
        log "starting PostgreSQL on 127.0.0.1:$port (data: $datadir)"
        # TCP only: every client here connects to 127.0.0.1, and a Unix socket
        # in a deep checkout would exceed the 107-byte socket path limit.
        as_server "$bindir/pg_ctl" -D "$datadir" -l "$datadir/server.log" -w -t 60 \
            -o "-p $port -c unix_socket_directories='' -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=${SB_PG_FSYNC:-on}" \
            start >/dev/null
    fi
    for _ in $(seq 1 60); do pg_ready && break; sleep 0.5; done
    if ! "$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$dbname'" | grep -q 1; then
        "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres "$dbname"
        log "created database $dbname"
    fi
}

stop() {
    if running; then
        refuse_other_port
        as_server "$bindir/pg_ctl" -D "$datadir" -m fast -w stop >/dev/null
        log "stopped the cluster in $datadir"
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    destroy) stop; rm -rf "$datadir"; log "removed $datadir" ;;
    status)
        if running; then echo "running: $datadir on 127.0.0.1:$(running_port)"; else echo "stopped: $datadir"; fi
        ;;
    psql) exec "$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres "$dbname" ;;
    bindir) echo "$bindir" ;;
    *) echo "usage: $0 start|stop|destroy|status|psql|bindir" >&2; exit 2 ;;
esac
