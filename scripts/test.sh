#!/usr/bin/env bash
# Set everything up and run the test suite (the README's second quick-start command).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
