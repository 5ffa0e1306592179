#!/usr/bin/env bash
# Debian's faketime (libfaketime): runs a program with its clock moved, so tests/doctor shows
# `gpufleet doctor` finding a wrong clock against a real head. A plain program: nothing to start.
# Usage: faketime.sh install
# install: apt-get install faketime when missing (root only; otherwise exit 3 with the reason).
set -euo pipefail

install() {
  if command -v faketime >/dev/null; then return 0; fi
  if [ "$(id -u)" != 0 ]; then echo "faketime: missing and not root (apt-get install faketime)" >&2; return 3; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends faketime >/dev/null
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
