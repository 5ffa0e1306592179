#!/usr/bin/env bash
# sushy-emulator (sushy-tools, fake driver) as real Redfish BMCs for gpufleet's power tests (tests/power).
# Each instance is a plain process on 127.0.0.1 with its own port, state directory and N fake systems,
# so pytest-xdist workers run one each without colliding. It never touches a packaged service.
# Usage: redfish.sh install|start|stop|status
#   GPUFLEET_SERVICES_VENV  (default /opt/gpufleet-services/venv)  sushy-tools' own venv (not the project's .venv)
#   GPUFLEET_SERVICES_RUN   (default /tmp/gpufleet-services)       instance state under $RUN/redfish-$PORT
#   GPUFLEET_REDFISH_PORT   (default 18000)  GPUFLEET_REDFISH_SYSTEMS (default 4): fake systems gpu-node-01..N
#   GPUFLEET_REDFISH_ON     (default 0): how many of them, the last ones, start powered on (the others start off)
# Fake systems are named gpu-node-NN with ids 00000000-0000-4000-8000-0000000000NN (UUIDs).
# The fake driver applies a power change 1 to 11 s after the Reset POST (random, by design): poll PowerState.
# `start` wipes the instance's state, so every start is a clean cluster; it prints the base URL last.
set -euo pipefail
VENV=${GPUFLEET_SERVICES_VENV:-/opt/gpufleet-services/venv}
PORT=${GPUFLEET_REDFISH_PORT:-18000}
SYSTEMS=${GPUFLEET_REDFISH_SYSTEMS:-4}
ON=${GPUFLEET_REDFISH_ON:-0}
STATE=${GPUFLEET_SERVICES_RUN:-/tmp/gpufleet-services}/redfish-$PORT
PIDFILE=$STATE/sushy.pid
SUSHY_TOOLS_VERSION=2.2.0

install() {
  if [ -x "$VENV/bin/sushy-emulator" ]; then return 0; fi
  command -v python3 >/dev/null || { echo "redfish: python3 is missing" >&2; return 3; }
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    if [ "$(id -u)" != 0 ]; then echo "redfish: python3-venv missing and not root" >&2; return 3; fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  mkdir -p "$(dirname "$VENV")"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "sushy-tools==$SUSHY_TOOLS_VERSION"
}

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
url() { echo "http://127.0.0.1:$PORT"; }

write_config() {
  local i power
  {
    echo "# written by gpufleet scripts/services/redfish.sh"
    echo "SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'"
    echo "SUSHY_EMULATOR_LISTEN_PORT = $PORT"
    echo "SUSHY_EMULATOR_FAKE_DRIVER = True"
    echo "SUSHY_EMULATOR_STATE_DIR = '$STATE/state'"
    echo "SUSHY_EMULATOR_FAKE_SYSTEMS = ["
    for i in $(seq 1 "$SYSTEMS"); do
      if [ "$i" -gt $((SYSTEMS - ON)) ]; then power=On; else power=Off; fi
      printf "    {'uuid': '00000000-0000-4000-8000-%012d', 'name': 'gpu-node-%02d', 'power_state': '%s',\n" "$i" "$i" "$power"
      printf "     'external_notifier': False, 'nics': [{'mac': '52:54:00:10:%02x:%02x', 'ip': '127.0.0.1'}]},\n" \
        "$((i / 256))" "$((i % 256))"
    done
    echo "]"
  } > "$STATE/sushy.conf"
}

start() {
  install
  if running; then url; return 0; fi
  rm -rf "$STATE"; mkdir -p "$STATE/state"
  write_config
  setsid "$VENV/bin/sushy-emulator" --config "$STATE/sushy.conf" >"$STATE/sushy.log" 2>&1 </dev/null &
  echo $! > "$PIDFILE"
  for _ in $(seq 1 150); do
    if "$VENV/bin/python" - "$(url)/redfish/v1/Systems" <<'EOF' 2>/dev/null; then url; return 0; fi
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=1).read()
EOF
    running || break
    sleep 0.1
  done
  echo "redfish: sushy-emulator did not start on port $PORT" >&2
  tail -20 "$STATE/sushy.log" >&2 || true
  return 1
}

stop() {
  if running; then
    kill "$(cat "$PIDFILE")" 2>/dev/null || true
    for _ in $(seq 1 50); do running || break; sleep 0.1; done
    running && kill -9 "$(cat "$PIDFILE")" 2>/dev/null || true
  fi
  rm -f "$PIDFILE"
  echo "redfish: stopped (port $PORT)"
}

status() { if running; then echo "redfish: running pid $(cat "$PIDFILE") at $(url)"; else echo "redfish: not running (port $PORT)"; return 1; fi; }

case "${1:-}" in
  install) install ;; start) start ;; stop) stop ;; status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
