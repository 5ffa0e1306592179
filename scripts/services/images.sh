#!/usr/bin/env bash
# debootstrap for gpufleet's software images (tests/provisioning/test_images_debootstrap.py, and heads
# that build images with `gpufleet image create --debootstrap`). The test builds a minbase bookworm
# image from deb.debian.org, so it also needs the network to reach the mirror.
# Usage: images.sh install|status
#   install: apt-get install debootstrap (with the Debian and Ubuntu archive keyrings) when missing
#            (root only; otherwise exit 3 with the reason).
#   status:  whether debootstrap is installed and the mirror answers (GPUFLEET_IMAGE_MIRROR,
#            default http://deb.debian.org/debian).
set -euo pipefail
MIRROR=${GPUFLEET_IMAGE_MIRROR:-http://deb.debian.org/debian}

install() {
  if command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then echo "images: debootstrap not installed and not root (apt-get install debootstrap)" >&2; return 3; fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    debootstrap debian-archive-keyring ubuntu-keyring >/dev/null 2>&1 ||
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap debian-archive-keyring >/dev/null
}

status() {
  local ok=0
  if command -v debootstrap >/dev/null || [ -x /usr/sbin/debootstrap ]; then echo "debootstrap: installed"; else echo "debootstrap: missing"; ok=1; fi
  if command -v curl >/dev/null && curl -fsS -m 10 -o /dev/null "$MIRROR/dists/bookworm/Release"; then
    echo "mirror: $MIRROR answers"
  else
    echo "mirror: $MIRROR does not answer"
    ok=1
  fi
  return $ok
}

case "${1:-}" in
  install) install ;;
  status) status ;;
  *) echo "usage: $0 install|status" >&2; exit 2 ;;
esac
