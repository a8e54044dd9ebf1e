#!/usr/bin/env bash
# The GPU check of models of real size, on a fresh CUDA machine that reaches PyPI (and nothing
# else need be installed but an NVIDIA driver and a Python >= 3.10).
#
# NEVER RUN ON A GPU: no GPU has been lent to this project so far. Every decision below (the
# driver, the torch wheel, the Python, the CPU sets, the commands) is checked on a CPU machine
# by --dry-run (tests/integration/test_gpu_check.py, with fake nvidia-smi scripts); the CUDA
# steps themselves (installing the wheel, the runs) have not been.
#
# What it does:
# 1. reads the driver from nvidia-smi: its highest CUDA version (the header's "CUDA Version"),
#    the driver version and GPU names (--query-gpu), the GPUs (-L);
# 2. looks for a Python whose torch already sees CUDA ($PYTHON, .venv-gpu/bin/python,
#    .venv/bin/python, python3, python) and uses it as is: its torch must be >= 2.5 (atoll needs
#    torch.distributed.tensor.DTensor) and its Python >= 3.10, else it stops with one line;
# 3. else makes .venv-gpu with the first of python3.12, python3.11, python3.10, python3 that is
#    >= 3.10, and installs the torch that matches the driver (TORCH_TABLE below; a driver older
#    than CUDA 12.4 stops it with one line), then checks that torch sees CUDA;
# 4. installs atoll into that Python (`pip install -e .`, torch pinned to the one there; with no
#    download when atoll's dependencies import already);
# 5. splits the CPUs this process may use (os.sched_getaffinity, not 0..N-1): the training
#    process on the first half, the communication child and the syncer on the rest;
# 6. runs benchmarks/scale.py --device cuda (the built-in GPT, bf16 autocast, 32 x 1024 tokens a
#    step, one training loop with and without atoll.Learner in alternating blocks, a syncer
#    process on this machine) with one rank, then, when 2 or more GPUs are seen, again as one
#    island of 2 ranks over NCCL (torchrun; every rank calls atoll.Learner, rank 0 talks to
#    the syncer);
# 7. ends in one table (benchmarks/gpu_table.py): per size and ranks, tokens/s and MFU without
#    and with atoll, the learner's overhead, the GPU.
#
#   benchmarks/gpu_check.sh [--sizes 100M,300M] [--quick] [--nproc N] [--torch SPEC]
#       [--index-url URL] [--dry-run] [-- more scale.py options]
#
# --sizes LIST   the model sizes (benchmarks/scale_worker.py SIZES; default 100M,300M)
# --quick        100M only, few steps (about a minute once set up)
# --nproc N      the island run's ranks (default: 2 when 2 or more GPUs are seen, else none);
#                --nproc 1: the one-rank run only
# --torch SPEC   the pip requirement for torch (e.g. torch==2.6.0), instead of TORCH_TABLE's
# --index-url U  the package index torch comes from (e.g. https://download.pytorch.org/whl/cu128;
#                default: PyPI, whose Linux wheels of torch are CUDA builds)
# --dry-run      decide everything, install and run nothing: prints the driver, the Python, the
#                torch requirement and index, the CPU sets and the commands; exits 0. It does
#                not look for an existing CUDA Python (it plans a new .venv-gpu)
# -- ...         options for scale.py, e.g. `-- --syncer-set snapshot_every_s=3600` (the
#                syncer's snapshots of a large state cost the co-located loop about 2% at 100M
#                on a CPU, BENCHMARKS.md §7) or `-- --peak-tflops 362` (MFU on a GPU that
#                scale_worker.PEAK_TFLOPS does not know)
# Environment: PYTHON (a Python to try first), NVIDIA_SMI (the nvidia-smi to run; tests give a
# fake one).
#
# Outputs (benchmarks/results/scale/): gpu.json, gpu.png, gpu.log (one rank); gpu_nprocN.json,
# .png, .log (the island of N ranks); gpu_table.md (the table, also printed).
set -euo pipefail
cd "$(dirname "$0")/.."

