#!/usr/bin/env bash
# The GPU check of models of real size: the built-in GPT at 100M and 300M parameters
# (benchmarks/scale.py --device cuda: bf16 autocast, 32 x 1024 tokens a step) through one
# training loop with and without atoll.Learner, side by side on one GPU (alternating blocks),
# with a syncer process on this machine started from the model's weights and the learner's
# communication in a child process. Reports per size: tokens/s and MFU of each side, the
# per-step overhead, join and heal time, peak host and GPU memory.
#
#   benchmarks/gpu_check.sh [--nproc N] [--sizes 100M,300M] [--quick] [-- more scale.py options]
#
# --nproc N (N > 1): each size as one island of N ranks under torchrun (every rank calls
# atoll.Learner, rank 0 talks to the syncer); this needs the island API (a Learner that takes
# torch.distributed ranks). Default: one rank, no torchrun.
# --quick: 100M only, few steps (about a minute once set up).
# After --, options for scale.py, e.g. `-- --syncer-set snapshot_every_s=3600` (the syncer's
# snapshots of a large state cost the co-located loop about 2% at 100M on a CPU, BENCHMARKS.md
# §7) or `-- --sizes 1B`.
#
# NOT RUN: written without a GPU; every step but the CUDA ones was checked on a CPU machine.
#
# The environment (the machine may reach no package index):
# - a Python whose torch sees CUDA is looked for: $PYTHON, then .venv/bin/python, python3;
#   atoll goes into that environment with `pip install -e . --no-deps --no-build-isolation`
#   when its dependencies import already (nothing is downloaded), else `pip install -e .`;
#   if pip cannot install at all, the run uses PYTHONPATH=src instead;
# - with no CUDA torch anywhere, .venv-gpu is made and `pip install torch` (PyPI's Linux
#   wheel is a CUDA build) and `pip install -e .` are tried: that needs the index.
# Results: benchmarks/results/scale/gpu.json and gpu.png; the log: benchmarks/results/scale/gpu.log
set -euo pipefail
cd "$(dirname "$0")/.."

NPROC=1
SIZES=100M,300M
STEPS=(--steps 10 --repeats 5 --warmup 5)
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --nproc) NPROC=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --quick) SIZES=100M; STEPS=(--steps 5 --repeats 3 --warmup 3); shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "gpu_check.sh: error: $1 is not allowed: --nproc N, --sizes LIST, --quick, -- ..." >&2; exit 2 ;;
  esac
done

say() { echo "[gpu_check] $*" >&2; }

cuda_python() {  # the first Python whose torch sees a GPU
  for py in "${PYTHON:-}" .venv-gpu/bin/python .venv/bin/python python3 python; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || continue
    if "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  return 1
}

if ! PY=$(cuda_python); then
  say "no Python with a CUDA torch found: making .venv-gpu and installing torch from the index"
  python3 -m venv .venv-gpu
  .venv-gpu/bin/pip install --quiet torch || { say "error: pip install torch failed (no index reachable?): set PYTHON to a Python with a CUDA torch"; exit 1; }
  PY=.venv-gpu/bin/python
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || { say "error: the installed torch sees no GPU (driver? CUDA_VISIBLE_DEVICES?)"; exit 1; }
fi
say "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'))"

DEPS="import numpy, scipy, zstandard, safetensors, rich, matplotlib, grpc, google.protobuf"
if "$PY" -c "$DEPS" 2>/dev/null; then
  "$PY" -m pip install --quiet --no-deps --no-build-isolation -e . 2>/dev/null \
    || say "pip could not install atoll here: using PYTHONPATH=src"
else
  "$PY" -m pip install --quiet -e . \
    || { say "error: atoll's dependencies are missing and cannot be installed: $DEPS"; exit 1; }
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # this tree's atoll either way
"$PY" -c "import atoll.wire.atoll_pb2_grpc, atoll.live.learner" \
  || { say "error: atoll does not import with this Python's grpcio/protobuf (pyproject.toml: grpcio>=1.85.1, protobuf>=7.35.1)"; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi -L >&2 || true

# cores: the training process on the first half, the comm child and the syncer on the rest
N=$(nproc)
HALF=$(( N > 1 ? N / 2 : 1 ))
TRAIN_CPUS="0-$(( HALF - 1 ))"
COMM_CPUS="$HALF-$(( N - 1 ))"
[ "$N" -gt 1 ] || COMM_CPUS=0
[ "$NPROC" -eq 1 ] || TRAIN_CPUS=""  # torchrun's ranks: left to the scheduler

OUT=benchmarks/results/scale/gpu.json
mkdir -p "$(dirname "$OUT")"
say "sizes $SIZES, $NPROC rank(s), training on cpus '${TRAIN_CPUS:-all}', comm and syncer on $COMM_CPUS"
"$PY" benchmarks/scale.py --device cuda --amp bf16 --sizes "$SIZES" --nproc "$NPROC" \
  --batch 32 --context 1024 --threads 4 "${STEPS[@]}" --min-block-s 2 \
  --train-cpus "$TRAIN_CPUS" --comm-cpus "$COMM_CPUS" --out "$OUT" ${EXTRA[@]+"${EXTRA[@]}"} \
  2>&1 | tee "${OUT%.json}.log"
