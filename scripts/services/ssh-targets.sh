#!/usr/bin/env bash
# Private sshds standing in for nodes, for gpufleet's agent rollout test (tests/e2e/test_deploy_agent.py):
# target i listens on 127.0.0.i (the whole of 127.0.0.0/8 is this machine's loopback), port BASE+i-1,
# with a hostname of its own, gpufleet-target-i (a UTS namespace: unshare --uts, so root), which whatever
# runs in its sessions sees. All of them authorize one client key and are listed in one known_hosts, so
# one Ansible run (host key checking on) reaches them all. Each is a plain process with a configuration
# and host key of its own under $STATE; the system's sshd, its configuration and ~/.ssh are never touched.
# Usage: ssh-targets.sh install|start|stop|status
#   install: apt-get install openssh-server and openssh-client when missing; exit 3 unless root.
#   start:   start the sshds; prints a line "ADDRESS PORT" per target, then, as its last line,
#            "KEY KNOWN_HOSTS USER" (the client key is authorized for USER, the current user).
#   env:     GPUFLEET_SSH_TARGETS_STATE (default /tmp/gpufleet-ssh-targets), GPUFLEET_SSH_TARGETS_PORT
#            (the first port, default 12622), GPUFLEET_SSH_TARGETS (how many, default 2, at most 9)
set -euo pipefail
STATE=${GPUFLEET_SSH_TARGETS_STATE:-/tmp/gpufleet-ssh-targets}
BASE=${GPUFLEET_SSH_TARGETS_PORT:-12622}
COUNT=${GPUFLEET_SSH_TARGETS:-2}

install() {
  if [ "$(id -u)" != 0 ]; then
    echo "ssh-targets: not root: each target's hostname of its own needs unshare --uts" >&2
    return 3
  fi
  if command -v ssh >/dev/null && command -v ssh-keygen >/dev/null && [ -x /usr/sbin/sshd ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    echo "ssh-targets: ssh or sshd missing and not root (apt-get install openssh-server openssh-client)" >&2
    return 3
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server openssh-client >/dev/null
}

running_one() {
  local pid file="$STATE/$1/sshd.pid"
  [ -f "$file" ] || return 1
  pid=$(cat "$file" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

running() {
  local i
  for i in $(seq 1 "$COUNT"); do running_one "$i" || return 1; done
}

facts() {
  local i
  for i in $(seq 1 "$COUNT"); do echo "127.0.0.$i $((BASE + i - 1))"; done
  echo "$STATE/client_ed25519 $STATE/known_hosts $(id -un)"
}

start_one() {
  local i=$1 address="127.0.0.$1" port=$((BASE + $1 - 1)) dir="$STATE/$1"
  mkdir -p "$dir"
  ssh-keygen -q -t ed25519 -N '' -f "$dir/host_ed25519" -C "gpufleet-test-target-$i"
  # the host key known in advance: Ansible checks it strictly instead of trusting on first use
  echo "[$address]:$port $(cut -d' ' -f1,2 "$dir/host_ed25519.pub")" >>"$STATE/known_hosts"
  cat >"$dir/sshd_config" <<EOF
Port $port
ListenAddress $address
HostKey $dir/host_ed25519
PidFile $dir/sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
MaxStartups 64:30:128
MaxSessions 64
EOF
  /usr/sbin/sshd -t -f "$dir/sshd_config"
  # a machine of its own to what runs there: a UTS namespace with the hostname gpufleet-target-i
  # (two agents on one hostname would be one machine to the head, which refuses the second)
  unshare --uts sh -c 'hostname "$1" && exec /usr/sbin/sshd -f "$2" -E "$3"' sh \
    "gpufleet-target-$i" "$dir/sshd_config" "$dir/sshd.log"
}

check_one() {
  local address="127.0.0.$1" port=$((BASE + $1 - 1))
  local ssh=(ssh -p "$port" -i "$STATE/client_ed25519" -o IdentitiesOnly=yes -o BatchMode=yes
    -o "UserKnownHostsFile=$STATE/known_hosts" -o StrictHostKeyChecking=yes "$(id -un)@$address")
  for _ in $(seq 1 50); do
    if "${ssh[@]}" true 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  "${ssh[@]}" true  # once more, to show why it fails
}

start() {
  install
  if running; then facts; return 0; fi
  stop >/dev/null
  rm -rf "$STATE"
  mkdir -p "$STATE"
  chmod 700 "$STATE"
  mkdir -p /run/sshd && chmod 755 /run/sshd  # sshd's privilege-separation directory
  ssh-keygen -q -t ed25519 -N '' -f "$STATE/client_ed25519" -C gpufleet-test-rollout
  cp "$STATE/client_ed25519.pub" "$STATE/authorized_keys"
  chmod 600 "$STATE/authorized_keys"
  : >"$STATE/known_hosts"
  local i
  for i in $(seq 1 "$COUNT"); do start_one "$i"; done
  for i in $(seq 1 "$COUNT"); do check_one "$i"; done
  facts
}

stop() {
  local i dir
  for dir in "$STATE"/[0-9]*; do
    [ -d "$dir" ] || continue
    i=$(basename "$dir")
    if running_one "$i"; then
      kill "$(cat "$dir/sshd.pid")"
      for _ in $(seq 1 50); do running_one "$i" || break; sleep 0.1; done
    fi
  done
  echo "sshds: stopped"
}

status() {
  if running; then echo "sshds: $COUNT running on 127.0.0.1-$COUNT, ports $BASE-$((BASE + COUNT - 1))"; else echo "sshds: not running"; return 1; fi
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
