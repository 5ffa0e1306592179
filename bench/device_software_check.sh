#!/usr/bin/env bash
# On a real GPU machine (issues 8 and 9): what the agent's software collector reads there (dpkg, pip,
# the NVIDIA driver, CUDA, VBIOS and InfoROM through real NVML), compared with nvidia-smi, and whether
# the agent's /dev/kmsg follower reads the machine's kernel log. Nothing is installed there: pydantic
# travels as wheels in .whl (see docs/benchmarks.md). Writes to $OUT (or ./device-out).
set -u
OUT=${OUT:-./device-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
{ uname -a; cat /etc/os-release; cat /proc/driver/nvidia/version; nvidia-smi -q | grep -E "Driver Version|CUDA Version|VBIOS|Image Version|Product Name|Serial"; } >"$OUT/machine.txt" 2>&1
time python3 -m gpufleet.agent.software --full --pip-env /opt/torch/.venv >"$OUT/software-full.json" 2>"$OUT/software.err"; echo "full rc=$?" >>"$OUT/software.err"
python3 -m gpufleet.agent.software --export --pip-env /opt/torch/.venv >"$OUT/software-export.json" 2>>"$OUT/software.err"; echo "export rc=$?" >>"$OUT/software.err"
python3 -m gpufleet.agent.software --pip-env /opt/torch/.venv >"$OUT/software-summary.json" 2>>"$OUT/software.err"
timeout 60 python3 - >"$OUT/kmsg.txt" 2>&1 <<'PY'
import os, time, tempfile
from pathlib import Path
from gpufleet.agent.logs import LogWatcher
print("kmsg exists:", os.path.exists("/dev/kmsg"), "readable:", os.access("/dev/kmsg", os.R_OK))
state = Path(tempfile.mkdtemp()) / "cursors.json"
watcher = LogWatcher([Path("/dev/kmsg")], state, lambda bus: None)
for _ in range(3):
    watcher.poll(500)
lines = watcher.take_lines()
print("lines read:", watcher.lines_read, "kept:", len(lines), "events:", len(watcher.classified))
for line in lines[:15]:
    print(line.ts, line.kind, line.line[:160])
print("cursor file:", state.read_text() if state.exists() else None)
PY
echo "kmsg rc=$?" >>"$OUT/kmsg.txt"
cat "$OUT/software-summary.json" "$OUT/software.err"
tail -5 "$OUT/kmsg.txt"
