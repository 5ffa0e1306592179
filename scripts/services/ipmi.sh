#!/usr/bin/env bash
# OpenIPMI's ipmi_sim as real IPMI BMCs for gpufleet's power tests (tests/power), driven through ipmitool
# over lanplus. Each BMC is a plain ipmi_sim process on 127.0.0.1 (UDP) with its own configuration, and
# its chassis power kept in a file by a chassis_control hook, so a test can read what a BMC was told.
# Instances are told apart by their base port, so pytest-xdist workers run their own. No packaged service
# is started or touched.
# Usage: ipmi.sh install|start|stop|status
#   GPUFLEET_SERVICES_RUN    (default /tmp/gpufleet-services)  instance state under $RUN/ipmi-$BASE/bmcN
#   GPUFLEET_IPMI_BASE_PORT  (default 19700; BMC N listens on base + N - 1)  GPUFLEET_IPMI_BMCS (default 2)
# Every BMC has the user admin with the password "password" (admin privilege): test credentials only.
# The chassis power of BMC N is in $STATE/bmcN/power ("0" off, "1" on); all start off.
# `start` wipes the instance's state and prints "127.0.0.1 BASE N" last.
set -euo pipefail
BASE=${GPUFLEET_IPMI_BASE_PORT:-19700}
BMCS=${GPUFLEET_IPMI_BMCS:-2}
STATE=${GPUFLEET_SERVICES_RUN:-/tmp/gpufleet-services}/ipmi-$BASE

install() {
  if command -v ipmi_sim >/dev/null && command -v ipmitool >/dev/null; then return 0; fi
  if [ "$(id -u)" != 0 ]; then echo "ipmi: ipmi_sim or ipmitool missing and not root (apt-get install openipmi ipmitool)" >&2; return 3; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openipmi ipmitool >/dev/null
}

alive() { # $1: pid file; a zombie is not alive
  local pid stat
  [ -f "$1" ] || return 1
  pid=$(cat "$1" 2>/dev/null); [ -n "$pid" ] || return 1
  stat=$(ps -o stat= -p "$pid" 2>/dev/null) || return 1
  [[ $stat != Z* ]]
}

write_bmc() { # $1: BMC number; writes its directory: hook, lan.conf, emulator commands
  local n=$1 dir=$STATE/bmc$1 port=$((BASE + $1 - 1))
  mkdir -p "$dir/state"; echo 0 > "$dir/power"
  # ipmi_sim runs the hook as: HOOK DEVICE get PARM...  or  HOOK DEVICE set PARM VALUE [PARM VALUE]...
  cat > "$dir/chassis.sh" <<EOF
#!/bin/sh
power_file="$dir/power"
op=\$2; shift 2
case "\$op" in
  get) for parm in "\$@"; do
         case "\$parm" in power) echo "power:\$(cat "\$power_file")" ;; boot) echo "boot:default" ;; *) exit 1 ;; esac
       done ;;
  set) while [ \$# -ge 2 ]; do
         case "\$1" in power) echo "\$2" > "\$power_file" ;; reset|boot) ;; *) exit 1 ;; esac
         shift 2
       done ;;
  *) exit 1 ;;
esac
EOF
  chmod 755 "$dir/chassis.sh"
  cat > "$dir/lan.conf" <<EOF
name "gpufleet-bmc$n"
set_working_mc 0x20
  startlan 1
    addr 127.0.0.1 $port
    priv_limit admin
    allowed_auths_callback none md2 md5 straight
    allowed_auths_user none md2 md5 straight
    allowed_auths_operator none md2 md5 straight
    allowed_auths_admin none md2 md5 straight
    guid 6770756665657400000000000000$(printf %04x "$n")
  endlan
  chassis_control "$dir/chassis.sh 0x20"
  user 1 true  ""      "test"     user  10 none md2 md5 straight
  user 2 true  "admin" "password" admin 10 none md2 md5 straight
EOF
  cat > "$dir/bmc.emu" <<'EOF'
mc_setbmc 0x20
mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr
mc_enable 0x20
EOF
}

answers() { # $1: port; true once the BMC answers over lanplus. The password travels in the environment.
  IPMI_PASSWORD=password timeout 5 ipmitool -I lanplus -H 127.0.0.1 -p "$1" -U admin -E -C 3 -N 1 -R 1 \
    chassis power status >/dev/null 2>&1
}

start() {
  install
  if alive "$STATE/bmc1/sim.pid"; then echo "127.0.0.1 $BASE $BMCS"; return 0; fi
  stop >/dev/null 2>&1 || true
  rm -rf "$STATE"; mkdir -p "$STATE"
  local n port ok
  for n in $(seq 1 "$BMCS"); do
    write_bmc "$n"
    setsid ipmi_sim -c "$STATE/bmc$n/lan.conf" -f "$STATE/bmc$n/bmc.emu" -s "$STATE/bmc$n/state" -n \
      >"$STATE/bmc$n/sim.log" 2>&1 </dev/null &
    echo $! > "$STATE/bmc$n/sim.pid"
  done
  for n in $(seq 1 "$BMCS"); do
    port=$((BASE + n - 1)); ok=0
    for _ in $(seq 1 50); do if answers "$port"; then ok=1; break; fi; sleep 0.1; done
    if [ $ok != 1 ]; then echo "ipmi: BMC $n did not answer on UDP port $port" >&2; tail -20 "$STATE/bmc$n/sim.log" >&2; return 1; fi
  done
  echo "127.0.0.1 $BASE $BMCS"
}

stop() {
  local f
  for f in "$STATE"/bmc*/sim.pid; do
    [ -e "$f" ] || continue
    if alive "$f"; then
      kill "$(cat "$f")" 2>/dev/null || true
      for _ in $(seq 1 50); do alive "$f" || break; sleep 0.1; done
    fi
    rm -f "$f"
  done
  echo "ipmi: stopped (base port $BASE)"
}

status() {
  local f up=0
  for f in "$STATE"/bmc*/sim.pid; do
    [ -e "$f" ] || continue
    if alive "$f"; then up=$((up + 1)); fi
  done
  if [ $up -gt 0 ]; then echo "ipmi: $up BMC(s) running from base port $BASE"; else echo "ipmi: not running (base port $BASE)"; return 1; fi
}

case "${1:-}" in
  install) install ;; start) start ;; stop) stop ;; status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
