#!/usr/bin/env bash
# Job containers for gpufleet's tests (tests/agent/test_job_process.py), with no image registry:
# Debian's podman (with runc and catatonit, podman's --init) and bubblewrap, and a busybox image built
# from Debian's busybox-static.
# Usage: containers.sh install | image | status | clean
#   GPUFLEET_CONTAINERS_STATE (default /tmp/gpufleet-test-containers)
# install: apt-get install podman, runc, catatonit and bubblewrap when missing (root only; otherwise exit 3).
# image:   after install, writes a private podman configuration ($STATE/env: CONTAINERS_STORAGE_CONF and
#          CONTAINERS_CONF, so the host's podman store is never touched), imports the image
#          localhost/gpufleet/busybox:test and unpacks the same root file system in $STATE/rootfs (for
#          bubblewrap). Prints the state directory.
# Why the configuration (found on a Debian 12 VM with cgroup v1 + v2 "hybrid" and no systemd):
#  * crun, podman's default runtime, refuses hybrid cgroups ("cgroups in hybrid mode not supported"): runc.
#  * podman's default ulimits exceed what root may set without CAP_SYS_RESOURCE ("error setting rlimit"):
#    nofile at the current hard limit, nproc at most 32768.
#  * no systemd: cgroupfs as the cgroup manager and a file as the events log.
set -euo pipefail
STATE=${GPUFLEET_CONTAINERS_STATE:-/tmp/gpufleet-test-containers}
IMAGE=localhost/gpufleet/busybox:test

install() {
  local missing=()
  for p in podman runc catatonit bubblewrap; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done  # not "rc": removed, configuration kept
  if [ ${#missing[@]} -eq 0 ]; then return 0; fi
  if [ "$(id -u)" != 0 ]; then
    echo "containers: ${missing[*]} not installed and not root (apt-get install ${missing[*]})" >&2; return 3
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

configure() {
  mkdir -p "$STATE"/{graphroot,runroot,tmp}
  local nofile nproc
  nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
  nproc=$(ulimit -Hu); if [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; then nproc=32768; fi
  cat >"$STATE/storage.conf" <<EOF
[storage]
driver = "overlay"
runroot = "$STATE/runroot"
graphroot = "$STATE/graphroot"
EOF
  cat >"$STATE/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$STATE/events.log"
tmp_dir = "$STATE/tmp"
EOF
  printf 'CONTAINERS_STORAGE_CONF=%s\nCONTAINERS_CONF=%s\n' "$STATE/storage.conf" "$STATE/containers.conf" >"$STATE/env"
}

# A busybox root file system: the static binary from Debian's package (unpacked, not installed: it
# conflicts with the busybox package), one link per applet, and a passwd file naming root and nobody.
build_rootfs() {
  local work="$STATE/build" rootfs="$1"
  rm -rf "$work" "$rootfs"; mkdir -p "$work" "$rootfs"/{bin,tmp,proc,sys,dev,etc,root,work}
  (cd "$work" && { apt-get download busybox-static >/dev/null 2>&1 || { apt-get update -qq && apt-get download busybox-static >/dev/null; }; })
  dpkg-deb -x "$work"/busybox-static_*.deb "$work/unpacked"
  cp "$work/unpacked/bin/busybox" "$rootfs/bin/busybox"
  for applet in $("$rootfs/bin/busybox" --list); do
    [ "$applet" = busybox ] || ln -sf busybox "$rootfs/bin/$applet"
  done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
  chmod 1777 "$rootfs/tmp"
  rm -rf "$work"
}

image() {
  install
  configure
  set -a; . "$STATE/env"; set +a
  if [ ! -x "$STATE/rootfs/bin/busybox" ]; then build_rootfs "$STATE/rootfs"; fi
  if ! podman image exists "$IMAGE"; then
    tar -C "$STATE/rootfs" -cf "$STATE/rootfs.tar" .
    podman import --quiet --change 'CMD ["/bin/sh"]' "$STATE/rootfs.tar" "$IMAGE" >/dev/null
    rm -f "$STATE/rootfs.tar"
  fi
  echo "$STATE"
}

status() {
  local ok=0
  for tool in podman runc bwrap; do
    if command -v "$tool" >/dev/null; then echo "$tool: $(command -v "$tool")"; else echo "$tool: not installed"; ok=1; fi
  done
  if [ -f "$STATE/env" ]; then
    set -a; . "$STATE/env"; set +a
    if podman image exists "$IMAGE"; then echo "image: $IMAGE"; else echo "image: not built"; ok=1; fi
  else
    echo "image: not built (containers.sh image)"; ok=1
  fi
  return "$ok"
}

clean() {
  if [ -f "$STATE/env" ]; then
    set -a; . "$STATE/env"; set +a
    podman rm -af >/dev/null 2>&1 || true
    podman system reset -f >/dev/null 2>&1 || true
  fi
  rm -rf "$STATE"
  echo "containers: removed $STATE"
}

if [ $# -eq 0 ]; then echo "usage: $0 install|image|status|clean ..." >&2; exit 2; fi
for command in "$@"; do
  case "$command" in
    install) install ;; image) image ;; status) status ;; clean) clean ;;
    *) echo "usage: $0 install|image|status|clean ..." >&2; exit 2 ;;
  esac
done
