#!/usr/bin/env bash
# atoll at revision REV against this tree on the peer benchmark's scenario (a), side by side:
# one repeat of each in turn (REV, this tree, REV, ...), so that both meet the same machine.
# Usage: benchmarks/peer/before_after.sh REV OUT [REPEATS]   (root: network namespaces)
# Writes OUT/before and OUT/after (results.json, report.txt, plots). ~1.5 min per run.
set -euo pipefail
cd "$(dirname "$0")/../.."
rev=$1; out=$2; repeats=${3:-2}
PY=$PWD/benchmarks/peer/.venv/bin/python
[ -x "$PY" ] || benchmarks/peer/setup_env.sh
work=$(mktemp -d)
git worktree add --detach "$work/rev" "$rev" >/dev/null
trap 'git worktree remove --force "$work/rev" >/dev/null 2>&1 || true' EXIT
args=(--scenarios a --steps 100 --max-wall 300 --systems atoll)
for rep in $(seq 1 "$repeats"); do  # run.py skips the repeats an out dir already holds
  (cd "$work/rev" && PYTHONPATH="$work/rev/src" "$PY" benchmarks/peer/run.py "${args[@]}" \
    --repeats "$rep" --out "$OLDPWD/$out/before")
  PYTHONPATH="$PWD/src" "$PY" benchmarks/peer/run.py "${args[@]}" --repeats "$rep" --out "$out/after"
done
for side in before after; do
  "$PY" benchmarks/peer/report.py "$out/$side" --target=2.607 | tee "$out/$side/report.txt"
done
