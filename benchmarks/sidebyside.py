"""A training loop with and without `atoll.Learner`, side by side in one process: the parts
that `learner_overhead.py` (the built-in model) and `scale.py` (models of 1M to 100M
parameters) share.

Method (this machine is shared and noisy; step times drift by tens of percent over seconds):
- Both loops train the *same* model, optimizer and data stream; a block "without atoll" is a
  block whose steps are not reported to the learner. Two separately allocated models can
  differ in speed by a few percent from memory layout alone.
- Blocks alternate (plain, atoll), in alternating order (`alternate`). Each block pair gives a
  ratio of median step times, taken seconds apart; the overhead is the median of those ratios
  minus 1 (the ratio of the medians over all steps is reported too: `overheads`).
- A syncer runs as a separate process on loopback (`start_syncer`), at nice 19 (and on the
  cores given): it stands for a remote host and should not take the measured loop's cores.
"""

from __future__ import annotations

import os
import platform
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch


def start_syncer(
    run_dir: Path,
    run_id: str,
    secret: str,
    sets: Iterable[str],
    init: Path | None = None,
    cpus: set[int] | None = None,
    timeout_s: float = 600.0,
) -> tuple[subprocess.Popen, str]:
    """`atoll syncer` in a process of its own (nice 19, on `cpus` when given), ready: (the
    process, its address). `init`: a safetensors file of the model's parameters
    (`atoll.save_init`); None: the built-in model of the settings."""
    from atoll.live.client import syncer_address, wait_ready

    cmd = [sys.executable, "-m", "atoll.cli", "syncer", "--run-dir", str(run_dir),
           "--run-id", run_id, "--no-budget"]  # fmt: skip
    for s in sets:
        cmd += ["--set", s]
    if init is not None:
        cmd += ["--init", str(init)]

    def child_setup() -> None:
        os.nice(19)
        if cpus:
            os.sched_setaffinity(0, cpus)

    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "ATOLL_SECRET": secret},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        preexec_fn=child_setup,
    )
    try:
        addr = syncer_address(run_dir, timeout_s, alive=lambda: proc.poll() is None)
        if addr is None:
            if proc.poll() is not None:
                raise RuntimeError(f"syncer exited ({proc.returncode}); run dir {run_dir}")
            raise TimeoutError(f"syncer not listening after {timeout_s:.0f} s")
        wait_ready(addr, run_id, secret)
    except BaseException:
        stop_syncer(proc)
        raise
    return proc, addr


def stop_syncer(proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


Blocks = list[list[Any]]


def alternate(
    blocks: int,
    steps: int,
    plain_step: Callable[[], Any],
    atoll_step: Callable[[], Any],
    progress: Callable[[int, list, list], None] | None = None,
) -> tuple[Blocks, Blocks]:
    """`blocks` block pairs of `steps` steps each, plain and atoll, the order swapped every
    pair (plain first in even pairs): what each step returned (its time), per block, per
    side. `progress(pair, plain_block, atoll_block)` after each pair."""
    plain: Blocks = []
    with_atoll: Blocks = []
    for b in range(blocks):
        order = [(plain, plain_step), (with_atoll, atoll_step)]
        for sink, fn in order if b % 2 == 0 else order[::-1]:
            sink.append([fn() for _ in range(steps)])
        if progress is not None:
            progress(b, plain[-1], with_atoll[-1])
    return plain, with_atoll


def overheads(plain: Blocks, with_atoll: Blocks) -> dict:
    """The overhead of the atoll side: the median over block pairs of (atoll / plain median
    step time) - 1, and the ratio of the medians over all steps - 1; the medians (ms)."""
    ratios = [
        statistics.median(a) / statistics.median(p) for p, a in zip(plain, with_atoll, strict=True)
    ]
    all_p = [x for blk in plain for x in blk]
    all_a = [x for blk in with_atoll for x in blk]
    return {
        "overhead_paired_median": statistics.median(ratios) - 1,
        "overhead_of_medians": statistics.median(all_a) / statistics.median(all_p) - 1,
        "block_ratios": ratios,
        "median_step_plain_ms": 1e3 * statistics.median(all_p),
        "median_step_atoll_ms": 1e3 * statistics.median(all_a),
    }


def peak_rss_bytes(pid: int | str = "self") -> int:
    """The peak resident set of a process (VmHWM: anonymous, file and shared pages), bytes;
    0 when it cannot be read (gone, or not Linux)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return 1024 * int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int | str = "self") -> float:
    """User + system CPU time of a process (all its threads) so far; 0 when unreadable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine(threads: int) -> dict:
    return {"cpu_count": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": threads}  # fmt: skip


def finish_plot(fig, ax, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    """The +3% target line, labels and legend; save the figure to `path`."""
    import matplotlib.pyplot as plt

    ax.axhline(3, color="r", ls="--", lw=1, label="target +3%")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
