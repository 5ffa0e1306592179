#!/usr/bin/env bash
# Debian's Prometheus (and promtool) for gpufleet's tests: a private server on 127.0.0.1 with the
# given configuration and a throwaway data directory. It never touches a packaged service.
# Usage: prometheus.sh install | start CONFIG | stop | status
#   GPUFLEET_PROM_STATE (default /tmp/gpufleet-test-prometheus)  GPUFLEET_PROM_PORT (default 19090)
# install: apt-get install prometheus when missing (root only; otherwise exit 3 with the reason).
# start: after `promtool check config`, prints the server's URL once it answers /-/ready.
set -euo pipefail
STATE=${GPUFLEET_PROM_STATE:-/tmp/gpufleet-test-prometheus}
PORT=${GPUFLEET_PROM_PORT:-19090}
URL="http://127.0.0.1:$PORT"

install() {
  if command -v prometheus >/dev/null && command -v promtool >/dev/null; then return 0; fi
  if [ "$(id -u)" != 0 ]; then echo "prometheus: not installed and not root (apt-get install prometheus)" >&2; return 3; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}

alive() { local p s; [ -f "$STATE/prometheus.pid" ] || return 1; p=$(cat "$STATE/prometheus.pid" 2>/dev/null); [ -n "$p" ] || return 1
  s=$(ps -o stat= -p "$p" 2>/dev/null) || return 1; [[ $s != Z* ]]; }

start() {
  local config=${1:?usage: prometheus.sh start CONFIG}
  install
  if alive; then echo "prometheus: already running in $STATE ($URL); stop it first" >&2; return 1; fi
  promtool check config "$config" >&2
  rm -rf "$STATE/data"; mkdir -p "$STATE/data"
  # setsid: the server outlives this script; `stop` ends it by the PID recorded here.
  setsid prometheus --config.file="$config" --storage.tsdb.path="$STATE/data" \
    --web.listen-address="127.0.0.1:$PORT" >"$STATE/prometheus.log" 2>&1 </dev/null &
  echo $! > "$STATE/prometheus.pid"
  for _ in $(seq 1 150); do
    if curl -fsS "$URL/-/ready" >/dev/null 2>&1; then echo "$URL"; return 0; fi
    alive || break
    sleep 0.2
  done
  echo "prometheus: did not become ready" >&2; tail -20 "$STATE/prometheus.log" >&2; stop >/dev/null; return 1
}

stop() {
  if alive; then
    kill "$(cat "$STATE/prometheus.pid")"
    for _ in $(seq 1 100); do alive || break; sleep 0.1; done
  fi
  rm -f "$STATE/prometheus.pid"
  echo "prometheus: stopped"
}

status() { if alive; then echo "prometheus: running ($URL)"; else echo "prometheus: not running"; return 1; fi; }

case "${1:-}" in
  install) install ;; start) shift; start "$@" ;; stop) stop ;; status) status ;;
  *) echo "usage: $0 install|start CONFIG|stop|status" >&2; exit 2 ;;
esac
