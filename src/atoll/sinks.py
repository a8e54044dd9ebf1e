"""Sinks users already have, fed from the one event stream: TensorBoard (`--tensorboard DIR`)
and Weights & Biases (`--wandb PROJECT`). Each is an optional extra (`pip install
'atoll[tensorboard]'`, `'atoll[wandb]'`); a missing one stops the command before anything
starts, with one line saying what to install.

W&B runs offline unless asked otherwise (`--wandb-mode online`, or WANDB_MODE=online): an
offline run is written under the run directory's `wandb/` (or WANDB_DIR) with no network at
all, and `wandb sync` uploads it later. A sink that fails once started is said once, loudly, on
stderr, and dropped: the run goes on without it (`feed`, `close_all`).

A sink takes the run's figures as the live view computes them (atoll.live.view.RunState:
tokens, rounds, learners per round, goodput (metrics.Figures), bytes on the wire and data-parallel's
bytes for the same tokens, each learner's tokens/s), keyed by the run's tokens, and the eval
loss (the summary's; `atoll sim`: every eval point of the run's curve).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn, Protocol

from atoll.errors import ConfigError

WANDB_MODES = ("offline", "online")


def add_arguments(p: argparse.ArgumentParser, keyed: str = "the run's tokens") -> None:
    """--tensorboard, --wandb, --wandb-mode (`atoll run`, `atoll demo`, `atoll sim`)."""
    p.add_argument(
        "--tensorboard",
        metavar="DIR",
        help=f"also write the run's figures there, keyed by {keyed} (needs atoll[tensorboard])",
    )
    p.add_argument(
        "--wandb",
        metavar="PROJECT",
        help="also log them to Weights & Biases, project PROJECT (needs atoll[wandb])",
    )
    p.add_argument(
        "--wandb-mode",
        choices=WANDB_MODES,
        help="offline (the default unless WANDB_MODE says otherwise): no network, the W&B run "
        "is written under the run directory's wandb/ (or WANDB_DIR), `wandb sync` uploads it; "
        "online: logged to the server as the run goes (needs `wandb login`; a server that "
        "does not answer in 60 s stops the command before it starts)",
    )


class Sink(Protocol):
    name: str

    def write(self, tokens: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars(state: Any, now: float) -> dict[str, float]:
    """The run's figures now, by name (a RunState). Bytes on the wire only where measured."""
    wire, dp = state.bytes_ratio()
    out = {
        "run/tokens": float(state.total_tokens()),
        "run/rounds": float(state.rounds),
        "run/data_parallel_mb": dp / 1e6,
    }
    if state.wire:
        out["run/wire_mb"] = wire / 1e6
    if state.participants:
        out["run/learners_per_round"] = sum(state.participants) / len(state.participants)
    g = state.goodput(now)
    if g is not None:
        out["run/goodput"] = g
    for lid, r in state.rows.items():
        out[f"learner/{lid}/tokens_per_s"] = r.tokens_per_s
    return out


def _require(extra: str, flag: str, value: str) -> NoReturn:
    raise ConfigError(
        flag, value, f"the {extra} package: pip install 'atoll[{extra}]' (or pip install {extra})"
    )


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, logdir: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            _require("tensorboard", "--tensorboard", logdir)
        self.writer = SummaryWriter(log_dir=logdir)

    def write(self, tokens: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, global_step=tokens)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def wandb_mode(mode: str | None) -> str:
    """--wandb-mode, else WANDB_MODE, else offline (no network: nothing can hang on one)."""
    name = "--wandb-mode" if mode else "WANDB_MODE"
    mode = mode or os.environ.get("WANDB_MODE") or "offline"
    mode = {"dryrun": "offline"}.get(mode, mode)  # wandb's older name for offline
    if mode not in WANDB_MODES:
        raise ConfigError(name, mode, f"one of {', '.join(WANDB_MODES)} with --wandb")
    return mode


def check_wandb(project: str) -> Any:
    try:
        import wandb
    except ImportError:
        _require("wandb", "--wandb", project)
    return wandb


class WandbSink:
    """One W&B run: its history keyed by tokens (the step), `config` the run's settings."""

    name = "wandb"

    def __init__(
        self,
        project: str,
        run_dir: str,
        mode: str | None = None,
        name: str | None = None,
        group: str | None = None,
        config: dict | None = None,
    ) -> None:
        wandb = check_wandb(project)
        self.mode = wandb_mode(mode)
        root = os.environ.get("WANDB_DIR") or run_dir
        os.makedirs(root, exist_ok=True)
        settings = wandb.Settings(
            mode=self.mode,
            console="off",  # the run's own console (live table, lines) stays as it is
            silent=True,  # one line of ours at the end instead of wandb's banners
            x_disable_stats=True,  # no system metrics sampled: the run's figures only
            disable_git=True,
            save_code=False,
            init_timeout=60.0,  # online: a server that does not answer stops us here
        )
        try:
            self.run = wandb.init(
                project=project, dir=root, name=name, group=group, config=config,
                settings=settings, reinit="create_new",
            )  # fmt: skip
        except Exception as exc:  # before the run starts: one line, nothing started
            why = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ConfigError(
                "--wandb", project, f"a project whose W&B run starts in {self.mode} mode "
                f"({type(exc).__name__}: {why}); --wandb-mode offline needs no network or login",
            ) from None  # fmt: skip

    def write(self, tokens: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=tokens)

    def close(self) -> None:
        where = self.run.dir if self.run.dir else ""
        self.run.finish()
        if self.mode == "offline":
            run_dir = os.path.dirname(where.rstrip("/"))
            print(f"W&B: offline run in {run_dir} (upload it with: wandb sync {run_dir})",
                  file=sys.stderr, flush=True)  # fmt: skip


def check(tensorboard: str | None, wandb: str | None, mode: str | None = None) -> None:
    """The packages and settings the sinks asked for are there (else ConfigError), before any
    compute: `atoll sim` opens its sinks only once each run is done."""
    if tensorboard:
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError:
            _require("tensorboard", "--tensorboard", tensorboard)
    if wandb:
        check_wandb(wandb)
        wandb_mode(mode)


def open_sinks(
    tensorboard: str | None,
    wandb: str | None,
    run_dir: str,
    mode: str | None = None,
    name: str | None = None,
    group: str | None = None,
    config: dict | None = None,
) -> list[Sink]:
    """The sinks asked for (a missing package, a W&B run that cannot start: ConfigError)."""
    check(tensorboard, wandb, mode)
    out: list[Sink] = []
    if tensorboard:
        out.append(TensorBoardSink(tensorboard))
    if wandb:
        try:
            out.append(WandbSink(wandb, run_dir, mode, name, group, config))
        except ConfigError:
            close_all(out)
            raise
    return out


def _failed(sink: Sink, exc: BaseException) -> None:
    print(f"atoll: the {sink.name} sink failed ({type(exc).__name__}: {exc}); the run goes on "
          f"without it", file=sys.stderr, flush=True)  # fmt: skip


def feed(sinks: list[Sink], tokens: int, values: dict[str, float]) -> None:
    """Write `values` at `tokens` to every sink; one that fails is said once and removed."""
    for sink in list(sinks):
        try:
            sink.write(tokens, values)
        except Exception as exc:
            _failed(sink, exc)
            sinks.remove(sink)


def close_all(sinks: list[Sink]) -> None:
    for sink in list(sinks):
        try:
            sink.close()
        except Exception as exc:
            _failed(sink, exc)
    sinks.clear()
