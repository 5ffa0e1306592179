#!/usr/bin/env bash
# Debian's lldpd (1.0.16 on bookworm) in network namespaces, for gpufleet's topology tests (tests/agent/topology):
# a "switch" namespace whose Linux bridge has ports swp1, swp2 and swp3, and two "node" namespaces cabled to
# it by veth pairs, each running its own lldpd, so the LLDP neighbours the agent reads are real:
#   node1 (chassis gpu001): eth0 -- swp1, eth1 -- swp3     node2 (chassis gpu002): eth0 -- swp2
# The switch (chassis leaf01, "configure lldp portidsubtype ifname") sends its port names as port IDs and
# each port's alias ("gpu001:eth0") as its description, as switches do. The addresses (10.233.0.0/24) exist
# only inside the namespaces; a Linux bridge does not forward LLDP's multicast, so each node hears only the
# switch port it is cabled to. Every lldpd has its own control socket (`lldpd -u`): `lldpctl -u SOCKET -f json`
# reads that namespace's neighbours from outside it. lldpd transmits every second (tx-interval 1).
# Usage: lldpd.sh install|start|stop|status
#   GPUFLEET_SERVICES_RUN  (default /tmp/gpufleet-services)  logs, pid files and the env file under $RUN/lldpd-$TAG
#   GPUFLEET_LLDP_SOCKETS  (default /run/gpufleet-lldpd)  the control sockets and configurations under $SOCKETS/$TAG:
#                           lldpd runs its configuration through lldpcli as the unprivileged _lldpd user, which
#                           must reach them (a private test directory, mode 0700, would keep lldpd paused)
#   GPUFLEET_LLDP_TAG      (default gl)  namespaces $TAG-sw, $TAG-n1, $TAG-n2; one per pytest-xdist worker
#                           (at most 8 characters: the host-side veth names are $TAG plus 4)
# install: apt-get install lldpd and iproute2 where missing (root only; otherwise exit 3); a packaged lldpd
#   service the install started is stopped and disabled (the tests run their own). An lldpd that was
#   installed before is left alone.
# start: needs root (network namespaces). Returns at once when this tag's lldpds run; otherwise makes the
#   namespaces, starts the lldpds, waits until each node hears the switch and the switch each node (10 s at most) and prints, last,
#   the path of an env file (KEY=VALUE lines): the namespaces, sockets, chassis names and cabling.
# stop: kills this tag's lldpds and deletes its namespaces (which deletes the veth pairs).
set -euo pipefail
TAG=${GPUFLEET_LLDP_TAG:-gl}
STATE=${GPUFLEET_SERVICES_RUN:-/tmp/gpufleet-services}/lldpd-$TAG
ENVFILE=$STATE/lldpd.env
SOCKETS=${GPUFLEET_LLDP_SOCKETS:-/run/gpufleet-lldpd}/$TAG
LLDPD=/usr/sbin/lldpd
LLDPCTL=/usr/sbin/lldpctl
NS_SW=$TAG-sw
NS_N1=$TAG-n1
NS_N2=$TAG-n2
SWITCH=leaf01
NODE1=gpu001
NODE2=gpu002
NAMESPACES=("$NS_SW" "$NS_N1" "$NS_N2")
# switch port, node namespace, node interface, node address
CABLES=("swp1 $NS_N1 eth0 10.233.0.11" "swp2 $NS_N2 eth0 10.233.0.12" "swp3 $NS_N1 eth1 10.233.0.13")

need_root() {
  if [ "$(id -u)" != 0 ]; then
    echo "lldpd: $1 needs root (network namespaces: ip netns add; apt-get)" >&2; exit 3
  fi
}

install() {
  if [ -x "$LLDPD" ] && [ -x "$LLDPCTL" ] && command -v ip >/dev/null; then return 0; fi
  need_root install
  local had=0
  [ -x "$LLDPD" ] && had=1
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lldpd iproute2 >/dev/null
  [ "$had" = 1 ] || stop_packaged
}

# The package starts lldpd in the host's namespace where nothing forbids it (no policy-rc.d); the tests
# never use it, so it is stopped and kept from starting at boot.
stop_packaged() {
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
    systemctl disable --now lldpd >/dev/null 2>&1 || true
  elif [ -x /etc/init.d/lldpd ]; then
    /etc/init.d/lldpd stop >/dev/null 2>&1 || true
    update-rc.d lldpd disable >/dev/null 2>&1 || true
  fi
}

alive() { # $1: a pid file; a zombie is not alive
  local pid stat
  [ -f "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null); [ -n "$pid" ] || return 1
  stat=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [[ $stat != Z* ]]
}

running() {
  local ns
  for ns in "${NAMESPACES[@]}"; do alive "$STATE/$ns.pid" || return 1; done
  [ -f "$ENVFILE" ]
}

fail() { # $1: what failed; the lldpd logs' tails go to stderr, then the message, last
  local ns
  for ns in "${NAMESPACES[@]}"; do
    if [ -f "$STATE/$ns.log" ]; then echo "--- $ns" >&2; tail -5 "$STATE/$ns.log" >&2; fi
  done
  echo "lldpd: $1 (tag $TAG)" >&2
  return 1
}

make_namespaces() {
  local ns cable port node dev addr i=0
  for ns in "${NAMESPACES[@]}"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
  done
  ip -n "$NS_SW" link add br0 type bridge
  ip -n "$NS_SW" link set br0 up
  ip -n "$NS_SW" addr add 10.233.0.1/24 dev br0
  for cable in "${CABLES[@]}"; do
    read -r port node dev addr <<<"$cable"
    i=$((i + 1))
    # Made in the host's namespace under names unique to the tag, then moved and renamed.
    ip link add "${TAG}s$i" type veth peer name "${TAG}n$i"
    ip link set "${TAG}s$i" netns "$NS_SW"
    ip link set "${TAG}n$i" netns "$node"
    ip -n "$NS_SW" link set "${TAG}s$i" name "$port"
    ip -n "$NS_SW" link set "$port" alias "$(node_name "$node"):$dev"
    ip -n "$NS_SW" link set "$port" master br0
    ip -n "$NS_SW" link set "$port" up
    ip -n "$node" link set "${TAG}n$i" name "$dev"
    ip -n "$node" addr add "$addr/24" dev "$dev"
    ip -n "$node" link set "$dev" up
  done
}

node_name() { # $1: a namespace -> the chassis name its lldpd announces
  case "$1" in "$NS_SW") echo "$SWITCH" ;; "$NS_N1") echo "$NODE1" ;; "$NS_N2") echo "$NODE2" ;; esac
}

