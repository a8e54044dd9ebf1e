#!/usr/bin/env bash
# Run every `atoll sim` preset and keep its JSON and loss plot in benchmarks/results/.
# Usage: benchmarks/sim_presets.sh [preset ...]   (default: compare hetero failures quick)
set -euo pipefail
cd "$(dirname "$0")/.."
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(compare hetero failures quick)
for p in "${presets[@]}"; do
  .venv/bin/atoll sim --preset "$p" --json "benchmarks/results/sim_$p.json" \
    --out "benchmarks/results/sim_$p"
  cp "benchmarks/results/sim_$p/loss.png" "benchmarks/results/sim_$p.png"
  rm -r "benchmarks/results/sim_$p"
done
