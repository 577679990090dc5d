#!/usr/bin/env bash
# A failover pair on this machine's loopback: a PostgreSQL primary and its
# synchronous standby, managed by Patroni, with a one-member etcd as Patroni's
# consensus store (docs/operations.md#surviving-the-loss-of-the-primary).
#
#   scripts/ha.sh start    create (first time) and start etcd and both nodes; wait
#                          until there is a primary and a synchronous standby;
#                          create the database; print the DATABASE_URL
#   scripts/ha.sh stop     stop both nodes and etcd
#   scripts/ha.sh destroy  stop, then delete the data folder
#   scripts/ha.sh status   each node's role and state, as Patroni sees it
#   scripts/ha.sh url      print the multi-host DATABASE_URL
#
# Ports, from SB_HA_PORT (54460): etcd's clients and peers on the first two,
# the nodes' PostgreSQL on the next two, their Patroni REST APIs on the last
# two. Data under SB_HA_DATA, by default .hadata/ in the checkout (or under the
# system temp dir when the postgres user cannot reach the checkout, as in
# scripts/devdb.sh). As root every process runs as `postgres`.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
base=${SB_HA_PORT:-54460}
dbname=${SB_PG_DB:-switchboard}
etcd_port=$base
etcd_peer_port=$((base + 1))
pg_ports=($((base + 2)) $((base + 3)))
rest_ports=($((base + 4)) $((base + 5)))
nodes=(pg1 pg2)

log() { printf 'ha: %s\n' "$*" >&2; }

bindir=$("$here/scripts/devdb.sh" bindir)

. "$here/scripts/lib.sh"

datadir=$(pick_datadir "${SB_HA_DATA:-}" hadata ha)

url() {
    printf 'postgres://postgres@127.0.0.1:%s,127.0.0.1:%s/%s?target_session_attrs=read-write\n' \
        "${pg_ports[0]}" "${pg_ports[1]}" "$dbname"
}

# Patroni's timings: a node checks every second (loop_wait); a leader that
# cannot renew its key for ttl seconds loses it; a primary whose postmaster
# died is not restarted in place (primary_start_timeout 0) but failed over to
# the synchronous standby, which has every acknowledged commit. Without a
# standby (the other node is down) the primary goes on alone
# (synchronous_mode_strict off): docs/operations.md says what that costs.
write_config() {
    local i=$1 name=${nodes[$1]}
    cat >"$datadir/$name.yml" <<EOF
scope: switchboard
name: $name
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:${rest_ports[$i]}
  connect_address: 127.0.0.1:${rest_ports[$i]}
etcd3:
  hosts: 127.0.0.1:$etcd_port
  protocol: http
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 3
    primary_start_timeout: 0
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    synchronous_mode_strict: false
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        synchronous_commit: "on"
        wal_log_hints: "on"
        max_connections: 300
        max_wal_senders: 10
        max_replication_slots: 10
        wal_keep_size: 256MB
        fsync: "${SB_PG_FSYNC:-on}"
  initdb:
    - encoding: UTF8
    - locale: C.UTF-8
    - auth: trust
postgresql:
  listen: 127.0.0.1:${pg_ports[$i]}
  connect_address: 127.0.0.1:${pg_ports[$i]}
  data_dir: $datadir/$name
  bin_dir: $bindir
  pgpass: $datadir/$name.pgpass
  authentication:
    superuser:
      username: postgres
    replication:
      username: postgres
    rewind:
      username: postgres
  parameters:
    unix_socket_directories: ""
  pg_hba:
    - host all all 127.0.0.1/32 trust
    - host replication all 127.0.0.1/32 trust
EOF
}

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_etcd() {
    if pid_alive "$datadir/etcd.pid"; then return; fi
    as_server bash -c 'nohup "$@" >"$0/etcd.log" 2>&1 & echo $! >"$0/etcd.pid"' "$datadir" \
        etcd --name sb-etcd --data-dir "$datadir/etcd" \
        --listen-client-urls "http://127.0.0.1:$etcd_port" \
        --advertise-client-urls "http://127.0.0.1:$etcd_port" \
        --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
        --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
        --initial-cluster "sb-etcd=http://127.0.0.1:$etcd_peer_port" \
        --log-level warn
    for _ in $(seq 1 100); do
        curl -sf "http://127.0.0.1:$etcd_port/health" >/dev/null && return
        sleep 0.1
    done
    log "etcd did not start (see $datadir/etcd.log)"
    exit 1
}

