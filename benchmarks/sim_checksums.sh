#!/usr/bin/env bash
# Do two revisions write the same `atoll sim` results? Runs every preset (or those named) with
# the code of REV (a git worktree, through PYTHONPATH) and with this tree, and prints the
# sha256 of each results JSON and of each event stream, the latter also without the lines of
# event kinds named in IGNORE_KINDS (comma separated; e.g. kinds one side added).
# Usage: benchmarks/sim_checksums.sh REV [preset ...]   (default: quick compare hetero failures)
# Writes benchmarks/results/sim_checksums.json. About 25 minutes for all four on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
rev=$1; shift
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(quick compare hetero failures)
work=$(mktemp -d)
git worktree add --detach "$work/rev" "$rev" >/dev/null
trap 'git worktree remove --force "$work/rev" >/dev/null 2>&1 || true' EXIT
run() {  # run SRC OUT PRESET
  PYTHONPATH="$1" .venv/bin/python -c "import sys; from atoll.cli import main; sys.exit(main())" \
    sim --preset "$3" --json "$2/$3.json" --out "$2/dir-$3" --no-plot --quiet
}
for p in "${presets[@]}"; do
  echo "[sim_checksums] $p: $rev" >&2
  run "$work/rev/src" "$work/old" "$p"
  echo "[sim_checksums] $p: this tree" >&2
  run "$PWD/src" "$work/new" "$p"
done
IGNORE_KINDS=${IGNORE_KINDS:-} .venv/bin/python - "$work" "$rev" "${presets[@]}" <<'EOF'
import hashlib, json, os, sys
from pathlib import Path
work, rev, presets = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
ignore = {k for k in os.environ.get("IGNORE_KINDS", "").split(",") if k}
sha = lambda b: hashlib.sha256(b).hexdigest()
def stream(path: Path, drop: bool) -> str:
    lines = path.read_text().splitlines(keepends=True)
    if drop:
        lines = [x for x in lines if json.loads(x)["kind"] not in ignore]
    return sha("".join(lines).encode())
out = {"rev": rev, "ignored_kinds": sorted(ignore), "presets": {}}
for p in presets:
    old, new = work / "old" / f"{p}.json", work / "new" / f"{p}.json"
    row = {"json": {"rev": sha(old.read_bytes()), "tree": sha(new.read_bytes())}, "events": {}}
    row["json_identical"] = row["json"]["rev"] == row["json"]["tree"]
    for f in sorted((work / "old" / f"dir-{p}").glob("*.jsonl")):
        g = work / "new" / f"dir-{p}" / f.name
        row["events"][f.name] = {
            "rev": stream(f, False), "tree": stream(g, False),
            "identical_without_ignored": stream(f, True) == stream(g, True),
        }
    out["presets"][p] = row
    print(f"{p:9s} json {row['json']['tree'][:16]} {'identical' if row['json_identical'] else 'DIFFERENT'}"
          + "".join(f"; {n}: {'same' if e['identical_without_ignored'] else 'DIFF'}"
                    for n, e in row["events"].items()))
Path("benchmarks/results/sim_checksums.json").write_text(json.dumps(out, indent=1))
EOF
