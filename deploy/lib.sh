# shellcheck shell=bash
# What deploy/syncer.sh and deploy/island.sh share: the one-line error, the settings every atoll
# process of a run takes (run id, secret, settings file, extra settings), and the launch.
# Sourced, not run.
#
#   ATOLL_RUN_ID       the run's id, the same for the syncer and every island (required)
#   ATOLL_SECRET_FILE  a file holding the run's shared secret (at least 8 characters); without
#                      it, atoll reads the secret from ATOLL_SECRET (one of the two is required)
#   ATOLL_CONFIG       a TOML or JSON file of settings: the same file for the syncer and every
#                      island (the model, learners, steps, P, H, ...; README "Commands")
#   ATOLL_SET          more settings, "key=value key=value ..." (they win over the file)
#   ATOLL              the atoll command (default: atoll; e.g. "python -m atoll.cli")
#   ATOLL_DRY_RUN      1: print the atoll arguments, one per line (NUL-separated), and exit

die() {
  echo "$(basename "$0"): $*" >&2
  exit 2
}

# common_args: the run id, the secret file, the settings file and the extra settings, appended
# to the array named `args` of the caller
common_args() {
  [[ -n "${ATOLL_RUN_ID:-}" ]] || die "ATOLL_RUN_ID='' is not allowed: the run's id, the same on the syncer and every island"
  args+=(--run-id "$ATOLL_RUN_ID")
  if [[ -n "${ATOLL_SECRET_FILE:-}" ]]; then
    [[ -r "$ATOLL_SECRET_FILE" ]] || die "ATOLL_SECRET_FILE='$ATOLL_SECRET_FILE' is not allowed: a readable file holding the run's secret"
    args+=(--secret-file "$ATOLL_SECRET_FILE")
  elif [[ -z "${ATOLL_SECRET:-}" ]]; then
    die "no secret: set ATOLL_SECRET_FILE (a file holding the run's secret) or ATOLL_SECRET"
  fi
  if [[ -n "${ATOLL_CONFIG:-}" ]]; then
    [[ -r "$ATOLL_CONFIG" ]] || die "ATOLL_CONFIG='$ATOLL_CONFIG' is not allowed: a readable TOML or JSON file of settings"
    args+=("$ATOLL_CONFIG")
  fi
  local kv kvs
  read -r -a kvs <<<"${ATOLL_SET:-}"
  for kv in "${kvs[@]}"; do
    [[ "$kv" == *=* ]] || die "ATOLL_SET entry '$kv' is not allowed: key=value"
    args+=(--set "$kv")
  done
}

# launch: run atoll with `args` in place of this shell (its signals reach atoll directly), or
# print them (ATOLL_DRY_RUN=1)
launch() {
  if [[ "${ATOLL_DRY_RUN:-0}" == 1 ]]; then
    printf '%s\0' "${args[@]}"
    exit 0
  fi
  # ATOLL may be several words ("python -m atoll.cli"): split on purpose
  # shellcheck disable=SC2086
  exec ${ATOLL:-atoll} "${args[@]}"
}

# wait_for_file NAME PATH SECONDS: until PATH exists (e.g. a syncer's RUN_DIR/syncer.addr, which it
# writes, atomically, once it listens: a shard set once every shard does), else one line naming
# the variable NAME that gave it
wait_for_file() {
  local until=$((SECONDS + $3))
  while [[ ! -s "$2" ]]; do
    ((SECONDS < until)) || die "$1='$2' is not allowed: no syncer wrote it within $3 s (RUN_DIR/syncer.addr of a running syncer, on storage shared with it)"
    sleep 0.2
  done
}

# positive_int NAME VALUE: VALUE is an integer >= 1, else one line naming it
positive_int() {
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1='$2' is not allowed: an integer >= 1"
}
