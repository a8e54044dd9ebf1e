"""Sinks users already have, fed from the one event stream: TensorBoard (`--tensorboard DIR`)
and Weights & Biases (`--wandb PROJECT`; `WANDB_MODE=offline` works with no network). Each is
an optional package; a missing one stops at the start with one line saying what to install.

A sink takes the run's figures as the live view computes them (atoll.live.view.RunState:
tokens, rounds, learners per round, goodput so far, bytes on the wire and data-parallel's
bytes for the same tokens, each learner's tokens/s), keyed by the run's tokens, and the final
eval loss from the summary.
"""

from __future__ import annotations

from typing import Any, Protocol

from atoll.errors import ConfigError


class Sink(Protocol):
    def write(self, tokens: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


def scalars(state: Any, now: float) -> dict[str, float]:
    """The run's figures now, by name (a RunState)."""
    wire, dp = state.bytes_ratio()
    out = {
        "run/tokens": float(state.total_tokens()),
        "run/rounds": float(state.rounds),
        "run/wire_mb": wire / 1e6,
        "run/data_parallel_mb": dp / 1e6,
    }
    if state.participants:
        out["run/learners_per_round"] = sum(state.participants) / len(state.participants)
    g = state.goodput(now)
    if g is not None:
        out["run/goodput"] = g
    for lid, r in state.rows.items():
        out[f"learner/{lid}/tokens_per_s"] = r.tokens_per_s
    return out


class TensorBoardSink:
    def __init__(self, logdir: str) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError(
                "tensorboard", logdir, "a run with the tensorboard package: pip install tensorboard"
            ) from None
        self.writer = SummaryWriter(log_dir=logdir)

    def write(self, tokens: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, global_step=tokens)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    def __init__(self, project: str, run_dir: str) -> None:
        try:
            import wandb
        except ImportError:
            raise ConfigError(
                "wandb", project, "a run with the wandb package: pip install wandb"
            ) from None
        self.wandb = wandb
        self.run = wandb.init(project=project, dir=run_dir)

    def write(self, tokens: int, scalars: dict[str, float]) -> None:
        self.wandb.log(scalars, step=tokens)

    def close(self) -> None:
        self.run.finish()


def open_sinks(tensorboard: str | None, wandb: str | None, run_dir: str) -> list[Sink]:
    """The sinks asked for (a missing package: ConfigError, before the run starts)."""
    out: list[Sink] = []
    if tensorboard:
        out.append(TensorBoardSink(tensorboard))
    if wandb:
        out.append(WandbSink(wandb, run_dir))
    return out
