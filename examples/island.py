"""One learner that is an island of ranks: torchrun, DDP or FSDP2 inside, rank 0 talks to atoll.

    atoll syncer --run-dir runs/island --set learners=1          # the built-in model's syncer
    torchrun --standalone --nproc-per-node 2 examples/island.py --syncer 127.0.0.1:PORT
    torchrun --standalone --nproc-per-node 2 examples/island.py --syncer ... --fsdp
    atoll island -- torchrun --standalone --nproc-per-node 2 --max-restarts 3 examples/island.py ...

Every rank runs this script the same way: it joins the process group (gloo on CPU, NCCL on
GPUs), builds the model, wraps it (DistributedDataParallel, or FSDP2's `fully_shard` per block
and on the whole model with --fsdp), and makes an `atoll.Learner`; rank 0 talks to the syncer,
the others follow it (atoll.live.learner.island). Each rank draws its own batches; the island's
step counts every rank's tokens. The secret comes from ATOLL_SECRET or --secret-file.

The model starts from another seed than the syncer's: the first heal must overwrite every
parameter on every rank, and the script checks that it did (`--check-heal`), with the syncer's
built-in initial model (the settings' seed).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist

import atoll
import atoll.core.codec
from atoll.config import SimConfig
from atoll.model.recipe import load_corpus, new_model
from atoll.model.train import DataStream


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter whole, on every rank (FSDP2's shards gathered)."""
    out = {}
    for n, p in model.named_parameters():
        t = p.detach()
        out[n] = (t.full_tensor() if hasattr(t, "full_tensor") else t).cpu().clone()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--syncer", default="127.0.0.1:7070", help="the syncer's host:port")
    p.add_argument("--learner-id", default="island-0")
    p.add_argument("--run-id", default="atoll")
    p.add_argument("--secret-file", default=None, help="default: ATOLL_SECRET")
    p.add_argument("--tls-ca", default=None, help="the PEM certificate that signed the syncer's")
    p.add_argument("--steps", type=int, default=200, help="at most this many steps")
    p.add_argument("--fsdp", action="store_true", help="FSDP2 (fully_shard) instead of DDP")
    p.add_argument("--check-heal", action="store_true", help="check the first heal, then go on")
    args = p.parse_args()

    torch.set_num_threads(1)
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda") if cuda else torch.device("cpu")

    cfg = SimConfig()  # the built-in model and data, as the syncer's defaults
    model = new_model(SimConfig(seed=cfg.seed + 1)).to(device)  # not the syncer's init
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        net = model
    else:
        net = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    opts = atoll.LearnerOptions(
        learner_id=args.learner_id, run_id=args.run_id, secret_file=args.secret_file,
        tls_ca=args.tls_ca,
    )  # fmt: skip
    learner = atoll.Learner(model, opt, args.syncer, opts)
    if args.check_heal:  # every rank now holds the syncer's initial model (heals are int8)
        want = dict(new_model(cfg).named_parameters())
        have = full_params(model)
        err = max((have[n] - w.detach()).abs().max().item() for n, w in want.items())
        digest = atoll.core.codec.digest(torch.cat([t.reshape(-1) for t in have.values()]))
        print(f"rank {rank} healed: max error {err:.5f} digest {digest.hex()}", flush=True)

    data = DataStream(cfg, load_corpus(cfg), 0)
    data.gen.manual_seed(1000 + rank)  # each rank its own batches
    first = last = None
    steps = 0
    for _ in range(args.steps):
        x, y = (t.to(device) for t in data.next())
        loss = net(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        learner.step(tokens=x.numel())
        steps += 1
        first = first if first is not None else loss.item()
        last = loss.item()
        if learner.should_stop:
            break
    learner.finish()
    print(f"rank {rank} steps {steps} loss {first:.4f} -> {last:.4f}", flush=True)
    dist.barrier()  # every rank done with the group's collectives before any rank leaves it
    del net  # the DDP wrapper first: it holds the process group
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
