#!/usr/bin/env bash
# Debian's ibsim (InfiniBand fabric simulator, ibsim-utils 0.10) and infiniband-diags (ibnetdiscover 44.0) for
# gpufleet's topology tests (tests/agent/topology/test_ibnet_ibsim.py): ibsim serves a fabric described in
# ibnetdiscover's own format, and `ibsim-run ibnetdiscover` (libumad2sim preloaded) discovers it as it would a
# real one, with no HCA and no kernel module. The test starts and stops its own ibsim.
# Usage: ibsim.sh install
# install: apt-get install ibsim-utils and infiniband-diags when missing (root only; otherwise exit 3).
set -euo pipefail

install() {
  if command -v ibsim >/dev/null && command -v ibsim-run >/dev/null && command -v ibnetdiscover >/dev/null; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    echo "ibsim: not installed and not root (apt-get install ibsim-utils infiniband-diags)" >&2; return 3
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ibsim-utils infiniband-diags >/dev/null
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
