"""`atoll report RUN_DIR`: one self-contained HTML file (plots inlined as PNG) for a live run
directory or `atoll sim` output. `write_report` is what `atoll demo` and `atoll sim` call."""

from __future__ import annotations

import base64
import html
from pathlib import Path

from atoll.report import plots
from atoll.report.data import RunData, read_run

# (title, what it needs when absent) for the plots drawn from a run's event stream
STREAM_PLOTS = {
    "goodput over time": (plots.goodput, "no accepted contributions in this stream"),
    "participation": (plots.participation, "no merged rounds in this stream"),
    "bytes per round, each way": (plots.round_bytes, "no merged rounds in this stream"),
    "staleness": (plots.staleness, "no merged rounds in this stream"),
    "failures and rejoins": (plots.timeline, "no joins, failures or rejoins in this stream"),
}


def _section(title: str, png: bytes | None, absent: str) -> str:
    head = f"<h3>{html.escape(title)}</h3>"
    if png is None:
        return head + f'<p class="absent">Not in this run: {html.escape(absent)}.</p>'
    b64 = base64.b64encode(png).decode()
    return head + f'<img alt="{html.escape(title)}" src="data:image/png;base64,{b64}">'


def render(run: RunData) -> str:
    rows = "".join(
        f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
        for k, v in run.header.items()
    )
    methods = {c.name for c in run.curves}
    missing = [
        m for m in ("data_parallel", "sync_diloco") if run.kind == "sim" and m not in methods
    ]
    note = (
        f"<p class='absent'>No {' or '.join(missing)} run in this directory to compare.</p>"
        if missing
        else ""
    )
    if run.kind == "live" and run.curves:
        note += (
            "<p class='absent'>The global model as the syncer evaluated it while the run went "
            "(at fractions of the token budget), then the final model (and the virtual-time "
            "driver's, with --compare-sim, against tokens).</p>"
        )
    no_loss = (
        "no held-out loss recorded (a live run's syncer evaluates the built-in model, or a "
        "custom one given --eval-from, unless eval=false)"
    )
    parts = [
        "<h2>Held-out loss</h2>",
        note,
        _section("eval loss against tokens", plots.loss_vs_tokens(run.curves), no_loss),
        _section("eval loss against wall time", plots.loss_vs_time(run.curves), no_loss),
    ]
    if not run.streams:
        parts.append("<p class='absent'>No event stream in this directory.</p>")
    for name, events in run.streams.items():
        parts.append(f"<h2>Event stream: {html.escape(name)} ({len(events)} events)</h2>")
        for title, (fn, absent) in STREAM_PLOTS.items():
            png = plots.goodput(events, run.learners) if fn is plots.goodput else fn(events)
            parts.append(_section(title, png, absent))
    title = f"atoll report: {run.run_dir}"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;max-width:980px;margin:2em auto}"
        "th{text-align:left;padding-right:1em}.absent{color:#777;font-style:italic}"
        "img{max-width:100%}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><table>{rows}</table>" + "".join(parts) + "</body></html>"
    )


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Read `run_dir`, write the HTML (default RUN_DIR/report.html), return its path."""
    run = read_run(run_dir)
    path = Path(out) if out else Path(run_dir) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(run))
    return path


def try_report(run_dir: str | Path) -> None:
    """For commands that end by writing the report: print its path, or one warning line (a
    report that fails never fails the run)."""
    try:
        print(f"report: {write_report(run_dir)}", flush=True)
    except Exception as exc:  # noqa: BLE001  the run itself succeeded
        print(f"atoll: warning: the report of {run_dir} was not written: {exc}", flush=True)
