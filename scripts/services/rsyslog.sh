#!/usr/bin/env bash
# Debian's rsyslog as a log collector for gpufleet's forwarding tests (tests/api/test_forward_rsyslog.py):
# the tests run their own rsyslogd, as a plain process on a private port with a private configuration;
# this script only installs it. It never starts or touches a packaged service.
# Usage: rsyslog.sh install
# install: apt-get install rsyslog when missing (root only; otherwise exit 3 with the reason).
set -euo pipefail

install() {
  if command -v rsyslogd >/dev/null || [ -x /usr/sbin/rsyslogd ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then echo "rsyslog: not installed and not root (apt-get install rsyslog)" >&2; return 3; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rsyslog >/dev/null
}

case "${1:-}" in
  install) install ;;
  *) echo "usage: $0 install" >&2; exit 2 ;;
esac
