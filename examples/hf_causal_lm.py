"""Train a Hugging Face causal LM with atoll: a transformers model in a plain training loop.

The model is built from a config (nothing downloaded): a small Llama whose output head is tied
to its token embedding, on bytes (vocabulary 256) of the Python standard library's sources.

    atoll syncer --init-from examples.hf_causal_lm:build_model --run-dir runs/hf \\
        --eval-from examples.hf_causal_lm:build_eval \\
        --set P=4 --set H=4 --no-budget                    # from the repository root
    python examples/hf_causal_lm.py --syncer 127.0.0.1:PORT --learner-id L0

The syncer starts from `build_model()` (the embeddings are found in the model itself), and
evaluates its global model with `build_eval()` while the run goes (every `eval_every_s`
seconds without a budget: the status page's loss chart, the view, the report); every
learner builds the same model (seeded), so none downloads it when it joins. The secret comes
from ATOLL_SECRET or --secret-file.

Inside a torchrun island (RANK and WORLD_SIZE set), every rank runs this script: the ranks
form a gloo process group, the model is wrapped in DistributedDataParallel, every rank makes
the atoll.Learner (rank 0 talks to the syncer; the Learner finds the process group itself) and
samples its own batches.
"""

from __future__ import annotations

import argparse
import os

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import atoll
from atoll.model.data import ByteCorpus, load_stdlib_corpus

CONTEXT = 64


def build_model(seed: int = 0) -> torch.nn.Module:
    """The model every process starts from: the syncer (--init-from) and each learner."""
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def build_eval(batches: int = 4, batch: int = 8) -> object:
    """The syncer's evaluation of the global model (--eval-from): the mean next-token loss on
    fixed held-out windows (the last tenth of the corpus, which no learner trains on)."""
    held_out = ByteCorpus(load_stdlib_corpus(1_000_000)).eval_batches(batches, batch, CONTEXT, 7)
    model = build_model()

    @torch.no_grad()
    def evaluate(params: dict[str, torch.Tensor]) -> float:
        for name, p in model.named_parameters():  # as the syncer names them (the tied head
            p.copy_(params[name])  # is the embedding's one tensor)
        model.eval()
        return sum(float(model(input_ids=x, labels=x).loss) for x, _ in held_out) / batches

    return evaluate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--syncer", default="127.0.0.1:7070", help="the syncer's host:port")
    p.add_argument("--learner-id", default="hf-0")
    p.add_argument("--run-id", default="atoll")
    p.add_argument("--secret-file", default=None, help="default: ATOLL_SECRET")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1, help="of this learner's batches")
    args = p.parse_args()

    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # torchrun
    rank = int(os.environ.get("RANK", 0))
    if distributed:
        torch.distributed.init_process_group("gloo")

    data = ByteCorpus(load_stdlib_corpus(1_000_000)).shard(0, 1)  # the train split
    gen = torch.Generator().manual_seed(1000 * args.seed + rank)  # each rank its own batches
    model = build_model()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    net = torch.nn.parallel.DistributedDataParallel(model) if distributed else model
    # in an island every rank makes the Learner (with the model itself, not the DDP wrapper):
    # the ranks are one learner, rank 0 talks to the syncer, and every rank is healed from it
    opts = atoll.LearnerOptions(
        learner_id=args.learner_id, run_id=args.run_id, secret_file=args.secret_file
    )
    learner = atoll.Learner(model, opt, args.syncer, opts)

    for step in range(args.steps):
        tokens, _ = ByteCorpus.batch(data, args.batch, CONTEXT, gen)  # random windows
        loss = net(input_ids=tokens, labels=tokens).loss  # next-token loss (shifted inside)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        learner.step(tokens=tokens.numel())
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if learner.should_stop:  # the run's token budget is spent
            break
    learner.finish()
    if distributed:  # every rank done with the group; the DDP wrapper first: it holds the group
        torch.distributed.barrier()
        del net
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