PROG=gpu_check.sh
ALLOWED="--sizes LIST, --quick, --nproc N, --torch SPEC, --index-url URL, --dry-run, --help, -- SCALE_OPTIONS"
usage_error() { echo "$PROG: error: $1 (allowed: $ALLOWED)" >&2; exit 2; }
die() { echo "$PROG: error: $*" >&2; exit 1; }
say() { echo "[gpu_check] $*" >&2; }

# The torch to install for the driver's highest CUDA version: the first row whose floor the
# driver reaches. Each requirement's newest release on PyPI has the CUDA build named (PyPI's
# default Linux x86_64 wheel is a CUDA build; its Requires-Dist pins the CUDA runtime, read from
# the wheels' metadata on pypi.org: torch 2.5.x and 2.6.0 nvidia-cuda-runtime-cu12==12.4.127;
# 2.7.1 ==12.6.77; 2.8.0, 2.9.x and 2.10.0 ==12.8.90; 2.11.0, 2.13.0 and 2.14.0
# cuda-toolkit==13.0.x; 2.12.x and 2.15.0 had no metadata file to read, so the cu130 row stops
# below 2.15). The same builds are on https://download.pytorch.org/whl/<build>. Keep this table
# up to date as torch moves its default CUDA.
# floor (major*100+minor) | pip requirement | the CUDA build of its wheels
TORCH_TABLE=(
  "1300|torch>=2.11,<2.15|cu130"
  "1208|torch>=2.8,<2.11|cu128"
  "1206|torch>=2.7,<2.8|cu126"
  "1204|torch>=2.5,<2.7|cu124"
)
TORCH_FLOOR=2.5  # torch.distributed.tensor.DTensor

SIZES=100M,300M
STEPS=(--steps 10 --repeats 5 --warmup 5)
NPROC=""
TORCH_SPEC=""
INDEX_URL=""
DRY_RUN=0
EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sizes=*|--nproc=*|--torch=*|--index-url=*) set -- "${1%%=*}" "${1#*=}" "${@:2}"; continue ;;
    --sizes|--nproc|--torch|--index-url)
      { [ $# -ge 2 ] && [ -n "$2" ]; } || usage_error "$1 needs a value"
      case "$1" in
        --sizes) SIZES=$2 ;;
        --nproc) NPROC=$2 ;;
        --torch) TORCH_SPEC=$2 ;;
        --index-url) INDEX_URL=$2 ;;
      esac
      shift 2 ;;
    --quick) SIZES=100M; STEPS=(--steps 5 --repeats 3 --warmup 3); shift ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' benchmarks/gpu_check.sh; exit 0 ;;
    --) shift; EXTRA=("$@"); break ;;
    *) usage_error "$1 is not an option of $PROG" ;;
  esac
done
[[ $SIZES =~ ^[0-9]+[MB](,[0-9]+[MB])*$ ]] || usage_error "--sizes $SIZES is not allowed: e.g. 100M,300M"
[ -z "$NPROC" ] || [[ $NPROC =~ ^[1-9][0-9]*$ ]] || usage_error "--nproc $NPROC is not allowed: a whole number >= 1"

# what the plan says: stdout on a dry run, stderr (and the log) otherwise
plan() { if [ "$DRY_RUN" = 1 ]; then echo "$*"; else say "$*"; fi; }
[ "$DRY_RUN" = 0 ] || plan "$PROG --dry-run: nothing is installed or run"

