"""What the learner protocol holds besides the parameters: one copy of the model (its base and
latest values share tensors until a newer value arrives), after heals, rounds and a restore."""

import hashlib

import torch

from atoll.core import codec
from atoll.core.fragments import FlatFragments, make_plan
from atoll.core.learner import LearnerConfig, LearnerProtocol
from atoll.core.messages import Send
from atoll.core.syncer import SyncerConfig, SyncerProtocol
from tests.helpers import encoded

# whole groups of 64 values: a decoded int8 fragment is exactly its values, no padding
SHAPES = {"a": (64, 8), "b": (128,), "c": (16, 16), "d": (192,)}
MODEL_BYTES = 4 * sum(r * (c[0] if c else 1) for r, *c in SHAPES.values())


def held_bytes(lp: LearnerProtocol) -> int:
    """Bytes of the distinct storages behind every tensor the protocol holds."""
    tensors = [*lp.base, *lp.latest]
    tensors += [r.at_send for r in lp.outstanding.values() if r.at_send is not None]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def _pair(receipt: str = "overwrite", seed: int = 0, same: bool = False):
    """A syncer and a learner; `same`: the syncer starts from the learner's values."""
    plan = make_plan(SHAPES, P=4, H=4)
    torch.manual_seed(seed)
    init = {n: torch.randn(s) for n, s in SHAPES.items()}
    params = {n: torch.nn.Parameter(torch.randn(s)) for n, s in SHAPES.items()}
    start = params if same else init
    syncer = SyncerProtocol(
        plan,
        [plan.flatten(start, p) for p in range(plan.P)],
        SyncerConfig(quorum=1, tau=1, schedule="push"),
    )
    lp = LearnerProtocol(
        "L0",
        plan,
        params,
        LearnerConfig(tau=1, receipt=receipt, schedule="push"),
        FlatFragments(plan, params),
    )
    return plan, syncer, lp, params


def _heal(syncer, lp, now=0.0, **kw):
    (heal,) = [o.message for o in syncer.on_join(now, lp.id, **kw) if isinstance(o, Send)]
    return lp.on_heal(now, heal)


def test_a_full_heal_holds_one_copy_of_the_model():
    plan, syncer, lp, params = _pair()
    _heal(syncer, lp)  # int8: every fragment decoded
    assert held_bytes(lp) == MODEL_BYTES  # was 2x: base cloned from latest
    assert all(b is v for b, v in zip(lp.base, lp.latest, strict=True))
    for p in range(plan.P):  # the parameters hold the healed values, in their own memory
        assert torch.equal(plan.flatten(params, p), lp.base[p])
        live = lp.flat.flatten(p, copy=False)
        assert live.data_ptr() != lp.base[p].data_ptr()


def test_a_heal_of_held_fragments_holds_one_copy_and_leaves_the_parameters():
    plan, syncer, lp, params = _pair(same=True)
    before = {n: t.detach().clone() for n, t in params.items()}
    digests = {n: codec.digest(t) for n, t in params.items()}
    _heal(syncer, lp, digests=digests)
    assert syncer.heal_message().nbytes > 0  # (what a heal in full would have sent)
    assert held_bytes(lp) == MODEL_BYTES
    assert all(torch.equal(params[n], before[n]) for n in params)


def test_rounds_hold_a_second_copy_only_of_a_fragment_whose_value_waits():
    plan, syncer, lp, params = _pair()
    _heal(syncer, lp)
    before = [b.clone() for b in lp.base]
    for step in range(1, 9):  # two fragment cycles, every contribution merged and answered
        with torch.no_grad():
            for t in params.values():
                t.add_(0.01)
        now = float(step)
        sends = encoded(lp, lp.on_step(now, 100, 1.0))
        lp.boundary(now)  # the answer to the previous step's send is applied (tau = 1)
        assert all(b is v for b, v in zip(lp.base, lp.latest, strict=True))
        assert held_bytes(lp) == MODEL_BYTES
        (sent,) = [s.message.fragment for s in sends]
        for out in syncer.on_contribution(now, sends[0].message):
            if isinstance(out, Send) and out.to == lp.id:
                lp.on_update(now, out.message)
        # the answer waits for its step: a second copy of that fragment only
        assert [p for p in range(plan.P) if lp.latest[p] is not lp.base[p]] == [sent]
        assert held_bytes(lp) == MODEL_BYTES + 4 * plan.fragments[sent].numel
    assert all(not torch.equal(b, a) for b, a in zip(lp.base, before, strict=True))


