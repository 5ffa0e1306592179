#!/usr/bin/env bash
# A throwaway PostgreSQL server for gpufleet's tests: initdb + pg_ctl in a state directory, on 127.0.0.1,
# as the `postgres` OS user (initdb refuses root). It never touches a packaged cluster.
# Usage: postgres.sh install|start|stop|status
#   GPUFLEET_PG_STATE (default /tmp/gpufleet-test-postgres)  GPUFLEET_PG_PORT (default 15432)
# After start, the DSN is printed on stdout and written to $STATE/dsn. Auth is `trust` on loopback: tests only.
set -euo pipefail
STATE=${GPUFLEET_PG_STATE:-/tmp/gpufleet-test-postgres}
PORT=${GPUFLEET_PG_PORT:-15432}
DATA=$STATE/data
SOCK=$STATE/sock
DSN="postgresql+psycopg://gpufleet@127.0.0.1:$PORT/gpufleet"

pgbin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

install() {
  if [ -n "$(pgbin)" ] && [ -x "$(pgbin)/initdb" ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then echo "postgres: not installed and not root (apt-get install postgresql)" >&2; return 3; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >/dev/null
}

running() { [ -f "$DATA/postmaster.pid" ] && as_pg "$(pgbin)/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

start() {
  install
  if running; then echo "$DSN"; return 0; fi
  local B; B=$(pgbin)
  rm -rf "$STATE"; mkdir -p "$STATE" "$SOCK"
  if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$STATE" "$SOCK"; fi
  as_pg test -x "$STATE" || { echo "postgres: the postgres user cannot reach $STATE" >&2; return 1; }
  as_pg "$B/initdb" -D "$DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$STATE/initdb.log" 2>&1 \
    || { cat "$STATE/initdb.log" >&2; return 1; }
  # fsync off: a test database need not survive a power cut, and it makes the suite faster.
  as_pg "$B/pg_ctl" -D "$DATA" -l "$STATE/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $PORT -k $SOCK -c fsync=off -c full_page_writes=off -c synchronous_commit=off -c max_connections=300" \
    start >/dev/null || { cat "$STATE/server.log" >&2; return 1; }
  as_pg "$B/psql" -h "$SOCK" -p "$PORT" -U postgres -qAt \
    -c "CREATE ROLE gpufleet LOGIN SUPERUSER" -c "CREATE DATABASE gpufleet OWNER gpufleet" >/dev/null
  echo "$DSN" > "$STATE/dsn"
  echo "$DSN"
}

stop() { if running; then as_pg "$(pgbin)/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null; fi; echo "postgres: stopped"; }
status() { if running; then echo "postgres: running ($DSN)"; else echo "postgres: not running"; return 1; fi; }

case "${1:-}" in
  install) install ;; start) start ;; stop) stop ;; status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
