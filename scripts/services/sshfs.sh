#!/usr/bin/env bash
# sshfs (FUSE) against a private sshd, for gpufleet's shared-mount probe tests (tests/agent/storage): the
# kernel here has no NFS client, but FUSE is there, and a FUSE daemon stopped with SIGSTOP makes stat()
# on its mount block in the kernel exactly as a hung NFS server does.
# The sshd is a plain process on 127.0.0.1 with a configuration, host key and authorized key of its own
# under $STATE, serving SFTP (internal-sftp); the system's sshd, its configuration and ~/.ssh are never touched.
# Usage: sshfs.sh install|start|stop|status
#   install: apt-get install sshfs (with fuse3), openssh-server and openssh-client when missing (root only;
#            otherwise exit 3 with the reason).
#   start:   start the sshd; prints, as its last line, "PORT KEY KNOWN_HOSTS USER".
#   env:     GPUFLEET_SSHFS_STATE (default /tmp/gpufleet-sshfs-sshd), GPUFLEET_SSHFS_SSHD_PORT (default 12422)
set -euo pipefail
STATE=${GPUFLEET_SSHFS_STATE:-/tmp/gpufleet-sshfs-sshd}
PORT=${GPUFLEET_SSHFS_SSHD_PORT:-12422}

install() {
  if command -v sshfs >/dev/null && command -v fusermount3 >/dev/null && command -v ssh >/dev/null \
    && [ -x /usr/sbin/sshd ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    echo "sshfs: sshfs, fusermount3, ssh or sshd missing and not root (apt-get install sshfs openssh-server openssh-client)" >&2
    return 3
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends sshfs fuse3 openssh-server openssh-client >/dev/null
}

running() {
  local pid
  [ -f "$STATE/sshd.pid" ] || return 1
  pid=$(cat "$STATE/sshd.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

facts() { echo "$PORT $STATE/client_ed25519 $STATE/known_hosts $(id -un)"; }

start() {
  install
  if running; then facts; return 0; fi
  rm -rf "$STATE"
  mkdir -p "$STATE"
  chmod 700 "$STATE"
  mkdir -p /run/sshd && chmod 755 /run/sshd
  ssh-keygen -q -t ed25519 -N '' -f "$STATE/host_ed25519" -C gpufleet-test-sshfs
  ssh-keygen -q -t ed25519 -N '' -f "$STATE/client_ed25519" -C gpufleet-test-sshfs-client
  cp "$STATE/client_ed25519.pub" "$STATE/authorized_keys"
  chmod 600 "$STATE/authorized_keys"
  echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$STATE/host_ed25519.pub")" >"$STATE/known_hosts"
  cat >"$STATE/sshd_config" <<CONF
Port $PORT
ListenAddress 127.0.0.1
HostKey $STATE/host_ed25519
PidFile $STATE/sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
Subsystem sftp internal-sftp
CONF
  /usr/sbin/sshd -t -f "$STATE/sshd_config"
  /usr/sbin/sshd -f "$STATE/sshd_config" -E "$STATE/sshd.log"
  local ssh=(ssh -p "$PORT" -i "$STATE/client_ed25519" -o IdentitiesOnly=yes -o BatchMode=yes
    -o "UserKnownHostsFile=$STATE/known_hosts" -o StrictHostKeyChecking=yes "$(id -un)@127.0.0.1")
  for _ in $(seq 1 50); do
    if "${ssh[@]}" true 2>/dev/null; then facts; return 0; fi
    sleep 0.1
  done
  "${ssh[@]}" true
  facts
}

stop() {
  if running; then
    kill "$(cat "$STATE/sshd.pid")"
    for _ in $(seq 1 50); do running || break; sleep 0.1; done
  fi
  echo "sshd: stopped"
}

status() {
  if running; then echo "sshd: running, pid $(cat "$STATE/sshd.pid"), 127.0.0.1:$PORT"; else echo "sshd: not running"; return 1; fi
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) status ;;
  *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
