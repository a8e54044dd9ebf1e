"""Who may keep their progress when they (re)join the syncer, what a healing learner is sent,
and the check that nothing a learner of an earlier epoch saw was lost (SyncerProtocol's
`on_join` uses these: `resume_of`, `can_resume`, `HealCache`, `SeenVersions`).

A learner that reconnects asks to resume: it keeps its local progress when every version it is
based on is still held, and heals (every fragment in full) otherwise; a fresh learner's heal
leaves out the fragments it already holds (its parameters' digests match: "held"). A learner
that saw an earlier incarnation of the syncer (`other_epoch`) reports the newest versions it
saw; any beyond what the restore brought back are committed rounds lost (`seen_check` events).
A claim of more than SEEN_CLAIM_MAX versions beyond is a learner's bug, reported and not
counted.
"""

from __future__ import annotations

import weakref
from collections.abc import Collection, Iterable, Mapping, Sequence

import torch

from atoll.core import codec
from atoll.core.events import Event, SeenCheck
from atoll.core.fragments import FragmentPlan
from atoll.core.messages import FragmentUpdate, Heal, Resume, Resumed, UpdateKind
from atoll.core.state import History

SEEN_CLAIM_MAX = 1000  # versions a learner may claim to have seen beyond what was restored


def rejoin(
    versions: tuple[Sequence[int], Sequence[int]] | None,
    heal: bool = False,
    other_epoch: bool = False,
) -> Resume | None:
    """What a (re)joining learner says of its past, the learner's half of the decision whose
    syncer half is `resume_of` and `can_resume`; both drivers build their hellos with it.
    `versions`: its (base, latest) versions, or None when it has trained nothing (a fresh
    learner: it heals, and may offer its parameters' digests instead); `heal`: it asks for a
    heal instead of keeping its progress (a refusal said so, or its own values are broken);
    `other_epoch`: it saw an earlier incarnation of the syncer (the virtual-time driver knows;
    a live learner names the epoch it saw and the syncer finds out)."""
    if versions is None:
        return None
    base, latest = versions
    return Resume(tuple(base), tuple(latest), other_epoch=other_epoch, keep_progress=not heal)


def resume_of(
    base_versions: Iterable[int],
    latest_versions: Iterable[int],
    hello_epoch: str,
    this_epoch: str,
    known_epochs: Collection[str],
    keep_progress: bool,
) -> Resume | None:
    """What a (re)joining learner's hello says of its past (None: a fresh learner, which
    names no epoch and does not ask to keep its progress). Its versions are checked against
    what an earlier epoch committed (`other_epoch`) only when it saw an epoch of this run's
    syncer other than this one: an epoch it never had (another run, a bug) gives nothing to
    check by."""
    if not (keep_progress or hello_epoch):
        return None
    other = bool(hello_epoch) and hello_epoch != this_epoch and hello_epoch in known_epochs
    return Resume(
        tuple(base_versions),
        tuple(latest_versions),
        other_epoch=other,
        keep_progress=keep_progress,
    )


def can_resume(r: Resume | None, history: History, served: Sequence[int] | None = None) -> bool:
    """A learner keeps its progress when every version it is based on is still held (of the
    `served` fragments: a shard's; default all)."""
    P = len(history)
    if r is None or not r.keep_progress:
        return False
    if len(r.base_versions) != P or len(r.latest_versions) != P:
        return False
    return history.holds_all(r.base_versions, served)


