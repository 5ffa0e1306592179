#!/usr/bin/env bash
# CI's smoke test of what users install (issue 28; docs/install.md): built from this tree, installed
# from scratch, started, and asked real questions. Any failure stops it with a non-zero status.
#   1. the wheel in a new venv: the head starts on a fresh data dir, answers /healthz, serves the
#      dashboard's assets and the CLI talks to it;
#   2. the agent: `gpufleet[agent]` from the wheel pulls in no server framework, and the single-file
#      zipapp joins that head and is up;
#   3. the OCI image (Containerfile) built with podman, started on an empty mounted volume: it makes its
#      CA, migrates the database onto the volume, answers /healthz over HTTPS, and a zipapp agent joins it
#      with the CA pinned by its join token; restarted on the same volume, it keeps its data.
# Usage: scripts/smoke_packages.sh [WORK]   (after `make venv`; WORK default /tmp/gpufleet-smoke)
# env: GPUFLEET_SMOKE_BASE: the image's base (default: a Debian bookworm with python3 made here by
#      debootstrap, as CI reaches PyPI and Debian's mirror but no image registry).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
work=${1:-/tmp/gpufleet-smoke}
python=${PYTHON:-$repo/.venv/bin/python}
mirror=${GPUFLEET_IMAGE_MIRROR:-http://deb.debian.org/debian}
rm -rf "$work"; mkdir -p "$work"
pids=()
container=gpufleet-smoke-head
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  if command -v podman >/dev/null; then podman rm --force --time 2 "$container" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
step() { printf '\n== %s\n' "$*"; }
fail() { echo "smoke: FAILED: $*" >&2; for log in "$work"/*.log; do [ -f "$log" ] && { echo "--- $log"; tail -20 "$log"; }; done >&2; exit 1; }
free_port() { "$python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: until COMMAND succeeds
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what did not happen within the time allowed"
    sleep 0.5
  done
}
node_up() {  # node_up CLI NAME: the head lists node NAME as up
  "$1" node list --output json | "$python" -c 'import json, sys
nodes = {n["name"]: n for n in json.load(sys.stdin)}
sys.exit(0 if nodes.get(sys.argv[1], {}).get("state") == "up" else 1)' "$2"
}

step "dist: wheel, sdist, agent zipapp"
PYTHON=$python bash scripts/dist.sh "$work/dist" || fail "scripts/dist.sh"
wheel=$(ls "$work"/dist/gpufleet-*-py3-none-any.whl)
pyz=$(ls "$work"/dist/gpufleet-agent-*.pyz)
version=$(basename "$wheel" | cut -d- -f2)

step "the wheel in a new venv: head, dashboard assets, CLI"
python3 -m venv "$work/head-venv"
"$work/head-venv/bin/pip" install --quiet "$wheel[server]" >"$work/pip-server.log" 2>&1 || fail "pip install the wheel with [server]"
gpufleet=$work/head-venv/bin/gpufleet
[ "$("$gpufleet" --version)" = "gpufleet $version" ] || fail "the installed CLI's version is not $version"
port=$(free_port)
export GPUFLEET_SERVER=http://127.0.0.1:$port GPUFLEET_TOKEN=gfa_smoke_$RANDOM$RANDOM$RANDOM$RANDOM
GPUFLEET_BOOTSTRAP_TOKEN=$GPUFLEET_TOKEN "$gpufleet" server --data-dir "$work/head" --listen "127.0.0.1:$port" \
  >"$work/head.log" 2>&1 & pids+=($!)
wait_for 60 "the wheel's head answering /healthz" curl -fsS "$GPUFLEET_SERVER/healthz"
curl -fsS "$GPUFLEET_SERVER/healthz" | grep -q "\"version\":\"$version\"" || fail "/healthz does not give version $version"
curl -fsS -o /dev/null "$GPUFLEET_SERVER/static/vendor/htmx.min.js" || fail "the dashboard's htmx is not served from the wheel"
curl -fsS "$GPUFLEET_SERVER/login" | grep -qi "<form" || fail "the login page does not render"
"$gpufleet" node list >/dev/null || fail "the CLI cannot list nodes"

step "the agent: [agent] without server packages, and the zipapp joining"
python3 -m venv "$work/agent-venv"
"$work/agent-venv/bin/pip" install --quiet "$wheel[agent]" >"$work/pip-agent.log" 2>&1 || fail "pip install the wheel with [agent]"
for module in fastapi sqlalchemy uvicorn alembic; do
  if "$work/agent-venv/bin/python" -c "import $module" 2>/dev/null; then fail "[agent] installed $module"; fi
done
"$work/agent-venv/bin/gpufleet" agent --help >/dev/null || fail "the agent venv's gpufleet agent --help"
join=$("$gpufleet" token create --output json | "$python" -c 'import json, sys; print(json.load(sys.stdin)["token"])')
SHIV_ROOT=$work/shiv python3 "$pyz" agent --server "$GPUFLEET_SERVER" --join-token "$join" --name smoke-node-1 \
  --state-dir "$work/agent1" >"$work/agent1.log" 2>&1 & pids+=($!)
wait_for 60 "smoke-node-1 (the zipapp agent) up on the wheel's head" node_up "$gpufleet" smoke-node-1
echo "smoke-node-1 is up"

step "the OCI image: build, start on an empty volume, HTTPS, migrations on the volume, an agent, a restart"
# podman with the tests' private storage and runc configuration (containers.sh: this sandbox's cgroups need it)
state=$(bash scripts/services/containers.sh image | tail -1) || fail "podman (scripts/services/containers.sh image)"
set -a; . "$state/env"; set +a
base=${GPUFLEET_SMOKE_BASE:-localhost/gpufleet/bookworm-python:smoke}
if [ -z "${GPUFLEET_SMOKE_BASE:-}" ] && ! podman image exists "$base"; then
  command -v debootstrap >/dev/null || fail "debootstrap is not installed (scripts/services/images.sh install)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$work/rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || fail "debootstrap of the base image"
  tar -C "$work/rootfs" -cf "$work/rootfs.tar" . && rm -rf "$work/rootfs"
  podman import --quiet "$work/rootfs.tar" "$base" >/dev/null || fail "podman import of the base image"
  rm -f "$work/rootfs.tar"
fi
# The build reaches no index: the dependencies' wheels come from here (as on an air-gapped site).
ctx=$work/context
mkdir -p "$ctx/dist/wheels" "$ctx/packaging"
cp Containerfile .containerignore "$ctx/" && cp packaging/container-entrypoint.sh "$ctx/packaging/" && cp "$wheel" "$ctx/dist/"
# pip wheel, not download: some dependencies (python-hostlist, drain3) are published as sdists only.
"$python" -m pip wheel --quiet --wheel-dir "$ctx/dist/wheels" "$wheel[server]" >"$work/wheels.log" 2>&1 \
  || fail "pip wheel of the server's dependencies"
rm -f "$ctx"/dist/wheels/gpufleet-*.whl
podman build --quiet --build-arg "BASE=$base" --build-arg PIP_OFFLINE=--no-index -t localhost/gpufleet/head:smoke \
  -f "$ctx/Containerfile" "$ctx" >"$work/build.log" 2>&1 || fail "podman build"
mkdir -p "$work/volume"
iport=$(free_port)
run_head() {
  podman run -d --name "$container" -p "127.0.0.1:$iport:8443" -v "$work/volume:/var/lib/gpufleet:U" \
    -e GPUFLEET_SAN="localhost 127.0.0.1" -e GPUFLEET_BOOTSTRAP_TOKEN="$GPUFLEET_TOKEN" \
    localhost/gpufleet/head:smoke >/dev/null || fail "podman run"
}
run_head
url=https://127.0.0.1:$iport
wait_for 90 "the image's head answering /healthz over HTTPS" curl -fsS --cacert "$work/volume/tls/ca.pem" "$url/healthz"
curl -fsS --cacert "$work/volume/tls/ca.pem" "$url/healthz" | grep -q '"status":"ok"' || fail "the image's /healthz"
# The head migrated the database on the volume to this gpufleet's newest revision.
want=$("$work/head-venv/bin/python" -c 'from alembic.script import ScriptDirectory
from gpufleet.migrations import alembic_config
print(ScriptDirectory.from_config(alembic_config()).get_current_head())') || fail "the wheel's newest migration"
have=$("$python" -c 'import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute("select version_num from alembic_version").fetchone()[0])' \
  "$work/volume/gpufleet.db") || fail "no migrated database on the volume"
[ "$have" = "$want" ] || fail "the volume's database is at revision $have, not $want"
export GPUFLEET_SERVER=$url GPUFLEET_CA_FILE=$work/volume/tls/ca.pem
join=$("$gpufleet" token create --output json | "$python" -c 'import json, sys; print(json.load(sys.stdin)["token"])')
SHIV_ROOT=$work/shiv python3 "$pyz" agent --server "$url" --join-token "$join" --name smoke-node-2 \
  --state-dir "$work/agent2" >"$work/agent2.log" 2>&1 & pids+=($!)
wait_for 60 "smoke-node-2 (the zipapp agent) up on the image's head" node_up "$gpufleet" smoke-node-2
stopped=$SECONDS
podman stop --time 30 "$container" >/dev/null && podman rm "$container" >/dev/null
echo "the head stopped in $((SECONDS - stopped)) s"
run_head
wait_for 90 "the restarted image's head answering /healthz" curl -fsS --cacert "$work/volume/tls/ca.pem" "$url/healthz"
wait_for 60 "smoke-node-2 back up on the restarted head, without a new join token" node_up "$gpufleet" smoke-node-2
echo "smoke: the wheel, the agent zipapp and the head image all passed"
