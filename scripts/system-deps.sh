#!/usr/bin/env bash
# Install the Debian packages the test suite needs, when they are missing.
# As root this runs apt-get; otherwise it says what is missing and carries on
# (the tests that need a missing part skip with a reason).
set -euo pipefail
missing=()
command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
    || [ -n "${DATABASE_URL:-}" ] || missing+=(postgresql)
[ -x /usr/bin/chromium ] || missing+=(chromium)
# PgBouncer (transaction pooling) in front of two app servers: tests/system/test_pgbouncer.py.
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
# Patroni and etcd run the failover pair: scripts/ha.sh, tests/system/test_failover.py.
command -v patroni >/dev/null 2>&1 || missing+=(patroni)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
# promtool (Debian's prometheus package) checks the /metrics exposition.
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# pycurl (kombu's SQS transport, in the dev extra) builds against these when
# pip finds no wheel for the machine.
command -v curl-config >/dev/null 2>&1 || missing+=(libcurl4-openssl-dev)
[ -e /usr/include/openssl/ssl.h ] || missing+=(libssl-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "system-deps: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    echo "system-deps: missing Debian packages: ${missing[*]} (the tests that need them skip)" >&2
fi
