#!/usr/bin/env bash
# Debian's dnsmasq for gpufleet's network-boot tests (tests/provisioning, tests/e2e/test_provision_dhcp.py):
# `dnsmasq --test` on the configuration gpufleet renders, and tests/provisioning/test_boot_netns.py, which
# starts dnsmasq in a network namespace of its own with that configuration and boots a "node" in another
# (busybox udhcpc and tftp, iproute2). This script installs them; the test starts and stops its own dnsmasq.
# It never starts or touches a packaged service.
# Usage: dnsmasq.sh install
# install: apt-get install dnsmasq-base, busybox and iproute2 when missing (root only; otherwise exit 3).
set -euo pipefail

install() {
  if [ -x /usr/sbin/dnsmasq ] && command -v busybox >/dev/null && command -v ip >/dev/null; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    echo "dnsmasq: not installed and not root (apt-get install dnsmasq-base busybox iproute2)" >&2; return 3
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends dnsmasq-base busybox iproute2 >/dev/null
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