# ---- 1. the driver
SMI=${NVIDIA_SMI:-nvidia-smi}
CUDA="" DRIVER="" GPU_NAME="" GPUS=0
if command -v "$SMI" >/dev/null 2>&1; then
  HEADER=$("$SMI" 2>&1) || die "$SMI failed: $(head -n 1 <<<"$HEADER")"
  CUDA=$(sed -n 's/.*CUDA Version: *\([0-9][0-9]*\.[0-9][0-9]*\).*/\1/p' <<<"$HEADER" | head -n 1)
  QUERY=$("$SMI" --query-gpu=driver_version,name --format=csv,noheader 2>/dev/null || true)
  DRIVER=$(head -n 1 <<<"$QUERY" | cut -d, -f1 | tr -d ' ')
  GPU_NAME=$(head -n 1 <<<"$QUERY" | cut -s -d, -f2- | sed 's/^ *//')
  GPUS=$("$SMI" -L 2>/dev/null | grep -c '^GPU ' || true)
  [ "$GPUS" -gt 0 ] || GPUS=$(grep -c . <<<"$QUERY" || true)
  plan "driver: ${DRIVER:-unknown}, CUDA ${CUDA:-unknown}; GPUs: $GPUS x ${GPU_NAME:-unknown}"
else
  plan "driver: $SMI not found"
fi