start_node() {
    local i=$1 name=${nodes[$1]}
    if pid_alive "$datadir/$name.pid"; then return; fi
    write_config "$i"
    as_server bash -c 'nohup "$@" >"$0.log" 2>&1 & echo $! >"$0.pid"' "$datadir/$name" \
        patroni "$datadir/$name.yml"
}

# role of a node from its REST API: primary, replica, or nothing when it is down.
node_json() { curl -sf --max-time 2 "http://127.0.0.1:${rest_ports[$1]}/patroni" || true; }

wait_for_pair() {
    local deadline=$((SECONDS + ${SB_HA_START_TIMEOUT:-90}))
    while [ $SECONDS -lt $deadline ]; do
        # The standby answers 200 on /sync once the primary names it in
        # synchronous_standby_names and it streams.
        local i
        for i in 0 1; do
            if curl -sf --max-time 2 -o /dev/null "http://127.0.0.1:${rest_ports[$i]}/sync"; then
                return 0
            fi
        done
        sleep 0.3
    done
    log "no synchronous standby within ${SB_HA_START_TIMEOUT:-90} s (logs in $datadir)"
    return 1
}

primary_port() {
    local i
    for i in 0 1; do
        if curl -sf --max-time 2 -o /dev/null "http://127.0.0.1:${rest_ports[$i]}/primary"; then
            echo "${pg_ports[$i]}"
            return 0
        fi
    done
    return 1
}

start() {
    local tool
    for tool in patroni etcd; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            log "$tool is not installed: run scripts/system-deps.sh (Debian's patroni and etcd-server)"
            exit 1
        fi
    done
    mkdir -p "$datadir"
    [ "$(id -u)" -eq 0 ] && chown postgres: "$datadir"
    chmod 700 "$datadir"
    log "starting etcd and Patroni nodes (data: $datadir)"
    start_etcd
    start_node 0
    # The first node bootstraps the cluster; the second clones it.
    sleep 1
    start_node 1
    wait_for_pair
    local port
    port=$(primary_port)
    if ! "$bindir/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$dbname'" | grep -q 1; then
        "$bindir/createdb" -h 127.0.0.1 -p "$port" -U postgres "$dbname"
        log "created database $dbname"
    fi
    url
}

stop_pidfile() {
    local pidfile=$1
    pid_alive "$pidfile" || return 0
    local pid
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 300); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$pidfile"; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$pidfile"
}

stop() {
    local i
    # Patroni stops its PostgreSQL before it exits.
    for i in 0 1; do stop_pidfile "$datadir/${nodes[$i]}.pid"; done
    # A postmaster whose Patroni was killed would outlive it.
    for i in 0 1; do
        if [ -s "$datadir/${nodes[$i]}/postmaster.pid" ]; then
            as_server "$bindir/pg_ctl" -D "$datadir/${nodes[$i]}" -m immediate stop \
                >/dev/null 2>&1 || true
        fi
    done
    stop_pidfile "$datadir/etcd.pid"
}

status() {
    local i
    for i in 0 1; do
        local json
        json=$(node_json "$i")
        if [ -z "$json" ]; then
            echo "${nodes[$i]} 127.0.0.1:${pg_ports[$i]} down"
        else
            python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(sys.argv[2], d.get("role"), d.get("state"), "timeline", d.get("timeline"))' \
                "$json" "${nodes[$i]} 127.0.0.1:${pg_ports[$i]}"
        fi
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop; log "stopped (data kept in $datadir)" ;;
    destroy) stop; rm -rf "$datadir"; log "removed $datadir" ;;
    status) status ;;
    url) url ;;
    *) echo "usage: $0 start|stop|destroy|status|url" >&2; exit 2 ;;
esac
