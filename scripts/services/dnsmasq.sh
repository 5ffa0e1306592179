#!/usr/bin/env bash
# Debian's dnsmasq for gpufleet's network-boot tests (tests/provisioning, tests/e2e/test_provision_dhcp.py):
# the tests only run `dnsmasq --test` on the configuration gpufleet renders; this script installs it.
# It never starts or touches a packaged service.
# Usage: dnsmasq.sh install
# install: apt-get install dnsmasq-base when missing (root only; otherwise exit 3 with the reason).
set -euo pipefail

install() {
  if command -v dnsmasq >/dev/null || [ -x /usr/sbin/dnsmasq ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then echo "dnsmasq: not installed and not root (apt-get install dnsmasq-base)" >&2; return 3; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends dnsmasq-base >/dev/null
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
