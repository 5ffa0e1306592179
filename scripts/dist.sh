#!/usr/bin/env bash
# The release artefacts, built from this tree into OUT (default dist/):
#   gpufleet-VERSION-py3-none-any.whl  the wheel, the dashboard's assets inside (run `make assets` first)
#   gpufleet-VERSION.tar.gz            the sdist
#   gpufleet-agent-VERSION.pyz         the agent as one file for air-gapped nodes: a shiv zipapp holding
#                                      gpufleet[agent] and its dependencies. Some of them are compiled
#                                      (psutil, pydantic-core), so it runs on nodes with this machine's
#                                      Python minor version and architecture; it unpacks itself into
#                                      ~/.shiv (SHIV_ROOT) on its first start.
# Usage: scripts/dist.sh [OUT]   (PYTHON: the interpreter with `build` and `shiv`, default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-dist}
python=${PYTHON:-.venv/bin/python}
vendor=src/gpufleet/web/static/vendor
if [ ! -f "$vendor/htmx.min.js" ] || [ ! -f "$vendor/uPlot.iife.min.js" ]; then
  echo "dist: the dashboard's assets are missing from $vendor: run \`make assets\` first" >&2
  exit 1
fi
mkdir -p "$out"
version=$("$python" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
rm -f "$out"/gpufleet-"$version"-*.whl "$out"/gpufleet-"$version".tar.gz "$out"/gpufleet-agent-"$version".pyz
"$python" -m build --sdist --wheel --outdir "$out" . >"$out/build.log" 2>&1 || { tail -30 "$out/build.log" >&2; exit 1; }
wheel="$out/gpufleet-$version-py3-none-any.whl"
# The wheel must serve the dashboard without Node.js: its vendored assets are inside.
"$python" - "$wheel" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
missing = [n for n in ("gpufleet/web/static/vendor/htmx.min.js", "gpufleet/web/static/vendor/uPlot.iife.min.js",
                       "gpufleet/migrations/versions/0001_initial_schema.py") if n not in names]
if missing:
    sys.exit(f"dist: {sys.argv[1]} lacks {', '.join(missing)}")
PY
"$python" -m shiv --quiet --compressed -o "$out/gpufleet-agent-$version.pyz" -c gpufleet \
  -p '/usr/bin/env python3' "$wheel[agent]" >>"$out/build.log" 2>&1 || { tail -30 "$out/build.log" >&2; exit 1; }
rm -f "$out/build.log"
ls -1 "$out"/gpufleet-"$version"-py3-none-any.whl "$out"/gpufleet-"$version".tar.gz "$out"/gpufleet-agent-"$version".pyz
