"""W&B's mode for `--wandb`: offline unless asked otherwise (no network to hang on), the flag
before WANDB_MODE; a mode W&B sinks cannot use stops with the name of where it came from."""

import pytest

from atoll.errors import ConfigError
from atoll.sinks import wandb_mode


def test_wandb_is_offline_unless_asked_otherwise(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    assert wandb_mode(None) == "offline"
    monkeypatch.setenv("WANDB_MODE", "online")
    assert wandb_mode(None) == "online"
    assert wandb_mode("offline") == "offline"  # the flag before the environment
    monkeypatch.setenv("WANDB_MODE", "dryrun")  # wandb's older name for offline
    assert wandb_mode(None) == "offline"


def test_a_mode_wandb_sinks_cannot_use_names_its_source(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "disabled")
    with pytest.raises(ConfigError, match="WANDB_MODE='disabled' is not allowed: one of offline"):
        wandb_mode(None)
    with pytest.raises(ConfigError, match="--wandb-mode='shared'"):
        wandb_mode("shared")
