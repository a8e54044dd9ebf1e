#!/usr/bin/env bash
# One learner island (`atoll learner`): one process, or with NPROC a torchrun island of NPROC
# ranks per node on NNODES nodes (DDP inside the island; its rank 0 talks to the syncer).
# deploy/slurm/island.sbatch and deploy/k8s/island-job.yaml run this script on every node of an
# island, and so does the namespace test (tests/e2e/test_multihost.py); see docs/deploy.md.
#
#   ATOLL_SYNCER       the syncer's address, host:port (required; a sharded syncer: every
#                      shard's, in shard order, comma-separated)
#   ATOLL_SYNCER_FILE  instead of ATOLL_SYNCER: the syncer's RUN_DIR/syncer.addr on storage
#                      shared with it, waited for (the syncer writes it once it listens, a
#                      shard set once every shard does) up to ATOLL_WAIT_S seconds (default 120)
#   ATOLL_ISLAND       this island's index in [0, learners): its data shard, its id L<index>
#                      (required)
#   ATOLL_TLS_CA       the PEM certificate that signed the syncer's (TLS)
#   ATOLL_EVENTS       append this island's events (steps, bytes on the wire) to this file
#   NPROC              processes (GPUs) per node; unset or 1: one process
#   NNODES             nodes of this island; unset or 1: this node alone
#   NODE_RANK          this node's rank in [0, NNODES) (with NNODES > 1)
#   RDZV_ENDPOINT      host:port of the island's torchrun c10d rendezvous (with NNODES > 1)
#   LOCAL_ADDR         this node's address for the island's ranks (with NNODES > 1; default:
#                      what the node's host name resolves to)
#   ATOLL_MAX_RESTARTS with NPROC or NNODES > 1: torchrun restarts the ranks in place, and
#                      `atoll island` restarts torchrun, at most this many times each (default 0:
#                      the island ends with its first failure, for its scheduler to restart)
# and the run's settings (deploy/lib.sh): ATOLL_RUN_ID, ATOLL_SECRET_FILE or ATOLL_SECRET,
# ATOLL_CONFIG, ATOLL_SET, ATOLL, ATOLL_DRY_RUN.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [[ -z "${ATOLL_SYNCER:-}" && -n "${ATOLL_SYNCER_FILE:-}" ]]; then
  wait_s=${ATOLL_WAIT_S:-120}
  positive_int ATOLL_WAIT_S "$wait_s"
  wait_for_file ATOLL_SYNCER_FILE "$ATOLL_SYNCER_FILE" "$wait_s"
  ATOLL_SYNCER=$(<"$ATOLL_SYNCER_FILE")
fi
[[ "${ATOLL_SYNCER:-}" == ?*:[0-9]* ]] || die "ATOLL_SYNCER='${ATOLL_SYNCER:-}' is not allowed: the syncer's address, host:port"
[[ "${ATOLL_ISLAND:-}" =~ ^[0-9]+$ ]] || die "ATOLL_ISLAND='${ATOLL_ISLAND:-}' is not allowed: an integer in [0, learners)"
args=(learner --syncer "$ATOLL_SYNCER" --index "$ATOLL_ISLAND")
common_args
if [[ -n "${ATOLL_TLS_CA:-}" ]]; then
  [[ -r "$ATOLL_TLS_CA" ]] || die "ATOLL_TLS_CA='$ATOLL_TLS_CA' is not allowed: a readable PEM certificate"
  args+=(--tls-ca "$ATOLL_TLS_CA")
fi
if [[ -n "${ATOLL_EVENTS:-}" ]]; then
  args+=(--events "$ATOLL_EVENTS")
fi
nproc=${NPROC:-1}
nnodes=${NNODES:-1}
positive_int NPROC "$nproc"
positive_int NNODES "$nnodes"
if ((nproc > 1 || nnodes > 1)); then
  args+=(--nproc "$nproc")
  if [[ -n "${ATOLL_MAX_RESTARTS:-}" ]]; then
    [[ "$ATOLL_MAX_RESTARTS" =~ ^[0-9]+$ ]] || die "ATOLL_MAX_RESTARTS='$ATOLL_MAX_RESTARTS' is not allowed: an integer >= 0"
    args+=(--max-restarts "$ATOLL_MAX_RESTARTS")
  fi
fi
if ((nnodes > 1)); then
  [[ "${NODE_RANK:-}" =~ ^[0-9]+$ ]] && ((NODE_RANK < nnodes)) ||
    die "NODE_RANK='${NODE_RANK:-}' is not allowed: an integer in [0, NNODES=$nnodes)"
  [[ "${RDZV_ENDPOINT:-}" == ?*:[0-9]* ]] ||
    die "RDZV_ENDPOINT='${RDZV_ENDPOINT:-}' is not allowed: host:port of the island's rendezvous"
  args+=(--nnodes "$nnodes" --node-rank "$NODE_RANK" --rdzv-endpoint "$RDZV_ENDPOINT")
  if [[ -n "${LOCAL_ADDR:-}" ]]; then
    args+=(--local-addr "$LOCAL_ADDR")
  fi
fi
launch