cuda_num() {  # 12.4 -> 1204
  local major=${1%%.*} minor=${1#*.}
  echo $(( 10#$major * 100 + 10#${minor%%.*} ))
}

# ---- 2. a Python whose torch sees CUDA already (not looked for on a dry run)
cuda_python() {
  local py
  for py in "${PYTHON:-}" .venv-gpu/bin/python .venv/bin/python python3 python; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
      echo "$py"; return 0
    fi
  done
  return 1
}

# one line "ok" or what is wrong: Python >= 3.10 and torch >= TORCH_FLOOR
CHECK_PY="
import re, sys
import torch
v = tuple(map(int, re.match(r'\s*(\d+)\.(\d+)', torch.__version__).groups()))
floor = tuple(int(x) for x in '$TORCH_FLOOR'.split('.'))
if sys.version_info < (3, 10):
    print('Python %d.%d is too old: 3.10 or newer is needed' % sys.version_info[:2])
elif v < floor:
    print('its torch %s (CUDA %s) is too old: atoll needs torch >= $TORCH_FLOOR '
          '(torch.distributed.tensor.DTensor)' % (torch.__version__, torch.version.cuda))
else:
    print('ok')
"

PY="" BASE="" INSTALL=0
if [ "$DRY_RUN" = 0 ] && PY=$(cuda_python); then
  verdict=$("$PY" -c "$CHECK_PY" 2>&1 | tail -n 1)
  [ "$verdict" = ok ] || die "$PY: $verdict; upgrade it there, or set PYTHON to another Python"
  plan "python: $PY ($("$PY" -c 'import sys, torch; print("Python %d.%d.%d" % sys.version_info[:3], "torch", torch.__version__, "CUDA", torch.version.cuda)')): used as is"
else
  # ---- 3. .venv-gpu: a Python >= 3.10 and the torch that matches the driver
  INSTALL=1
  seen=""
  for cand in python3.12 python3.11 python3.10 python3; do
    command -v "$cand" >/dev/null 2>&1 || continue
    rc=0  # one call: "VERSION PATH", exit 3 when older than 3.10
    info=$("$cand" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3], sys.executable)
sys.exit(0 if sys.version_info >= (3, 10) else 3)' 2>/dev/null) || rc=$?
    [ -n "$info" ] || continue  # a name that does not run (e.g. a pyenv shim of no version)
    seen="$seen $cand ${info%% *},"
    if [ "$rc" = 0 ]; then
      BASE=${info#* }
      plan "python: $BASE (${info%% *}) -> a new .venv-gpu"
      break
    fi
  done
  [ -n "$BASE" ] || die "no Python 3.10 or newer found (tried python3.12, python3.11, python3.10, python3:${seen:- none runs}); install one"
  TORCH_BUILD=""
  if [ -z "$TORCH_SPEC" ]; then
    if [ -z "$CUDA" ]; then
      why="not found"
      [ -z "${HEADER:-}" ] || why='no "CUDA Version" in its header'
      die "cannot tell the driver's CUDA version ($SMI: $why); give --torch SPEC (and --index-url URL)"
    fi
    have=$(cuda_num "$CUDA")
    for row in "${TORCH_TABLE[@]}"; do
      IFS='|' read -r floor spec build <<<"$row"
      if [ "$have" -ge "$floor" ]; then TORCH_SPEC=$spec; TORCH_BUILD=$build; break; fi
    done
    [ -n "$TORCH_SPEC" ] || die "the driver${DRIVER:+ $DRIVER} supports CUDA $CUDA; PyPI's wheels of torch >= $TORCH_FLOOR need CUDA 12.4 or newer (driver 550 or newer): update the driver, or give --torch SPEC --index-url URL (e.g. https://download.pytorch.org/whl/cu118)"
  fi
  where=${INDEX_URL:-PyPI}
  if [ -n "$TORCH_BUILD" ]; then
    hint=" (the $TORCH_BUILD build"
    [ -n "$INDEX_URL" ] || hint="$hint; another index: --index-url https://download.pytorch.org/whl/$TORCH_BUILD"
    hint="$hint)"
  else
    hint=" (--torch)"
  fi
  plan "torch: pip install '$TORCH_SPEC' from $where$hint"
  PY=.venv-gpu/bin/python
fi
plan "atoll: $PY -m pip install -e . (torch kept as installed)"

# ---- 5. the CPU sets, from this process's affinity
CPU_SETS=$("${BASE:-$PY}" -c '
import os
c = sorted(os.sched_getaffinity(0))
half = max(1, len(c) // 2)
train, comm = c[:half], (c[half:] or c)
print(",".join(map(str, c)), ",".join(map(str, train)), ",".join(map(str, comm)), min(4, len(train)))
') || die "cannot read this process's CPU affinity"
read -r ALL_CPUS TRAIN_CPUS COMM_CPUS THREADS <<<"$CPU_SETS"
plan "cpus: affinity $ALL_CPUS; training $TRAIN_CPUS; comm and syncer $COMM_CPUS"

# ---- the runs
RES=benchmarks/results/scale
OUT1=$RES/gpu.json
COMMON=(--device cuda --amp bf16 --sizes "$SIZES" --batch 32 --context 1024 --threads "$THREADS"
        "${STEPS[@]}" --min-block-s 2 --train-cpus "$TRAIN_CPUS" --comm-cpus "$COMM_CPUS")
CMD1=("$PY" benchmarks/scale.py "${COMMON[@]}" --nproc 1 --out "$OUT1" ${EXTRA[@]+"${EXTRA[@]}"})
island() {  # the island run of $1 ranks (0: none) and the table's command
  ISLAND=$1
  OUT2=$RES/gpu_nproc$ISLAND.json
  CMD2=("$PY" benchmarks/scale.py "${COMMON[@]}" --nproc "$ISLAND" --out "$OUT2" ${EXTRA[@]+"${EXTRA[@]}"})
  TABLE=("$PY" benchmarks/gpu_table.py --out "$RES/gpu_table.md" "$OUT1")
  [ "$ISLAND" -eq 0 ] || TABLE+=("$OUT2")
}
if [ -n "$NPROC" ]; then
  island $(( NPROC > 1 ? NPROC : 0 ))
else
  island $(( GPUS >= 2 ? 2 : 0 ))
fi
if [ "$GPUS" -gt 0 ] && [ "$ISLAND" -gt "$GPUS" ]; then
  die "--nproc $ISLAND needs $ISLAND GPUs; $SMI lists $GPUS"
fi
show() {  # a command as one line a shell would read back
  local a out=""
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then out+=" $a"; else out+=" $(printf '%q' "$a")"; fi
  done
  echo "${out# }"
}
plan "run (1 rank): $(show "${CMD1[@]}")"
if [ "$ISLAND" -gt 0 ]; then
  plan "run ($ISLAND ranks): $(show "${CMD2[@]}")"
elif [ -n "$NPROC" ]; then
  plan "run (island): none (--nproc 1)"
else
  plan "run (island): none ($GPUS GPU seen; 2 are needed)"
fi
plan "table: $(show "${TABLE[@]}")"
[ "$DRY_RUN" = 0 ] || exit 0

# ---- 3 (done). install torch
if [ "$INSTALL" = 1 ]; then
  INDEX=()
  [ -z "$INDEX_URL" ] || INDEX=(--index-url "$INDEX_URL")
  if [ ! -x .venv-gpu/bin/python ]; then
    "$BASE" -m venv .venv-gpu \
      || die "$BASE -m venv .venv-gpu failed (on Debian/Ubuntu: apt-get install python3-venv for that Python)"
  fi
  .venv-gpu/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  .venv-gpu/bin/python -m pip install --quiet ${INDEX[@]+"${INDEX[@]}"} "$TORCH_SPEC" \
    || die "pip install '$TORCH_SPEC' from ${INDEX_URL:-PyPI} failed (index not reachable?); set PYTHON to a Python with a CUDA torch >= $TORCH_FLOOR"
  "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || die "the installed torch $("$PY" -c 'import torch; print(torch.__version__)') sees no GPU (driver? CUDA_VISIBLE_DEVICES?)"
  verdict=$("$PY" -c "$CHECK_PY" 2>&1 | tail -n 1)
  [ "$verdict" = ok ] || die "$PY: $verdict"
fi
say "python: $PY ($("$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'))"

# ---- 4. atoll into that Python
CONSTRAINT=$(mktemp)
trap 'rm -f "$CONSTRAINT"' EXIT
"$PY" -c 'import torch; print("torch==" + torch.__version__)' >"$CONSTRAINT"
DEPS="import sys, numpy, scipy, zstandard, safetensors, rich, matplotlib, grpc, google.protobuf, prometheus_client
sys.version_info >= (3, 11) or __import__('tomli')"
if "$PY" -c "$DEPS" 2>/dev/null; then
  "$PY" -m pip install --quiet --no-deps --no-build-isolation -e . 2>/dev/null \
    || say "pip could not install atoll here: using PYTHONPATH=src"
else
  "$PY" -m pip install --quiet -c "$CONSTRAINT" -e . \
    || die "atoll's dependencies are missing and pip install -e . failed (index not reachable?)"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"  # this tree's atoll either way
"$PY" -c "import atoll.wire.atoll_pb2_grpc, atoll.live.learner" \
  || die "atoll does not import with this Python's grpcio/protobuf (pyproject.toml: grpcio>=1.85.1, protobuf>=7.35.1)"

# the GPUs torch sees (CUDA_VISIBLE_DEVICES may hide some that nvidia-smi lists)
SEEN=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
if [ -z "$NPROC" ]; then
  island $(( SEEN >= 2 ? 2 : 0 ))
elif [ "$ISLAND" -gt "$SEEN" ]; then
  die "--nproc $ISLAND needs $ISLAND GPUs; torch sees $SEEN"
fi

# ---- 6. the runs, 7. the table
mkdir -p "$RES"
rm -f "$OUT1" "$OUT2"
say "sizes $SIZES, 1 rank: $(show "${CMD1[@]}")"
"${CMD1[@]}" 2>&1 | tee "${OUT1%.json}.log" || die "the 1-rank run failed: see ${OUT1%.json}.log"
status=0
if [ "$ISLAND" -gt 0 ]; then
  say "sizes $SIZES, an island of $ISLAND ranks: $(show "${CMD2[@]}")"
  if ! "${CMD2[@]}" 2>&1 | tee "${OUT2%.json}.log"; then
    say "the $ISLAND-rank run failed: see ${OUT2%.json}.log; the table has the 1-rank run only"
    TABLE=("${TABLE[@]:0:$(( ${#TABLE[@]} - 1 ))}")  # without the island's JSON
    status=1
  fi
fi
echo
"${TABLE[@]}"
say "-> $RES/gpu_table.md"
exit "$status"
