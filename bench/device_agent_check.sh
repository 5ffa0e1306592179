#!/usr/bin/env bash
# On a real GPU machine: a head node and one real agent (NVML) end to end, then liveness after SIGKILL.
# Usage: bench/device_agent_check.sh [WHEELS_DIR]  (offline: installs the listed wheels into a temp venv)
# Writes what it saw to $OUT (or ./device-out) and exits non-zero if a check fails.
set -euo pipefail
OUT=${OUT:-./device-out}; mkdir -p "$OUT"
WHEELS=${1:-}
VENV=$(mktemp -d)/venv
python3 -m venv "$VENV"
if [ -n "$WHEELS" ]; then
  "$VENV/bin/pip" install -q --no-index --find-links "$WHEELS" fastapi uvicorn websockets sqlalchemy alembic jinja2 \
    python-multipart pydantic pydantic-settings httpx typer rich python-hostlist nvidia-ml-py psutil
else
  "$VENV/bin/pip" install -q -e '.[agent,server]'
fi
export PYTHONPATH=$PWD/src GPUFLEET_CLIENT_CONFIG=$(mktemp -d)/client.toml GPUFLEET_LOG_LEVEL=WARNING
G=("$VENV/bin/python" -m gpufleet.entry)
TOKEN=gfa_device-check-token-0123456789
DATA=$(mktemp -d)
GPUFLEET_BOOTSTRAP_TOKEN=$TOKEN "${G[@]}" server --data-dir "$DATA/head" --listen 127.0.0.1:18080 >"$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER ${AGENT:-} 2>/dev/null || true' EXIT
"$VENV/bin/python" -c '
import time, httpx
for _ in range(200):
    try:
        if httpx.get("http://127.0.0.1:18080/healthz").status_code == 200: break
    except httpx.HTTPError: pass
    time.sleep(0.1)'

C=("${G[@]}" --server http://127.0.0.1:18080 --token "$TOKEN")
JOIN=$("${C[@]}" token create --expires 10m 2>/dev/null)
"${G[@]}" agent --server http://127.0.0.1:18080 --join-token "$JOIN" --name h200-node --state-dir "$DATA/agent" \
  >"$OUT/agent.log" 2>&1 &
AGENT=$!
sleep 6
"${C[@]}" node show h200-node -o json >"$OUT/node-show.json"
"${C[@]}" node list -o json >"$OUT/node-list-up.json"
kill -9 $AGENT; KILLED=$(date +%s.%N)
for _ in $(seq 100); do
  state=$("${C[@]}" node list -o json | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)[0]["state"])')
  [ "$state" = down ] && break; sleep 0.1
done
"$VENV/bin/python" -c "import time; print(f'down {time.time() - $KILLED:.2f} s after SIGKILL')" | tee "$OUT/down.txt"
"${C[@]}" node show h200-node -o json >"$OUT/node-show-down.json"
"$VENV/bin/python" - "$OUT/node-show.json" "$(nvidia-smi -L | wc -l)" <<'PY'
import json, sys
node = json.load(open(sys.argv[1])); expected = int(sys.argv[2])
checks = {
    "state up": node["state"] == "up",
    "gpu source nvml": node["gpu_source"] == "nvml",
    f"{expected} GPUs": node["gpu_count"] == expected,
    "model H200": all("H200" in g["model"] for g in node["gpus"]),
    "driver and cuda": all(g["driver_version"] and g["cuda_version"] for g in node["gpus"]),
}
for name, ok in checks.items():
    print(("ok  " if ok else "FAIL"), name)
print(json.dumps(node["gpus"], indent=1))
sys.exit(0 if all(checks.values()) else 1)
PY
