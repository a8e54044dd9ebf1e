#!/usr/bin/env bash
# Set everything up and run the whole test suite, every tier, slow end-to-end tests included
# (the README's second quick-start command; CI runs it). Arguments go to pytest, e.g.
# `./scripts/test.sh tests/unit` or `./scripts/test.sh -m "not slow"`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
