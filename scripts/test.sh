#!/usr/bin/env bash
# Set everything up and run the whole test suite, every tier, slow end-to-end tests included
# (the README's second quick-start command; CI runs it). Arguments go to pytest, e.g.
# `./scripts/test.sh tests/unit` or `./scripts/test.sh -m "not slow"`.
# The tests are shared out to ATOLL_TEST_WORKERS pytest-xdist workers (default 3; a test file
# stays on one worker, so its fixtures and namespaces are its own); ATOLL_TEST_WORKERS=0 runs
# them in one process.
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
start=$(date +%s)
set +e
.venv/bin/python -m pytest -n "${ATOLL_TEST_WORKERS:-3}" --dist loadfile "$@"
rc=$?
set -e
echo "[test] $(($(date +%s) - start)) s" >&2
exit "$rc"
