#!/usr/bin/env bash
# Set everything up and run the main job (the README's first quick-start command).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/atoll demo "$@"