class HealCache:
    """What a healing learner is sent: each fragment's public value in full (`heal_codec`),
    encoded once per value (a storm of rejoins costs no re-encoding under the driver's
    lock), or "held" where a fresh learner's parameter digests show it holds the value.
    The protocol never changes a tensor in place, it replaces it: the tensor's identity keys
    both caches (not durable state), held by a weak reference (a public value the protocol
    has replaced is not kept alive by them: that would be one more copy of the model)."""

    def __init__(
        self, plan: FragmentPlan, heal_codec: str, group: int, served: Sequence[int] | None = None
    ) -> None:
        self.plan, self.heal_codec, self.group = plan, heal_codec, group
        self.served = list(range(plan.P)) if served is None else list(served)
        self.full_frames: dict[int, tuple[weakref.ref, bytes]] = {}  # p -> (value, frame)
        self.digest_cache: dict[int, tuple[weakref.ref, dict[str, bytes]]] = {}

    def full(self, p: int, version: int, value: torch.Tensor) -> FragmentUpdate:
        """Fragment p's public `value` of `version`, in full."""
        hit = self.full_frames.get(p)
        if hit is None or hit[0]() is not value:
            frame = codec.encode(value, self.heal_codec, self.group)
            hit = self.full_frames[p] = (weakref.ref(value), frame)
        return FragmentUpdate(p, version, UpdateKind.FULL, version, hit[1], (), 0.0)

    def heal(
        self,
        versions: Sequence[int],
        values: Sequence[torch.Tensor],
        digests: Mapping[str, bytes] | None = None,
    ) -> Heal:
        """Every fragment served in full, except those a fresh learner already holds (all its
        tensors' `digests` match the public value): "held", with no payload. A learner
        started from the run's initial weights, as its peers were, then costs no model
        download."""
        return Heal(
            tuple(self._held_or_full(p, versions[p], values[p], digests) for p in self.served)
        )

    def resumed(
        self, versions: Sequence[int], values: Sequence[torch.Tensor], seen: Sequence[int]
    ) -> Resumed:
        """The fragments that moved on since the versions a resuming learner has `seen`."""
        lacking = [p for p in self.served if versions[p] > seen[p]]
        return Resumed(tuple(self.full(p, versions[p], values[p]) for p in lacking))

    def _held_or_full(
        self, p: int, version: int, value: torch.Tensor, digests: Mapping[str, bytes] | None
    ) -> FragmentUpdate:
        if digests:
            hit = self.digest_cache.get(p)
            if hit is None or hit[0]() is not value:  # same identity rule as the frames
                names = self.plan.fragments[p].names
                parts = self.plan.split(p, value)
                named = {n: codec.digest(t) for n, t in zip(names, parts, strict=True)}
                hit = self.digest_cache[p] = (weakref.ref(value), named)
            if all(digests.get(n) == d for n, d in hit[1].items()):
                return FragmentUpdate(p, version, UpdateKind.HELD, version, b"", (), 0.0)
        return self.full(p, version, value)


class SeenVersions:
    """The versions this process restored, and the newest that learners of earlier epochs
    reported having seen: any beyond what was restored are committed rounds lost."""

    def __init__(self, P: int, served: Sequence[int] | None = None) -> None:
        self.served = list(range(P)) if served is None else list(served)
        self.restored = [0] * P  # versions when this process started
        self.max_seen = [-1] * P  # newest versions learners of earlier epochs had seen

    def check(self, now: float, learner: str, r: Resume) -> list[Event]:
        """A learner that saw an earlier epoch: every version it saw must be here. A claim of
        more than SEEN_CLAIM_MAX versions beyond what was restored is a learner's bug, not a
        loss: it is reported and not counted."""
        if not r.other_epoch or len(r.latest_versions) != len(self.restored):
            return []
        seen = r.latest_versions
        far = [p for p in self.served if seen[p] > self.restored[p] + SEEN_CLAIM_MAX]
        if far:
            p = far[0]
            why = (
                f"fragment {p}: claims version {r.latest_versions[p]}, restored "
                f"{self.restored[p]} (more than {SEEN_CLAIM_MAX} beyond is implausible)"
            )
            return [Event(now, "syncer", SeenCheck(learner, 0, why))]
        lost = 0
        for p in self.served:
            v = seen[p]
            if v > self.max_seen[p]:
                lost += max(0, v - max(self.max_seen[p], self.restored[p]))
                self.max_seen[p] = v
        return [Event(now, "syncer", SeenCheck(learner, lost))]
