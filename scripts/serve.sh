#!/usr/bin/env bash
# Serve Switchboard for `make run`: gunicorn in the foreground and the sweep loop
# (expired leases, due retries) beside it; Ctrl-C or SIGTERM stops both.
#   scripts/serve.sh BIN HOST:PORT
set -euo pipefail
bin=$1
bind=$2
"$bin/python" manage.py sweep --loop &
sweeper=$!
stop_sweeper() { kill -TERM "$sweeper" 2>/dev/null || true; wait "$sweeper" 2>/dev/null || true; }
trap stop_sweeper EXIT
trap 'exit 0' INT TERM
"$bin/gunicorn" -c gunicorn.conf.py --bind "$bind" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; wait "$server"; exit 0' INT TERM
wait "$server"
