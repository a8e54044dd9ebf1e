"""`atoll.save_init` (reachable from `import atoll` alone) writes what `atoll syncer --init`
reads: every parameter by name, tied ones once."""

import torch
from safetensors.torch import load_file

import atoll


def test_save_init_writes_every_parameter_once_by_name(tmp_path):
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # a tied head
    atoll.save_init(model, tmp_path / "init.safetensors")
    saved = load_file(str(tmp_path / "init.safetensors"))
    assert set(saved) == {n for n, _ in model.named_parameters()} == {"0.weight"}
    assert torch.equal(saved["0.weight"], model[0].weight.detach())
