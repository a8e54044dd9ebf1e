"""A custom model as the syncer's starting point: its embeddings found from the model itself
(atoll.model.embeddings), stored by `atoll.save_init`, used by `atoll syncer --init` and
`--init-from`; bad input stops with one line (the CLI in process, nothing started)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors import safe_open

import atoll
from atoll.cli import main as cli_main
from atoll.config import SimConfig
from atoll.core.fragments import make_plan
from atoll.errors import ConfigError
from atoll.model.custom import EMBEDDINGS_KEY, file_plan, model_from, model_plan
from atoll.model.embeddings import embedding_names
from atoll.model.recipe import builtin_plan, new_model


def _hf():
    return pytest.importorskip("transformers")


def tiny_gpt2(tf):
    cfg = tf.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                        bos_token_id=None, eos_token_id=None)  # fmt: skip
    return tf.GPT2LMHeadModel(cfg)


def tiny_llama(tf):
    cfg = tf.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip
    return tf.LlamaForCausalLM(cfg)


# -- detection ----------------------------------------------------------------------------------
def test_the_builtin_gpt_gives_the_same_embeddings_and_plan_as_before():
    cfg = SimConfig()  # the defaults: 2 layers, P = H = 24
    model = new_model(cfg)
    before = {"tok_emb.weight", "pos_emb.weight"}  # what GPT.embedding_names returned
    assert embedding_names(model) == model.embedding_names() == before
    plan, init = builtin_plan(cfg)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert plan == make_plan(shapes, cfg.P, cfg.H, before, cfg.packing)
    assert plan.fragments[0].is_embedding and set(plan.fragments[0].names) == before


def test_a_tied_head_is_named_as_named_parameters_names_it():
    tf = _hf()
    model = tiny_gpt2(tf)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied by transformers
    names = {n for n, _ in model.named_parameters()}
    assert "lm_head.weight" not in names
    assert embedding_names(model) == {"transformer.wte.weight", "transformer.wpe.weight"}


def test_an_untied_head_is_not_an_embedding():
    tf = _hf()
    model = tiny_llama(tf)
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert embedding_names(model) == {"model.embed_tokens.weight"}


def test_a_head_registered_first_or_over_the_same_memory_counts():
    class HeadFirst(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.emb = torch.nn.Embedding(10, 4)
            self.head.weight = self.emb.weight  # tied: listed once, under "head.weight"
            self.mix = torch.nn.Linear(4, 4)

    model = HeadFirst()
    assert [n for n, _ in model.named_parameters()] == ["head.weight", "mix.weight", "mix.bias"]
    assert embedding_names(model) == {"head.weight"}
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = torch.nn.Parameter(model[0].weight.data)  # its own Parameter, same memory
    assert embedding_names(model) == {"0.weight", "1.weight"}
    model[1].weight = torch.nn.Parameter(model[0].weight.detach().clone())  # a copy: not tied
    assert embedding_names(model) == {"0.weight"}


def test_an_override_wins_and_a_name_that_is_no_parameter_stops_naming_it():
    model = new_model(SimConfig(n_layer=1, d_model=16, n_head=2, context=16))
    assert embedding_names(model, ["head.weight"]) == {"head.weight"}
    assert embedding_names(model, []) == set()
    with pytest.raises(ConfigError) as err:
        embedding_names(model, ["tok_emb.weight", "tok_emb"])
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("embeddings='tok_emb' is not allowed")
    assert "did you mean tok_emb.weight" in msg and "pos_emb.weight" in msg


# -- save_init, --init, --init-from ---------------------------------------------------------------
def test_save_init_stores_the_embeddings_and_the_file_plans_as_the_model(tmp_path):
    tf = _hf()
    model = tiny_gpt2(tf)
    path = tmp_path / "init.safetensors"
    atoll.save_init(model, path)
    with safe_open(str(path), "pt") as f:
        assert set(json.loads(f.metadata()[EMBEDDINGS_KEY])) == embedding_names(model)
        assert set(f.keys()) == {n for n, _ in model.named_parameters()}
    plan, init = file_plan(path, 4, 4, None, "balanced")
    assert plan.fragments[0].is_embedding
    assert set(plan.fragments[0].names) == {"transformer.wte.weight", "transformer.wpe.weight"}
    plan2, init2 = model_plan(model, 4, 4, None, "balanced")
    assert plan2 == plan and all(torch.equal(a, b) for a, b in zip(init, init2))
    none, _ = file_plan(path, 4, 4, set(), "balanced")  # explicit: no embeddings
    assert not any(f.is_embedding for f in none.fragments)
    with pytest.raises(ConfigError, match=r"embeddings='wte' is not allowed: did you mean"):
        file_plan(path, 4, 4, {"wte"}, "balanced")


def test_a_file_without_the_metadata_has_no_embeddings(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(3), "b": torch.zeros(2, 2)}, str(tmp_path / "x.safetensors"))
    plan, _ = file_plan(tmp_path / "x.safetensors", 2, 2, None, "balanced")
    assert not any(f.is_embedding for f in plan.fragments)


def _syncer(tmp_path, capsys, *argv):
    rc = cli_main(["syncer", "--run-dir", str(tmp_path / "run"), *argv])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and err.startswith("atoll syncer: error: "), (rc, err)
    assert not (tmp_path / "run").exists()  # stopped before anything was written
    return err


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    monkeypatch.setenv("ATOLL_SECRET", "secret-0123456789")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # --init-from puts the cwd on it
    (tmp_path / "atoll_test_models.py").write_text(
        "import torch\n"
        "def number():\n    return 3\n"
        "def model():\n    return torch.nn.Linear(4, 4)\n"
        "not_callable = 5\n"
    )
    (tmp_path / "atoll_test_broken.py").write_text("import atoll_no_such_dependency\n")
    return tmp_path


def test_init_files_that_cannot_be_read_stop_with_one_line(cli_env, capsys):
    err = _syncer(cli_env, capsys, "--init", "missing.safetensors")
    assert "init='missing.safetensors'" in err and "an existing safetensors file" in err
    (cli_env / "model.pt").write_bytes(b"\x80\x02not a safetensors file at all")
    err = _syncer(cli_env, capsys, "--init", "model.pt")
    assert "init='model.pt'" in err and "a safetensors file" in err


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("atoll_test_models", "module:function (e.g. examples.hf_causal_lm:build_model)"),
        ("atoll_test_models:", "module:function"),
        ("no_such_module_here:build", "no module 'no_such_module_here' here"),
        ("atoll_test_models:nope", "atoll_test_models has no function 'nope'"),
        ("atoll_test_models:not_callable", "has no function 'not_callable'"),
        ("atoll_test_models:number", "a function returning a torch.nn.Module, not int"),
        ("atoll_test_broken:f", "needs 'atoll_no_such_dependency', which is not installed"),
    ],
)
def test_init_from_that_gives_no_model_stops_with_one_line(cli_env, capsys, spec, says):
    err = _syncer(cli_env, capsys, "--init-from", spec)
    assert f"init-from={spec!r} is not allowed" in err and says in err, err


def test_init_from_builds_the_model_and_checks_the_embeddings_given(cli_env, capsys):
    assert isinstance(model_from("atoll_test_models:model"), torch.nn.Linear)
    err = _syncer(cli_env, capsys, "--init-from", "atoll_test_models:model", "--embeddings", "w")
    assert "embeddings='w' is not allowed" in err and "bias, weight" in err
    err = _syncer(cli_env, capsys, "--init", "a.safetensors", "--init-from", "m:f")
    assert "not with --init" in err
    err = _syncer(cli_env, capsys, "--embeddings", "tok_emb.weight")
    assert "only with --init or --init-from" in err


def test_the_example_model_is_the_same_on_every_build_with_its_head_tied():
    _hf()
    from examples.hf_causal_lm import build_model

    a, b = build_model(), build_model()
    assert a.lm_head.weight is a.model.embed_tokens.weight
    assert embedding_names(a) == {"model.embed_tokens.weight"}
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    # the syncer's start and every learner's (digests match: a joining learner downloads none)
    assert pa.keys() == pb.keys() and all(torch.equal(pa[n], pb[n]) for n in pa)
