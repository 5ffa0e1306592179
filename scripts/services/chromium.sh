#!/usr/bin/env bash
# Debian's Chromium for gpufleet's browser tests (tests/browser), driven by Playwright for Python
# with executable_path=/usr/bin/chromium: no browser is ever downloaded (`playwright install` is
# never run; it cannot work on a closed network).
# Usage: chromium.sh install | status
# install: apt-get install chromium (and a font) when /usr/bin/chromium is missing (root only;
#          otherwise exit 3 with the reason).
set -euo pipefail
CHROMIUM=${GPUFLEET_CHROMIUM:-/usr/bin/chromium}

install() {
  if [ -x "$CHROMIUM" ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    echo "chromium: $CHROMIUM not installed and not root (apt-get install chromium)" >&2; return 3
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
}

status() {
  if [ -x "$CHROMIUM" ]; then "$CHROMIUM" --version; else echo "chromium: not installed ($CHROMIUM)"; return 1; fi
}

case "${1:-}" in
  install) install ;; status) status ;;
  *) echo "usage: $0 install|status" >&2; exit 2 ;;
esac
