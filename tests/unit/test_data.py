"""Corpora: token files (memory-mapped, nanoGPT's layout), text files, their splits, shards and
batches; `token_batches`; and bad data stopping with one line before anything runs."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from atoll.cli import main as atoll_main
from atoll.config import SimConfig, load_job, to_args
from atoll.errors import ConfigError
from atoll.model import GPT, ByteCorpus, TokenCorpus, token_batches
from atoll.model.recipe import CorpusCache, load_corpus, new_model
from atoll.model.train import DataStream, Evaluator

SMALL = dict(learners=2, n_layer=1, d_model=8, n_head=2, context=8, batch=4, eval_batches=2)


def cfg(**kw) -> SimConfig:
    return SimConfig(**{**SMALL, **kw}).validate()


def write_tokens(path, ids, dtype="uint16"):
    np.array(ids, dtype=dtype).tofile(path)  # what nanoGPT's prepare scripts do
    return str(path)


def test_a_token_file_is_memory_mapped_and_split_at_its_last_eval_fraction(tmp_path):
    path = write_tokens(tmp_path / "train.bin", np.arange(10_000) % 5000)
    corpus = TokenCorpus.from_file(path, "uint16", eval_fraction=0.1)
    assert isinstance(corpus.train, np.memmap) and isinstance(corpus.eval, np.memmap)
    assert (len(corpus.train), len(corpus.eval)) == (9000, 1000)
    assert corpus.eval[0] == 9000 % 5000 and corpus.train[-1] == 8999 % 5000
    assert corpus.max_id() == 4999
    # a separate held-out file (nanoGPT's val.bin): all of train.bin trains
    val = write_tokens(tmp_path / "val.bin", [7] * 50)
    both = TokenCorpus.from_file(path, "uint16", eval_path=val)
    assert len(both.train) == 10_000 and list(both.eval[:3]) == [7, 7, 7]
    big = write_tokens(tmp_path / "big.bin", [70_000, 1, 2], "uint32")
    assert list(TokenCorpus.from_file(big, "uint32", eval_fraction=0.5).train) == [70_000, 1]


def test_shards_deal_blocks_round_robin_without_a_copy():
    tokens = np.arange(1000, dtype=np.uint32)
    corpus = TokenCorpus(tokens[:900], tokens[900:])
    n_blocks = 900 // 64
    shards = [corpus.shard(i, 3, block=64) for i in range(3)]
    for i, shard in enumerate(shards):
        want = np.concatenate([tokens[b * 64 : (b + 1) * 64] for b in range(i, n_blocks, 3)])
        assert len(shard) == len(want)
        assert shard.windows([0], len(shard))[0].tolist() == want.tolist()
        assert shard.tokens is corpus.train  # a view of the split, not a copy of it
    seen = np.concatenate([s.windows([0], len(s))[0].numpy() for s in shards])
    assert sorted(seen.tolist()) == list(range(n_blocks * 64))  # disjoint, all full blocks
    contiguous = corpus.shard(1, 3, block=0)
    assert contiguous.windows([0], len(contiguous))[0].tolist() == list(range(300, 600))
    assert len(corpus.shard(0, 1)) == 900  # one learner: the whole train split


def test_batches_are_windows_and_their_next_tokens_seeded():
    corpus = TokenCorpus(np.arange(5000, dtype=np.uint16), np.arange(100, dtype=np.uint16))
    shard = corpus.shard(1, 2, block=100)
    x, y = TokenCorpus.batch(shard, 6, 16, torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (6, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row in x.tolist():  # every token of shard 1: blocks 1, 3, 5, ... of 100
        assert all((t // 100) % 2 == 1 for t in row)
    x2, _ = TokenCorpus.batch(shard, 6, 16, torch.Generator().manual_seed(3))
    assert torch.equal(x, x2)
    evals = corpus.eval_batches(2, 3, 16, seed=1)
    assert len(evals) == 2 and all(int(b[0].max()) < 100 for b in evals)


def test_the_stdlib_corpus_is_its_sorted_py_files_read_lazily(tmp_path, monkeypatch):
    """The built-in corpus is the stdlib's .py files in `sorted(rglob("*.py"))` order, none
    under site-packages or test; walked lazily (a sorted walk, 20x faster than listing the tree),
    it must give exactly those bytes: names that sort around a folder's name ("a" < "a-b" <
    "a.py" < "a/..."), a folder named like a .py file, a symlinked folder (not entered)."""
    import sysconfig
    from pathlib import Path

    from atoll.model import data

    root = tmp_path / "lib"
    files = ["a.py", "a-b.py", "a/z.py", "a/b/c.py", "a.pyc", "B.py", "x.py/in.py", "test/t.py",
             "q/test/t.py", "site-packages/s.py", "q/r.py", "q/tests/u.py"]  # fmt: skip
    for i, name in enumerate(files):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(bytes([65 + i]) * 40_000)
    (root / "link").symlink_to(root / "q")
    (root / "link.py").symlink_to(root / "B.py")
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(root)})

    def by_rglob(max_bytes):
        out = b""
        for path in sorted(Path(root).rglob("*.py")):
            if "site-packages" in path.parts or "test" in path.parts or path.is_dir():
                continue
            out += path.read_bytes() + b"\n"
            if len(out) >= max_bytes:
                break
        return out[:max_bytes]

    for max_bytes in (100_000, 250_000, 10**7):
        assert data.load_stdlib_corpus(max_bytes) == by_rglob(max_bytes), max_bytes


def test_text_is_bytes_held_out_at_its_end():
    text = bytes(range(256)) * 40
    corpus = ByteCorpus(text, eval_fraction=0.25)
    assert bytes(corpus.eval) == text[-2560:] and bytes(corpus.train) == text[:-2560]
    held = ByteCorpus(text, eval_data=b"held out")
    assert bytes(held.train) == text and bytes(held.eval) == b"held out"


def test_a_user_text_file_trains_and_evaluates(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"the quick brown fox jumps over the lazy dog. " * 400)
    c = cfg(data=str(path), eval_fraction=0.2)
    corpus = load_corpus(c)
    n = path.stat().st_size
    assert (
        len(corpus.eval) == int(n * 0.2)
        and bytes(corpus.eval) == path.read_bytes()[-len(corpus.eval) :]
    )
    x, y = DataStream(c, corpus, 1).next()
    assert x.shape == (4, 8) and all(bytes(row) in path.read_bytes() for row in x.tolist())
    assert Evaluator(c, corpus)(dict(new_model(c).named_parameters())) > 0


def test_the_model_vocab_is_a_setting_and_token_files_need_theirs(tmp_path):
    path = write_tokens(tmp_path / "train.bin", np.arange(20_000) % 3000)
    with pytest.raises(ConfigError) as bad:
        load_corpus(cfg(data=path))
    assert str(bad.value).startswith("vocab=256 is not allowed") and ">= 3000" in str(bad.value)
    c = cfg(data=path, vocab=3000)
    model = new_model(c)
    assert isinstance(model, GPT) and model.tok_emb.weight.shape[0] == 3000
    x, y = DataStream(c, load_corpus(c), 0).next()
    assert float(model(x, y).detach()) > 0
    assert new_model(SimConfig()).head.weight.shape[0] == 256  # text: the 256 bytes


def test_corpus_cache_reads_once_and_checks_each_run(tmp_path):
    path = write_tokens(tmp_path / "t.bin", np.arange(20_000) % 100)
    cache = CorpusCache()
    a = cache.get(cfg(data=path, vocab=100))
    assert cache.get(cfg(data=path, vocab=100, seed=3)) is a
    with pytest.raises(ConfigError, match="vocab=50"):
        cache.get(cfg(data=path, vocab=50))


def test_token_batches_for_your_own_loop(tmp_path):
    path = write_tokens(tmp_path / "train.bin", np.arange(50_000))  # each id its position
    batches = token_batches(path, batch=4, context=32, learner=1, learners=2, seed=5)
    x, y = next(batches)
    assert x.shape == y.shape == (4, 32) and torch.equal(x[:, 1:], y[:, :-1])
    assert all((t // 4096) % 2 == 1 for t in x.flatten().tolist())  # blocks 1, 3, 5, ...
    again = next(token_batches(path, batch=4, context=32, learner=1, learners=2, seed=5))
    assert torch.equal(x, again[0])
    with pytest.raises(ConfigError, match="learner=2"):
        token_batches(path, 4, 32, learner=2, learners=2)
    with pytest.raises(ConfigError, match=r"path=.*multiple of 4 bytes.*dtype says"):
        token_batches(write_tokens(tmp_path / "odd.bin", [1, 2, 3]), 1, 1, dtype="uint32")
    with pytest.raises(ConfigError, match=r"path=.*at least 34 tokens in shard 1 of 2"):
        token_batches(write_tokens(tmp_path / "few.bin", range(5000)), 1, 32, learners=2, learner=1)


def _bad_data(tmp_path) -> list[tuple[list[str], str]]:
    """(--set values, the start of the one line they give)."""
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    small = write_tokens(tmp_path / "small.bin", range(10))
    ids = write_tokens(tmp_path / "ids.bin", np.arange(40_000) % 700)
    short = tmp_path / "short.txt"
    short.write_bytes(b"x" * 12)
    return [
        ([f"data={tmp_path}/missing.txt"], f"data='{tmp_path}/missing.txt' is not allowed"),
        ([f"data={tmp_path}/missing.bin"], f"data='{tmp_path}/missing.bin' is not allowed: one"),
        ([f"data={empty}"], f"data='{empty}' is not allowed: \"stdlib\", or text files"),
        ([f"data={odd}"], f"data='{odd}' is not allowed: a file of uint16 token ids"),
        ([f"data={small}"], f"data='{small}' is not allowed: a corpus whose train split"),
        ([f"data={short}", "learners=1"], f"data='{short}' is not allowed"),
        ([f"data={ids}"], "vocab=256 is not allowed"),
        ([f"data={ids}", "vocab=700", f"eval_data={small}"], f"eval_data='{small}'"),
        ([f"data={ids}", "vocab=700", "data_dtype=int8"], "data_dtype='int8'"),
        ([f"data={ids}", "vocab=70000"], "data_dtype='uint16' is not allowed: uint32"),
        ([f"data={ids},{short}"], f"data='{ids},{short}' is not allowed"),
        ([f"data={short}", f"eval_data={ids}"], f"eval_data='{ids}'"),
        (["eval_fraction=1"], "eval_fraction=1.0"),
    ]


def test_bad_data_stops_the_sim_with_one_line(tmp_path, capsys):
    for sets, start in _bad_data(tmp_path):
        args = [a for s in [*sets, "context=16", "P=4", "H=4"] for a in ("--set", s)]
        rc = atoll_main(["sim", *args, "--quiet", "--no-plot", "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert rc == 2, (sets, err)
        assert err.startswith(f"atoll sim: error: {start}"), (sets, err)
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # nothing ran


def test_bad_data_stops_atoll_run_and_the_learner_before_any_process(tmp_path, capsys):
    for sets, start in _bad_data(tmp_path):
        args = [a for s in [*sets, "context=16", "P=4", "H=4"] for a in ("--set", s)]
        out = tmp_path / "run"
        assert atoll_main(["run", *args, "--out", str(out), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"atoll run: error: {start}") and err.count("\n") == 1, err
        assert not out.exists()  # no run directory, no process
        rc = atoll_main(["learner", *args, "--syncer", "127.0.0.1:9"])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith(f"atoll learner: error: {start}"), err


def test_the_data_settings_travel_to_child_processes(tmp_path):
    path = write_tokens(tmp_path / "train.bin", [1, 2])
    sets = [f"data={path}", "vocab=100000", "data_dtype=uint32", f"eval_data={path}"]
    job = load_job([*sets, "eval_fraction=0.05"])
    back = load_job([a for a in to_args(job) if a != "--set"])
    assert back == job and (back.sim.vocab, back.sim.data_dtype) == (100000, "uint32")


SIM = {"n_layer": 1, "d_model": 32, "n_head": 2, "context": 32, "batch": 8, "steps": 30,
       "P": 4, "H": 4, "eval_batches": 2, "eval_points": 3, "warmup": 5, "lr": 0.01}  # fmt: skip


def _sim(tmp_path, sets: dict) -> list[dict]:
    args = [a for k, v in {**SIM, **sets}.items() for a in ("--set", f"{k}={v}")]
    out = tmp_path / "out"
    rc = atoll_main(["sim", *args, "--quiet", "--no-plot", "--out", str(out)])
    assert rc == 0
    return json.loads((out / "results.json").read_text())["runs"]


def test_the_sim_trains_on_a_token_file_with_its_held_out_file(tmp_path):
    rng = np.random.default_rng(0)  # runs of consecutive ids: each id predicts the next
    runs = [np.arange(s, s + 40) % 512 for s in rng.integers(0, 512, 2000)]
    train = write_tokens(tmp_path / "train.bin", np.concatenate(runs))
    val = write_tokens(tmp_path / "val.bin", np.concatenate(runs[:100]))
    results = _sim(tmp_path, {"data": train, "eval_data": val, "vocab": 512, "steps": 80})
    assert {r["method"] for r in results} == {"decoupled", "data_parallel"}
    for r in results:  # an untrained model: ln(512) = 6.2 nats per token
        assert r["eval_loss"] < 3.5 and r["eval_loss"] < r["curve"][0]["eval_loss"], r["curve"]
        assert r["settings"]["vocab"] == 512 and r["tokens"] >= 4 * 80 * 8 * 32


def test_the_sim_trains_on_a_user_text_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_bytes(b"".join(b"line %d: the quick brown fox.\n" % i for i in range(3000)))
    results = _sim(tmp_path, {"data": path, "eval_fraction": 0.2})
    for r in results:
        assert r["eval_loss"] < r["curve"][0]["eval_loss"] - 1, r["curve"]
