"""Run a script (`python checked_collectives.py SCRIPT ARGS...`, under torchrun) with every
collective that atoll's island code makes checked, as NCCL would check it: each tensor it hands
a collective must be on the device the group's backend carries for this rank (gloo: the CPU;
NCCL: the island's GPU, the parameters'), and an object collective must run on that device.
A call that breaks the rule stops the rank with `WrongDevice`; at exit each rank prints how
many calls it checked ("rank R checked N island collectives")."""

from __future__ import annotations

import atexit
import functools
import os
import runpy
import sys

import torch
import torch.distributed as dist

ISLAND_CODE = os.path.join("atoll", "live", "learner", "island.py")
checked = 0


class WrongDevice(AssertionError):
    pass


def _island_of_caller():
    """The `Island` whose code made this call (None: not atoll's island code)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.endswith(ISLAND_CODE):
            me = frame.f_locals.get("self")
            island = getattr(me, "island", me)
            return island if hasattr(island, "device") else None
        frame = frame.f_back
    return None


def _carried(island) -> torch.device:
    backend = str(dist.get_backend(island.group))
    return torch.device("cpu") if "gloo" in backend else island.device


def _check(name: str, fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        global checked
        island = _island_of_caller()
        if island is not None:
            want = _carried(island)
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            for t in tensors:
                if t.device != want:
                    raise WrongDevice(f"{name}: a tensor on {t.device}, the group carries {want}")
            if name.endswith("_object") or name.endswith("_object_list"):
                device = kwargs.get("device")
                if device is not None and torch.device(device) != want:
                    raise WrongDevice(f"{name}: device={device}, the group carries {want}")
                if want.type == "cuda" and torch.cuda.current_device() != want.index:
                    raise WrongDevice(f"{name} on cuda:{torch.cuda.current_device()}, not {want}")
            checked += 1
        return fn(*args, **kwargs)

    return call


for _name in ("broadcast", "all_reduce", "broadcast_object_list", "all_gather_object"):
    setattr(dist, _name, _check(_name, getattr(dist, _name)))


@atexit.register
def _say() -> None:
    print(f"rank {os.environ.get('RANK', '0')} checked {checked} island collectives", flush=True)


if __name__ == "__main__":
    script, *rest = sys.argv[1:]
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")
