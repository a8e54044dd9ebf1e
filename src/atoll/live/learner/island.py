"""Learner islands: one learner that is a torch.distributed job (torchrun; DDP or FSDP2 inside).

    torchrun --nproc-per-node 2 train.py      # in train.py, on every rank:
        dist.init_process_group("gloo")       # (NCCL on GPUs)
        ddp = DistributedDataParallel(model)
        learner = atoll.Learner(model, opt, "host:7070", atoll.LearnerOptions(learner_id="site-a"))
        for batch in data:                    # each rank its own batches
            ...; learner.step(tokens=batch_tokens)
            if learner.should_stop: break
        learner.finish()

`atoll.Learner` on a rank of an initialised process group of 2 or more ranks (`group=`, or the
default group) is one of the island's roles:

- rank 0 of the group, the *talking rank*, is an ordinary `Learner` (one comm side, one syncer
  connection, one learner id) with an `Island`: its parameter reads and writes go through
  `IslandFragments`, and each of its steps sums the island's tokens and ends with `END`;
- every other rank is an `IslandMember`: it holds no protocol and no connection, and at each
  step boundary does what the talking rank tells it.

What crosses the group, per step: one all-reduce of the step's tokens (the island's token
count covers every rank; ranks of unequal batches are counted as they are), then commands
broadcast by the talking rank until `END` (which carries the stop flag, so every rank stops at
the same step). A command is three integers: `SCATTER p` (a global fragment was written: the
talking rank broadcasts its flat buffer, each rank writes it into its parameters; for FSDP2's
sharded parameters, `distribute_tensor` hands each rank its shard), `GATHER p` (the protocol
reads fragment p, and it holds sharded parameters: every rank joins `full_tensor()`), `PLAN`
(the fragment layout, once, after the first Welcome), `ABORT` (the talking rank failed: every
rank raises). Replicated parameters (DDP) are equal on every rank after each optimizer step,
so reading them needs no command: the talking rank reads its own.

A rank that dies takes the island down: the next collective fails on every other rank, each
process exits, and torchrun's restart in place (`--max-restarts`, with a store per rendezvous
round: `TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, which `atoll island` sets) or `atoll island`
(torchrun itself, atoll.live.island_cli) starts the island again; it rejoins as one learner,
as any failed learner does (a new incarnation of the same learner id, healed from the
syncer).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from atoll.core.fragments import FlatFragments, FragmentPlan
from atoll.errors import ConfigError
from atoll.live.learner.devices import island_device

PLAN, GATHER, SCATTER, END, ABORT = 1, 2, 3, 4, 5


class IslandError(RuntimeError):
    """The island cannot go on (its talking rank failed); every rank raises it."""


def is_sharded(t: torch.Tensor) -> bool:
    """A DTensor (FSDP2's parameters): each rank holds a shard of it. None exists before
    torch.distributed.tensor is imported: a learner without one does not pay that import (a
    second or more before its first Hello)."""
    dtensor = sys.modules.get("torch.distributed.tensor")
    return dtensor is not None and isinstance(t, dtensor.DTensor)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The model under a DistributedDataParallel wrapper (the syncer knows the model's own
    parameter names, not `module.`-prefixed ones)."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def island_group(group: Any = None) -> Any:
    """The process group of the island this process is a rank of, or None (one process).

    `group` given: that group. Otherwise the default group when torch.distributed is
    initialised. Under torchrun (WORLD_SIZE > 1 in the environment) without an initialised
    group, the ranks would each train alone: that stops here."""
    if group is None:
        if dist.is_available() and dist.is_initialized():
            group = dist.group.WORLD
        elif int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise ConfigError(
                "WORLD_SIZE",
                os.environ["WORLD_SIZE"],
                "torch.distributed initialised before atoll.Learner (init_process_group, "
                "with DDP or FSDP2 over the ranks), or group= given",
            )
        else:
            return None
    return group if dist.get_world_size(group) > 1 else None


def is_member(group: Any = None) -> bool:
    """Whether this process is a rank of an island other than its talking rank."""
    g = island_group(group)
    return g is not None and dist.get_rank(g) != 0


class Island:
    """The island's process group, as the learner roles use it."""

    def __init__(self, group: Any, params: Mapping[str, torch.Tensor]) -> None:
        """`group`: a process group of 2 or more ranks (what `island_group` found); `params`:
        this rank's parameters (their device is the island's: `island_device`)."""
        self.group = group
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self.leader = dist.get_global_rank(self.group, 0)
        self.device = island_device(str(dist.get_backend(self.group)), params.values())
        self._cmd = torch.zeros(3, dtype=torch.int64, device=self.device)

    @classmethod
    def of(cls, params: Mapping[str, torch.Tensor], group: Any = None) -> Island | None:
        """The island of `group`, or of the initialised default group; None for one process."""
        g = island_group(group)
        return None if g is None else cls(g, params)

    def _device_scope(self) -> contextlib.AbstractContextManager:
        """Object collectives pick `torch.cuda.current_device()` for NCCL: the island's
        device for the duration of the call."""
        if self.device.type == "cuda":
            return torch.cuda.device(self.device)
        return contextlib.nullcontext()

    def send(self, cmd: int, p: int = 0, *, arg: int = 0) -> None:
        """A command from the talking rank to every other rank."""
        self._cmd[0], self._cmd[1], self._cmd[2] = cmd, p, arg
        dist.broadcast(self._cmd, self.leader, group=self.group)

    def receive(self) -> tuple[int, int, int]:
        dist.broadcast(self._cmd, self.leader, group=self.group)
        cmd, p, arg = self._cmd.tolist()
        return cmd, p, arg

    def broadcast(self, t: torch.Tensor) -> None:
        dist.broadcast(t, self.leader, group=self.group)

    def broadcast_object(self, obj: Any = None) -> Any:
        box = [obj]
        with self._device_scope():
            dist.broadcast_object_list(box, self.leader, group=self.group, device=self.device)
        return box[0]

    def total(self, n: int) -> int:
        """The sum over the island's ranks of `n` (this step's tokens)."""
        t = torch.tensor([n], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, group=self.group)
        return int(t.item())

    def fragments(self, plan: FragmentPlan, params: Mapping[str, torch.Tensor]) -> IslandFragments:
        """The talking rank's store for `plan` (the other ranks get the plan: PLAN)."""
        self.send(PLAN)
        self.broadcast_object(plan)
        return IslandFragments(plan, params, self)

    def check_same(self, params: Mapping[str, torch.Tensor]) -> None:
        """Every rank's parameters have the talking rank's names and shapes (a rank that
        built another model stops the island here, before it joins)."""
        mine = [(n, tuple(p.shape)) for n, p in params.items()]
        every: list[Any] = [None] * self.size
        with self._device_scope():
            dist.all_gather_object(every, mine, group=self.group)
        first = dict(every[0])
        for r, theirs in enumerate(every):
            d = dict(theirs)
            if d == first:
                continue
            diff = sorted(set(d) ^ set(first)) or [n for n in first if d[n] != first[n]]
            n = diff[0]
            raise ConfigError(
                "island",
                f"rank {r} has {n}: {d.get(n, 'no such parameter')}",
                f"rank 0's {n}: {first.get(n, 'no such parameter')} (every rank the same "
                "parameter names and shapes)",
            )


class IslandFragments:
    """Fragment values on a rank of an island: the `flatten`/`assign` of `FlatFragments`
    (what `LearnerProtocol` calls on the talking rank), made collective. On the talking rank
    a write, or a read of sharded parameters, first tells the other ranks (`Island.send`);
    every rank then makes the same collective calls (`gather`, `scatter`)."""

    def __init__(
        self, plan: FragmentPlan, params: Mapping[str, torch.Tensor], island: Island
    ) -> None:
        self.plan = plan
        self.params = params
        self.island = island
        self.local = FlatFragments(plan, params)  # replicated parameters: one buffer each
        self.sharded = [any(is_sharded(params[n]) for n in f.names) for f in plan.fragments]

    # -- the talking rank (the protocol's calls) ---------------------------------------------
    def flatten(self, p: int, copy: bool = True) -> torch.Tensor:
        if not self.sharded[p]:
            return self.local.flatten(p, copy)  # equal on every rank: read it here
        self.island.send(GATHER, p)
        whole = self.gather(p)
        assert whole is not None
        return whole

    def assign(self, p: int, flat: torch.Tensor) -> None:
        self.island.send(SCATTER, p)
        self.scatter(p, flat)

    def device(self, p: int) -> torch.device:
        """Where the protocol keeps fragment p's values: a sharded fragment's whole fp32
        values (base, latest) in host memory, never on the GPU that holds only a shard of
        it (the models FSDP2 is for would not fit twice); others by their parameters."""
        return torch.device("cpu") if self.sharded[p] else self.local.device(p)

    # -- every rank, in the same order ----------------------------------------------------------
    def gather(self, p: int, keep: bool = True) -> torch.Tensor | None:
        """Fragment p, whole, in (pinned, when the shards are on a GPU) host memory: each
        sharded parameter's `full_tensor` (a collective) is made and copied out one at a time,
        so a GPU holds at most one whole parameter besides its shards. `keep=False` (the
        other ranks): only the collectives, nothing kept."""
        f = self.plan.fragments[p]
        pin = keep and self.params[f.names[0]].device.type == "cuda"
        out = torch.empty(f.numel if keep else 0, dtype=torch.float32, pin_memory=pin)
        off = 0
        for n, k in zip(f.names, f.numels, strict=True):
            t = self.params[n].detach()
            whole = t.full_tensor() if is_sharded(t) else t
            if keep:
                out[off : off + k].copy_(whole.reshape(-1))
            del whole
            off += k
        return out if keep else None

    def scatter(self, p: int, flat: torch.Tensor | None = None) -> None:
        """Write fragment p on every rank: `flat` (the talking rank's value) is broadcast, or
        for sharded parameters distributed shard by shard (`flat` is None on other ranks,
        which receive each parameter into a buffer on their own device)."""
        if not self.sharded[p]:
            self._broadcast_replicated(p, flat)
            return
        from torch.distributed.tensor import distribute_tensor

        f = self.plan.fragments[p]
        values = self.plan.split(p, flat) if flat is not None else [None] * len(f.names)
        with torch.no_grad():
            for name, shape, v in zip(f.names, f.shapes, values, strict=True):
                param = self.params[name]
                if not is_sharded(param):
                    dst = param.detach()
                    if v is not None:
                        dst.copy_(v)
                    self.island.broadcast(dst)
                    continue
                local = param.to_local()
                if v is not None:  # one whole parameter on the device at a time
                    full = v.to(local.device, local.dtype, non_blocking=True)
                else:
                    full = torch.empty(shape, dtype=local.dtype, device=local.device)
                shard = distribute_tensor(full, param.device_mesh, param.placements)
                local.copy_(shard.to_local())
                del full, shard

    def _broadcast_replicated(self, p: int, flat: torch.Tensor | None) -> None:
        buf = self.local.flatten(p, copy=False)
        live = self.local.holds(p)
        if flat is not None:
            if live:
                buf.copy_(flat)
            else:
                buf = flat.to(buf.device, torch.float32).contiguous()
                self.local.assign(p, buf)
        self.island.broadcast(buf)
        if flat is None and not live:
            self.local.assign(p, buf)


class Leading:
    """On the talking rank, around its protocol's work: the other ranks go on when it is done
    (END, with the stop flag `stop()` says), or fail with it (ABORT, before it is raised).
    With no island it does nothing."""

    def __init__(self, island: Island | None, stop: Callable[[], bool] = lambda: False) -> None:
        self.island = island
        self.stop = stop

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        if self.island is None:
            return
        if kind is None:
            self.island.send(END, arg=int(self.stop()))
            return
        try:
            self.island.send(ABORT)
        except Exception:  # noqa: BLE001 - the group itself may be what failed
            pass


class IslandMember:
    """A rank of an island other than rank 0: it trains, and at each step boundary does what
    the talking rank says (see the module notes). Same calls as `Learner`."""

    def __init__(
        self,
        model: torch.nn.Module,
        inner_optimizer: Any = None,
        syncer: str | None = None,
        options: Any = None,
        *,
        group: Any = None,
    ) -> None:
        self.model = unwrap(model)
        self.params = dict(self.model.named_parameters())
        island = Island.of(self.params, group)
        if island is None:
            raise ConfigError("group", group, "a process group of 2 or more ranks")
        self.island = island
        self.optimizer = inner_optimizer
        self.id = options.learner_id if options is not None else None
        self.island.check_same(self.params)
        self.fragments: IslandFragments | None = None
        self.steps_done = 0
        self.tokens_done = 0  # this rank's
        self._stop = False
        self._serve()  # the first heal

    def _serve(self) -> None:
        """Do the talking rank's commands until its END."""
        while True:
            cmd, p, arg = self.island.receive()
            if cmd == END:
                self._stop = self._stop or bool(arg)
                return
            if cmd == PLAN:
                plan = self.island.broadcast_object()
                self.fragments = IslandFragments(plan, self.params, self.island)
            elif cmd == ABORT:
                raise IslandError("the island's talking rank (rank 0) failed: see its log")
            elif self.fragments is None:
                raise IslandError(f"command {cmd} before the fragment plan")
            elif cmd == GATHER:
                self.fragments.gather(p, keep=False)
            elif cmd == SCATTER:
                self.fragments.scatter(p)
            else:
                raise IslandError(f"unknown island command {cmd}")

    @property
    def should_stop(self) -> bool:
        return self._stop

    def step(self, tokens: int) -> None:
        self.island.total(tokens)
        self.steps_done += 1
        self.tokens_done += tokens
        self._serve()

    def finish(self, timeout: float = 10.0, away_s: float = 60.0) -> None:
        self._serve()

    def close(self) -> None:
        pass

    def __enter__(self) -> IslandMember:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
