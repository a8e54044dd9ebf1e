#!/usr/bin/env bash
# The syncer of a run (`atoll syncer`): one process on one host. deploy/k8s/syncer.yaml runs
# this script, and so does the namespace test (tests/e2e/test_multihost.py); see docs/deploy.md.
#
#   ATOLL_RUN_DIR      tape, snapshots, events and the final model (required): durable storage
#                      that outlives the process; a restart on the same directory resumes the run
#   ATOLL_PORT         the gRPC port learners connect to (default 7070)
#   ATOLL_HOST         the address to listen on (default 0.0.0.0: every interface)
#   ATOLL_TLS_CERT, ATOLL_TLS_KEY   the syncer's PEM certificate and key (TLS; both or neither)
#   ATOLL_INIT         a custom model's initial parameters (safetensors, from atoll.save_init)
#   ATOLL_NO_BUDGET    1: run until stopped, with no token budget
#   ATOLL_SERVE_AFTER_BUDGET  1: once the budget's run is over, write the results and serve on
#                      until stopped (default: write them and exit 0; docs/deploy.md)
#   ATOLL_SHARD        i/S: this process is shard i of a syncer split into S (one per host,
#                      each with its own ATOLL_RUN_DIR); learners take every shard's address
#   ATOLL_SHARDS       S: the whole shard set on this host (S processes, ports ATOLL_PORT to
#                      ATOLL_PORT+S-1); not with ATOLL_SHARD
# It writes ATOLL_RUN_DIR/syncer.addr (every shard's address, comma-separated) once it listens:
# deploy/island.sh waits for it with ATOLL_SYNCER_FILE.
# and the run's settings (deploy/lib.sh): ATOLL_RUN_ID, ATOLL_SECRET_FILE or ATOLL_SECRET,
# ATOLL_CONFIG, ATOLL_SET, ATOLL, ATOLL_DRY_RUN.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ -n "${ATOLL_RUN_DIR:-}" ]] || die "ATOLL_RUN_DIR='' is not allowed: a directory on durable storage (tape, snapshots)"
port=${ATOLL_PORT:-7070}
positive_int ATOLL_PORT "$port"
((port < 65536)) || die "ATOLL_PORT='$port' is not allowed: an integer in [1, 65535]"
args=(syncer --run-dir "$ATOLL_RUN_DIR")
common_args
if [[ -n "${ATOLL_TLS_CERT:-}${ATOLL_TLS_KEY:-}" ]]; then
  [[ -r "${ATOLL_TLS_CERT:-}" && -r "${ATOLL_TLS_KEY:-}" ]] ||
    die "ATOLL_TLS_CERT='${ATOLL_TLS_CERT:-}' ATOLL_TLS_KEY='${ATOLL_TLS_KEY:-}' are not allowed: both readable PEM files, or neither"
  args+=(--tls-cert "$ATOLL_TLS_CERT" --tls-key "$ATOLL_TLS_KEY")
fi
if [[ -n "${ATOLL_INIT:-}" ]]; then
  args+=(--init "$ATOLL_INIT")
fi
if [[ "${ATOLL_NO_BUDGET:-0}" == 1 ]]; then
  args+=(--no-budget)
fi
if [[ "${ATOLL_SERVE_AFTER_BUDGET:-0}" == 1 ]]; then
  args+=(--serve-after-budget)
fi
if [[ -n "${ATOLL_SHARDS:-}" ]]; then
  [[ -z "${ATOLL_SHARD:-}" ]] || die "ATOLL_SHARDS='$ATOLL_SHARDS' is not allowed with ATOLL_SHARD: the whole set here, or one shard"
  positive_int ATOLL_SHARDS "$ATOLL_SHARDS"
  args+=(--shards "$ATOLL_SHARDS")
fi
if [[ -n "${ATOLL_SHARD:-}" ]]; then
  [[ "$ATOLL_SHARD" =~ ^[0-9]+/[1-9][0-9]*$ ]] ||
    die "ATOLL_SHARD='$ATOLL_SHARD' is not allowed: i/S, this shard's index and the shard count (e.g. 0/2)"
  args+=(--shard "$ATOLL_SHARD")
fi
# after ATOLL_SET: where the syncer listens is this script's to say
args+=(--set "host=${ATOLL_HOST:-0.0.0.0}" --set "port=$port")
launch