start_lldpd() { # $1: namespace, $2: interfaces lldpd may use
  local ns=$1
  {
    echo "configure system hostname $(node_name "$ns")"
    echo "configure lldp tx-interval 1"
    [ "$ns" = "$NS_SW" ] && echo "configure lldp portidsubtype ifname"
  } >"$SOCKETS/$ns.conf"
  # -d: in the foreground, so each instance is a process of its own here (a daemonising lldpd writes one
  # shared /run/lldpd.pid); setsid keeps it out of the caller's process group.
  setsid ip netns exec "$ns" "$LLDPD" -d -u "$SOCKETS/$ns.sock" -O "$SOCKETS/$ns.conf" -I "$2" \
    >"$STATE/$ns.log" 2>&1 </dev/null &
  echo $! >"$STATE/$ns.pid"
}

hears() { # $1: a namespace, $2: its interface, $3: a line its lldpctl must show for it ("port.ifname=swp1")
  "$LLDPCTL" -u "$SOCKETS/$1.sock" -f keyvalue "$2" 2>/dev/null | grep -qx "lldp.$2.$3"
}

all_heard() { # every node hears its switch port, and the switch hears the node on each port
  local cable port node dev _addr
  for cable in "${CABLES[@]}"; do
    read -r port node dev _addr <<<"$cable"
    hears "$node" "$dev" "port.ifname=$port" || return 1
    hears "$NS_SW" "$port" "chassis.name=$(node_name "$node")" || return 1
  done
}

write_env() {
  cat >"$ENVFILE" <<EOF
GPUFLEET_LLDP_TAG=$TAG
GPUFLEET_LLDP_STATE=$STATE
GPUFLEET_LLDP_SWITCH_NS=$NS_SW
GPUFLEET_LLDP_SWITCH_SOCKET=$SOCKETS/$NS_SW.sock
GPUFLEET_LLDP_SWITCH_NAME=$SWITCH
GPUFLEET_LLDP_NODE1_NS=$NS_N1
GPUFLEET_LLDP_NODE1_SOCKET=$SOCKETS/$NS_N1.sock
GPUFLEET_LLDP_NODE1_NAME=$NODE1
GPUFLEET_LLDP_NODE2_NS=$NS_N2
GPUFLEET_LLDP_NODE2_SOCKET=$SOCKETS/$NS_N2.sock
GPUFLEET_LLDP_NODE2_NAME=$NODE2
GPUFLEET_LLDP_CABLES=$NODE1:eth0=$SWITCH:swp1,$NODE2:eth0=$SWITCH:swp2,$NODE1:eth1=$SWITCH:swp3
EOF
}

start() {
  need_root start
  if running; then echo "lldpd: running (tag $TAG)"; echo "$ENVFILE"; return 0; fi
  [ -x "$LLDPD" ] || { echo "lldpd: not installed (bash $0 install)" >&2; return 1; }
  stop >/dev/null 2>&1 || true
  rm -rf "$STATE" "$SOCKETS"; mkdir -p "$STATE"
  mkdir -p -m 0755 "$SOCKETS"; chmod 0755 "$(dirname "$SOCKETS")" "$SOCKETS"
  make_namespaces
  start_lldpd "$NS_SW" "swp*"
  start_lldpd "$NS_N1" "eth0,eth1"
  start_lldpd "$NS_N2" "eth0"
  local _
  for _ in $(seq 1 100); do
    if all_heard; then
      write_env
      echo "lldpd: up in $NS_SW ($SWITCH), $NS_N1 ($NODE1), $NS_N2 ($NODE2)"
      echo "$ENVFILE"
      return 0
    fi
    running_lldpds || fail "an lldpd exited" || return 1
    sleep 0.1
  done
  fail "the nodes and the switch did not hear each other within 10 s"
}

running_lldpds() {
  local ns
  for ns in "${NAMESPACES[@]}"; do alive "$STATE/$ns.pid" || return 1; done
}

stop() {
  local ns pid
  for ns in "${NAMESPACES[@]}"; do
    if alive "$STATE/$ns.pid"; then
      pid=$(cat "$STATE/$ns.pid")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do alive "$STATE/$ns.pid" || break; sleep 0.1; done
      alive "$STATE/$ns.pid" && kill -9 "$pid" 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true # deleting a namespace deletes the veth pairs in it
  done
  rm -rf "$STATE" "$SOCKETS"
  rmdir "$(dirname "$SOCKETS")" 2>/dev/null || true
  echo "lldpd: stopped, namespaces removed (tag $TAG)"
}

status() {
  if running; then echo "lldpd: running (tag $TAG)"; echo "$ENVFILE"; else echo "lldpd: not running (tag $TAG)"; return 1; fi
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