def test_a_restored_state_shares_as_the_original_did():
    plan, syncer, lp, params = _pair()
    _heal(syncer, lp)
    st = lp.state_dict()
    assert all(b is v for b, v in zip(st["base"], st["latest"], strict=True))
    _, _, again, _ = _pair(seed=1)
    again.load_state_dict(st)
    assert held_bytes(again) == MODEL_BYTES
    assert all(torch.equal(a, b) for a, b in zip(again.base, lp.base, strict=True))
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(again.base, lp.base, strict=True))


def test_the_digest_hashes_the_float32_bytes_without_a_copy():
    t = torch.randn(5, 7)
    want = hashlib.blake2b(t.numpy().tobytes(), digest_size=16).digest()
    assert codec.digest(t) == want == codec.digest(t.double()) == codec.digest(t.t().t())
    assert codec.digest(t.t()) != want  # C order of the tensor as it is shaped


def test_a_delta_is_written_into_the_buffer_the_driver_hands_out():
    plan, syncer, lp, params = _pair()
    _heal(syncer, lp)
    bufs = {p: torch.full((f.numel,), float("nan")) for p, f in enumerate(plan.fragments)}
    lp.delta_out = lambda p: bufs[p] if p % 2 == 0 else None  # odd fragments: none free
    with torch.no_grad():
        for t in params.values():
            t.add_(0.5)
    for step in range(1, plan.H + 1):
        (send,) = lp.on_step(float(step), 10, 1.0)
        o = send.message
        want = lp.base[o.fragment] - plan.flatten(params, o.fragment)
        assert torch.equal(o.delta, want)
        in_buf = o.delta.data_ptr() == bufs[o.fragment].data_ptr()
        assert in_buf == (o.fragment % 2 == 0)


class HostStore:
    """A fragment store that keeps every fragment's values in host memory while the model's
    parameters are elsewhere (as an island keeps FSDP2-sharded fragments: whole fp32 values
    on the host, shards on the GPU; here the parameters are on the meta device, which no
    value may be copied to)."""

    def __init__(self, plan, values):
        self.values = values

    def flatten(self, p, copy=True):
        return self.values[p].clone() if copy else self.values[p]

    def assign(self, p, flat):
        assert flat.device.type == "cpu", flat.device
        self.values[p] = flat.clone()

    def device(self, p):
        return torch.device("cpu")


def test_values_live_where_the_fragment_store_keeps_them_not_on_the_parameters_device():
    plan = make_plan(SHAPES, P=4, H=4)
    torch.manual_seed(0)
    init = {n: torch.randn(s) for n, s in SHAPES.items()}
    syncer = SyncerProtocol(plan, [plan.flatten(init, p) for p in range(plan.P)],
                            SyncerConfig(quorum=1, tau=1, schedule="push"))  # fmt: skip
    params = {n: torch.empty(s, device="meta") for n, s in SHAPES.items()}
    store = HostStore(plan, [torch.zeros(f.numel) for f in plan.fragments])
    lp = LearnerProtocol("L0", plan, params, LearnerConfig(tau=1, schedule="push"), store)
    _heal(syncer, lp)
    assert {t.device.type for t in [*lp.base, *lp.latest]} == {"cpu"}
    for p in range(plan.P):  # the heal's values reached the store
        torch.testing.assert_close(store.values[p], plan.flatten(init, p), atol=0.05, rtol=0)
