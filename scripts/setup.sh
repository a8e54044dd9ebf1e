#!/usr/bin/env bash
# Create .venv and install atoll with its development tools. Idempotent and quick when done.
# ATOLL_TORCH_CONSTRAINT picks the torch build; the default pins the CPU wheel (constraints/cpu.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
CONSTRAINT=${ATOLL_TORCH_CONSTRAINT:-constraints/cpu.txt}
stamp=.venv/.atoll-installed
want="$(cat pyproject.toml "$CONSTRAINT" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[setup] installing atoll and its dependencies into .venv (first time only)" >&2
  .venv/bin/pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/pip install --quiet -c "$CONSTRAINT" -r "$CONSTRAINT"
  .venv/bin/pip install --quiet -c "$CONSTRAINT" -e '.[dev]'
  # the syncer's fused kernels, compiled once into numba's cache (about 25 s; later processes
  # load them in about a second: atoll/core/fused.py)
  echo "[setup] compiling the syncer's fused kernels (numba, once)" >&2
  .venv/bin/python -c "from atoll.core import fused; fused.configure('on'); fused.kernels(1)"
  echo "$want" > "$stamp"
fi
