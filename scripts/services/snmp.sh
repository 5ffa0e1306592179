#!/usr/bin/env bash
# Real SNMP agents for gpufleet's switch tests (tests/network): snmpsim serving recordings of real switches,
# and Debian's snmpd as a live agent whose interface counters move. Each instance is a pair of plain processes
# on 127.0.0.1 with ports and a state directory of their own, so pytest-xdist workers run one each without
# colliding. Debian's packaged snmpd service is never used: `install` stops and disables it if it runs.
# Usage: snmp.sh install|start|stop|status
#   GPUFLEET_SNMPSIM_VENV    (default /opt/gpufleet-services/snmpsim)  snmpsim's own venv (not the project's .venv)
#   GPUFLEET_SERVICES_RUN    (default /tmp/gpufleet-services)  instance state under $RUN/snmp-$SNMPSIM_PORT
#   GPUFLEET_SNMPSIM_PORT    (default 18161)  snmpsim, SNMP v2c: one community per recording, named as its file
#   GPUFLEET_SNMPD_PORT      (default the snmpsim port + 1)  snmpd, SNMP v2c and v3
#   GPUFLEET_SNMP_RECORDINGS (default tests/fixtures/snmp)  the .snmprec recordings snmpsim serves
# snmpsim serves a copy of each recording from the state directory; it re-reads a recording whose modification
# time changed, so a test edits its copy (a counter, an ifOperStatus, sysUpTime) and the next poll sees it.
# snmpd serves this machine's interfaces with a throwaway configuration: a random v2c community, the v3 users
# gpufleet-sha (SHA, AES) and gpufleet-sha512 (SHA-512, AES-256) with random keys, sysName gpufleet-snmpd.
# As root, `start` also makes a veth pair: gfsnmp-PORT here (PORT: snmpd's), 10.233.N.1/30, and its far end
# gfsnmpp-PORT, 10.233.N.2/30, in the network namespace gfsnmp-PORT (N: PORT mod 256), so a test sends traffic
# that snmpd counts, and takes the far end down (the near one's ifOperStatus goes down). `stop` removes them.
# `start` wipes the instance's state every time; it prints, last, the path of an env file (KEY=VALUE lines)
# holding everything a client needs. Test credentials only.
set -euo pipefail
VENV=${GPUFLEET_SNMPSIM_VENV:-/opt/gpufleet-services/snmpsim}
SIM_PORT=${GPUFLEET_SNMPSIM_PORT:-18161}
SNMPD_PORT=${GPUFLEET_SNMPD_PORT:-$((SIM_PORT + 1))}
RECORDINGS=${GPUFLEET_SNMP_RECORDINGS:-$(cd "$(dirname "$0")/../../tests/fixtures/snmp" 2>/dev/null && pwd || true)}
STATE=${GPUFLEET_SERVICES_RUN:-/tmp/gpufleet-services}/snmp-$SIM_PORT
ENVFILE=$STATE/snmp.env
SIM_PID=$STATE/snmpsim.pid
SNMPD_PID=$STATE/snmpd.pid.run
SNMPD=/usr/sbin/snmpd
SNMPSIM_VERSION=1.2.2
PYSNMP_VERSION=7.1.30  # snmpsim's own; the same release as gpufleet's
PYSMI_VERSION=1.6.3  # snmpsim imports it without declaring it
LINK=gfsnmp-$SNMPD_PORT
PEER=gfsnmpp-$SNMPD_PORT
NETNS=gfsnmp-$SNMPD_PORT
NET=10.233.$((SNMPD_PORT % 256))
export MIBS=  # net-snmp's programs load no MIB files: numeric OIDs only, and no warnings about missing MIBs

root() { [ "$(id -u)" = 0 ]; }

install() {
  if ! [ -x "$SNMPD" ] || ! command -v snmpget >/dev/null || ! command -v ip >/dev/null; then
    if ! root; then echo "snmp: snmpd, snmp or iproute2 missing and not root (apt-get install snmpd snmp iproute2)" >&2; return 3; fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends snmpd snmp iproute2 >/dev/null
    stop_packaged
  fi
  if [ -x "$VENV/bin/snmpsim-command-responder" ] && "$VENV/bin/python" -c 'import snmpsim.utils' 2>/dev/null; then return 0; fi
  if [ -e "$VENV" ] && [ ! -w "$VENV" ]; then
    echo "snmp: $VENV is not usable by $(id -un) and not writable: set GPUFLEET_SNMPSIM_VENV to a venv of your own" >&2
    return 3
  fi
  command -v python3 >/dev/null || { echo "snmp: python3 is missing" >&2; return 3; }
  if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
    if ! root; then echo "snmp: python3-venv missing and not root (apt-get install python3-venv)" >&2; return 3; fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  mkdir -p "$(dirname "$VENV")" || { echo "snmp: cannot create $(dirname "$VENV") (set GPUFLEET_SNMPSIM_VENV)" >&2; return 3; }
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "snmpsim==$SNMPSIM_VERSION" "pysnmp==$PYSNMP_VERSION" "pysmi==$PYSMI_VERSION"
}

