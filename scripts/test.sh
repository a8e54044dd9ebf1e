#!/usr/bin/env bash
# Set everything up and run the whole test suite, every tier, slow end-to-end tests included
# (the README's second quick-start command; CI runs it). Arguments go to pytest, e.g.
# `./scripts/test.sh tests/unit` or `./scripts/test.sh -m "not slow"`. ATOLL_TEST_WORKERS=N shares
# the files out to N pytest-xdist workers (a test file stays on one worker, so its fixtures and
# namespaces are its own); by default, and in CI, the suite runs in one process: its end-to-end
# tests start processes of their own, and two workers on 2 cores slow them past some bounds.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# the status page's test drives a real headless browser (Debian's chromium and its driver)
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[test] installing chromium and chromium-driver (apt) for the status page's test" >&2
    apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 ||
      { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1; } ||
      echo "[test] chromium could not be installed: the browser test will say so" >&2
  fi
fi
exec .venv/bin/python -m pytest -n "${ATOLL_TEST_WORKERS:-0}" --dist loadfile "$@"
