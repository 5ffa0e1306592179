#!/usr/bin/env bash
# Debian's stress-ng and fio: what gpufleet-burnin's CPU, memory and disk steps run on a node, and what
# tests/agent/test_burnin_real.py runs for real. Plain programs: nothing to start.
# Usage: burnin-tools.sh install
# install: apt-get install stress-ng fio when missing (root only; otherwise exit 3 with the reason).
set -euo pipefail

install() {
  if command -v stress-ng >/dev/null && command -v fio >/dev/null; then return 0; fi
  if [ "$(id -u)" != 0 ]; then echo "burn-in tools: stress-ng or fio missing and not root (apt-get install stress-ng fio)" >&2; return 3; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends stress-ng fio >/dev/null
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