# The package starts its own snmpd on 127.0.0.1:161 where nothing forbids it; the tests never use it.
stop_packaged() {
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl disable --now snmpd >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/snmpd ]; then
    /etc/init.d/snmpd stop >/dev/null 2>&1 || true
    update-rc.d snmpd disable >/dev/null 2>&1 || true
  fi
}

alive() { # $1: a pid file; a zombie is not alive
  local pid stat
  [ -f "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null); [ -n "$pid" ] || return 1
  stat=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [[ $stat != Z* ]]
}

fail() { # $1: what failed; the logs' tails go to stderr
  echo "snmp: $1 (ports $SIM_PORT, $SNMPD_PORT)" >&2
  local log
  for log in "$STATE/snmpsim.log" "$STATE/snmpd.log"; do [ -f "$log" ] && tail -15 "$log" >&2; done
  return 1
}

answers() { # $1: port  $2: community
  snmpget -v2c -c "$2" -t 1 -r 0 -On "127.0.0.1:$1" 1.3.6.1.2.1.1.3.0 >/dev/null 2>&1
}

secret() { head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

start_snmpsim() {
  local f communities=()
  [ -d "$RECORDINGS" ] || { echo "snmp: no recordings at '$RECORDINGS' (set GPUFLEET_SNMP_RECORDINGS)" >&2; return 1; }
  mkdir -p "$STATE/snmpsim/data" "$STATE/snmpsim/cache"
  for f in "$RECORDINGS"/*.snmprec; do
    [ -e "$f" ] || continue
    cp "$f" "$STATE/snmpsim/data/"
    communities+=("$(basename "$f" .snmprec)")
  done
  [ ${#communities[@]} -gt 0 ] || { echo "snmp: no .snmprec file in $RECORDINGS" >&2; return 1; }
  SIM_COMMUNITIES=$(IFS=,; echo "${communities[*]}")
  # As root, snmpsim insists on dropping to another user, who could not read a private state directory
  # (pytest's are 0700); it binds a loopback port only, so here it keeps root's rights.
  SNMPSIM_ALLOW_ROOT=true setsid "$VENV/bin/snmpsim-command-responder" \
    --data-dir="$STATE/snmpsim/data" --cache-dir="$STATE/snmpsim/cache" \
    --agent-udpv4-endpoint="127.0.0.1:$SIM_PORT" >"$STATE/snmpsim.log" 2>&1 </dev/null &
  echo $! > "$SIM_PID"
  for _ in $(seq 1 300); do
    if answers "$SIM_PORT" "${communities[0]}"; then return 0; fi
    alive "$SIM_PID" || break
    sleep 0.1
  done
  fail "snmpsim did not answer"
}

write_snmpd_config() {
  cat > "$STATE/snmpd.conf" <<EOF
# written by gpufleet scripts/services/snmp.sh: test credentials only
sysName gpufleet-snmpd
sysLocation gpufleet tests
sysContact nobody@gpufleet.test
rocommunity $SNMPD_COMMUNITY 127.0.0.1
createUser gpufleet-sha SHA "$V3_AUTH_KEY" AES "$V3_PRIV_KEY"
createUser gpufleet-sha512 SHA-512 "$V3_STRONG_AUTH_KEY" AES-256 "$V3_STRONG_PRIV_KEY"
rouser gpufleet-sha priv
rouser gpufleet-sha512 priv
EOF
  chmod 600 "$STATE/snmpd.conf"
}

start_snmpd() {
  SNMPD_COMMUNITY=gf-$(secret)
  V3_AUTH_KEY=auth-$(secret); V3_PRIV_KEY=priv-$(secret)
  V3_STRONG_AUTH_KEY=auth-$(secret); V3_STRONG_PRIV_KEY=priv-$(secret)
  mkdir -p "$STATE/snmpd-persist"
  write_snmpd_config
  # -f: foreground (setsid: out of the caller's process group); -C: no configuration but ours;
  # SNMP_PERSISTENT_DIR: the v3 users' localised keys go to the instance's state, not /var/lib/snmp.
  SNMP_PERSISTENT_DIR=$STATE/snmpd-persist setsid "$SNMPD" -f -C -c "$STATE/snmpd.conf" -Lf "$STATE/snmpd.log" \
    -p "$STATE/snmpd.pid" "udp:127.0.0.1:$SNMPD_PORT" >/dev/null 2>&1 </dev/null &
  echo $! > "$SNMPD_PID"
  for _ in $(seq 1 100); do
    if answers "$SNMPD_PORT" "$SNMPD_COMMUNITY"; then return 0; fi
    alive "$SNMPD_PID" || break
    sleep 0.1
  done
  fail "snmpd did not answer"
}

make_link() { # as root: the veth pair whose near end snmpd counts; a failure leaves the instance without it
  LINK_MADE=
  root || return 0
  remove_link
  if ip netns add "$NETNS" 2>>"$STATE/link.log" \
    && ip link add "$LINK" type veth peer name "$PEER" 2>>"$STATE/link.log" \
    && ip link set "$PEER" netns "$NETNS" \
    && ip addr add "$NET.1/30" dev "$LINK" && ip link set "$LINK" up \
    && ip -n "$NETNS" link set lo up \
    && ip -n "$NETNS" addr add "$NET.2/30" dev "$PEER" && ip -n "$NETNS" link set "$PEER" up; then
    LINK_MADE=1
  else
    echo "snmp: no veth pair here (see $STATE/link.log); snmpd runs without it" >&2
    remove_link
  fi
}

remove_link() {
  root || return 0
  ip netns del "$NETNS" 2>/dev/null || true  # takes the far end, and so the pair, with it
  ip link del "$LINK" 2>/dev/null || true
}

write_env() {
  cat > "$ENVFILE" <<EOF
GPUFLEET_SNMPSIM_HOST=127.0.0.1
GPUFLEET_SNMPSIM_PORT=$SIM_PORT
GPUFLEET_SNMPSIM_COMMUNITIES=$SIM_COMMUNITIES
GPUFLEET_SNMPSIM_DATA=$STATE/snmpsim/data
GPUFLEET_SNMPSIM_PID=$(cat "$SIM_PID")
GPUFLEET_SNMPD_HOST=127.0.0.1
GPUFLEET_SNMPD_PORT=$SNMPD_PORT
GPUFLEET_SNMPD_COMMUNITY=$SNMPD_COMMUNITY
GPUFLEET_SNMPD_V3_USER=gpufleet-sha
GPUFLEET_SNMPD_V3_AUTH_PROTOCOL=sha
GPUFLEET_SNMPD_V3_AUTH_KEY=$V3_AUTH_KEY
GPUFLEET_SNMPD_V3_PRIV_PROTOCOL=aes
GPUFLEET_SNMPD_V3_PRIV_KEY=$V3_PRIV_KEY
GPUFLEET_SNMPD_V3_STRONG_USER=gpufleet-sha512
GPUFLEET_SNMPD_V3_STRONG_AUTH_PROTOCOL=sha512
GPUFLEET_SNMPD_V3_STRONG_AUTH_KEY=$V3_STRONG_AUTH_KEY
GPUFLEET_SNMPD_V3_STRONG_PRIV_PROTOCOL=aes256
GPUFLEET_SNMPD_V3_STRONG_PRIV_KEY=$V3_STRONG_PRIV_KEY
GPUFLEET_SNMPD_PID=$(cat "$SNMPD_PID")
GPUFLEET_SNMPD_LINK=${LINK_MADE:+$LINK}
GPUFLEET_SNMPD_LINK_NETNS=${LINK_MADE:+$NETNS}
GPUFLEET_SNMPD_LINK_PEER=${LINK_MADE:+$PEER}
GPUFLEET_SNMPD_LINK_ADDRESS=${LINK_MADE:+$NET.1}
GPUFLEET_SNMPD_LINK_PEER_ADDRESS=${LINK_MADE:+$NET.2}
GPUFLEET_SNMP_STATE=$STATE
EOF
  chmod 600 "$ENVFILE"
}

start() {
  install
  if alive "$SIM_PID" && alive "$SNMPD_PID" && [ -f "$ENVFILE" ]; then echo "$ENVFILE"; return 0; fi
  stop >/dev/null
  rm -rf "$STATE"; mkdir -p "$STATE"
  start_snmpsim || { stop >/dev/null; return 1; }
  start_snmpd || { stop >/dev/null; return 1; }
  make_link
  write_env
  echo "$ENVFILE"
}

stop_one() { # $1: pid file
  if alive "$1"; then
    kill "$(cat "$1")" 2>/dev/null || true
    for _ in $(seq 1 50); do alive "$1" || break; sleep 0.1; done
    alive "$1" && kill -9 "$(cat "$1")" 2>/dev/null || true
  fi
  rm -f "$1"
}

stop() {
  stop_one "$SIM_PID"
  stop_one "$SNMPD_PID"
  remove_link
  echo "snmp: stopped (ports $SIM_PORT, $SNMPD_PORT)"
}

status() {
  if alive "$SIM_PID" && alive "$SNMPD_PID"; then
    echo "snmp: snmpsim pid $(cat "$SIM_PID") on 127.0.0.1:$SIM_PORT, snmpd pid $(cat "$SNMPD_PID") on 127.0.0.1:$SNMPD_PORT, env $ENVFILE"
  else
    echo "snmp: not running (ports $SIM_PORT, $SNMPD_PORT)"; return 1
  fi
}

case "${1:-}" in
  install) install ;; start) start ;; stop) stop ;; status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
