"""Devices by the user's model, not by defaults: an island's tensors go to the device of its
parameters (or LOCAL_RANK's GPU), as its backend carries them; the built-in learner trains on
cuda:LOCAL_RANK when the host has a GPU per rank; NCCL with CPU parameters stops in one line.

No GPU here: the rules are pure functions of the backend, the parameters' devices and the
host's GPU count, checked with torch.device values (a `cuda:1` device needs no GPU to name)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from atoll.cli import main
from atoll.config import LiveConfig
from atoll.errors import ConfigError
from atoll.live.learner.devices import backend_for, island_device, learner_device


def on(*devices: str) -> list:
    """Stand-ins for parameters: island_device reads only their `.device`."""
    return [SimpleNamespace(device=torch.device(d)) for d in devices]


def test_an_nccl_island_talks_on_the_parameters_gpu_not_the_current_one():
    """A user script that moved its model with .to(f"cuda:{local_rank}") and never called
    set_device: the current device is cuda:0 on every rank, the island's is the model's."""
    assert island_device("nccl", on("cuda:1", "cuda:1")) == torch.device("cuda", 1)
    assert island_device("nccl", on("cuda:3")) == torch.device("cuda", 3)


def test_an_island_on_gloo_or_a_mixed_group_talks_on_the_cpu():
    assert island_device("gloo", on("cpu")) == torch.device("cpu")
    assert island_device("gloo", on("cuda:1")) == torch.device("cpu")  # gloo carries CPU
    assert island_device("cpu:gloo,cuda:nccl", on("cuda:1")) == torch.device("cpu")


def test_a_model_without_parameters_talks_on_its_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "2")
    assert island_device("nccl", []) == torch.device("cuda", 2)
    assert island_device("nccl", [], local_rank=5) == torch.device("cuda", 5)


def test_nccl_with_cpu_parameters_stops_in_one_line_naming_both():
    with pytest.raises(ConfigError) as e:
        island_device("nccl", on("cuda:0", "cpu"))
    msg = str(e.value)
    assert "\n" not in msg
    assert "nccl with parameters on cpu" in msg and "gloo" in msg, msg


def test_a_rank_whose_parameters_span_gpus_is_refused():
    with pytest.raises(ConfigError, match="one GPU per rank"):
        island_device("nccl", on("cuda:0", "cuda:1"))


def test_the_built_in_learner_runs_on_cuda_local_rank_when_cuda_is_there():
    assert learner_device("auto", 1, ranks=2, gpus=2) == torch.device("cuda", 1)
    assert learner_device("cuda", 0, gpus=1) == torch.device("cuda", 0)
    assert learner_device("auto", 0, gpus=0) == torch.device("cpu")
    assert learner_device("cpu", 1, ranks=2, gpus=2) == torch.device("cpu")  # asked for
    # the backend follows the device: NCCL is never picked for a model left on the CPU
    assert backend_for(learner_device("auto", 0, gpus=0)) == "gloo"
    assert backend_for(learner_device("auto", 0, gpus=1)) == "nccl"


def test_an_island_of_more_ranks_than_gpus_stops_in_one_line():
    with pytest.raises(ConfigError, match=r"island ranks on this host=4 is not allowed: at "
                       r"most the host's 2 GPU\(s\)"):  # fmt: skip
        learner_device("auto", 0, ranks=4, gpus=2)
    with pytest.raises(ConfigError, match="device='cuda' is not allowed: auto or cpu"):
        learner_device("cuda", 0, gpus=0)
    with pytest.raises(ConfigError, match="device='tpu' is not allowed: one of auto, cpu, cuda"):
        learner_device("tpu", 0)
    with pytest.raises(ConfigError, match="device='gpu' is not allowed"):
        LiveConfig(device="gpu").validate()


def test_a_host_with_fewer_gpus_than_island_ranks_stops_before_anything_starts(tmp_path, capsys):
    """`atoll learner --nproc 2 --set device=cuda` on this GPU-less host: one line, exit 2,
    before torchrun is started (nothing listens at the syncer address either)."""
    rc = main(["learner", "--syncer", "127.0.0.1:9", "--nproc", "2", "--set", "device=cuda",
               "--secret-file", str(tmp_path / "none")])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "device='cuda' is not allowed: auto or cpu" in err[0], err
