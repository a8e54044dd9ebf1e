#!/usr/bin/env bash
# Create the peer benchmark's own environment, benchmarks/peer/.venv: the same torch pin as
# atoll, atoll itself (editable), and torchft 0.2.0. torchft is not an atoll dependency; only
# this benchmark installs it. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
VENV=benchmarks/peer/.venv
CONSTRAINT=${ATOLL_TORCH_CONSTRAINT:-constraints/cpu.txt}
TORCHFT=${ATOLL_PEER_TORCHFT:-torchft==0.2.0}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
stamp=$VENV/.peer-installed
want="$(cat pyproject.toml "$CONSTRAINT" | sha256sum | cut -d' ' -f1) $TORCHFT"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[peer] installing torch, atoll and $TORCHFT into $VENV (first time only)" >&2
  "$VENV/bin/pip" install --quiet --upgrade pip >/dev/null 2>&1 || true
  "$VENV/bin/pip" install --quiet -c "$CONSTRAINT" -r "$CONSTRAINT"
  "$VENV/bin/pip" install --quiet -c "$CONSTRAINT" -e . "$TORCHFT" matplotlib
  echo "$want" > "$stamp"
fi
"$VENV/bin/python" -c "import torchft, atoll, torch; print('[peer] torch', torch.__version__, 'torchft ok')"
