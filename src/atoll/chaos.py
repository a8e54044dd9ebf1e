"""Chaos scenarios as data, one language for both drivers (`atoll sim`, `atoll run`).

A `Scenario` is fixed faults (`Fault`: at a time, of a kind, at a target) and seeded random
ones (`RandomFaults`: a Poisson rate; `RandomCount`: exactly N, the chaos spec's `random:N`).
`timeline(learners, horizon_s, seed)` turns it into the concrete, time-sorted list of faults a
driver applies; the same arguments give the same list in both drivers, so a live run can be
compared with its virtual-time prediction. Times are seconds after training started.

Kinds (`duration` in seconds; `target` a learner id "L<i>", or "syncer"):
    kill         the learner dies (SIGKILL): unsent work is lost; restarted `duration` later,
                 it heals from the syncer and rejoins
    stall        the learner is stopped (SIGSTOP/SIGCONT) for `duration`: no steps and no
                 messages, it keeps its state (no heal)
    cut          the learner's link delivers nothing, either way, for `duration`; transfers
                 wait until it is back
    slow         the learner's link bandwidth is divided by `factor` for `duration`
    add          the learner starts late, at `at` (it does not exist before)
    remove       the learner leaves for good at `at` (abruptly: unsent work is lost)
    kill_syncer  the syncer dies for `duration`; it comes back with every committed merge
                 (snapshot + tape), learners train on meanwhile

A fault at a learner that is not running at its time (not yet added, removed, down) is
skipped by the drivers, except `cut`/`slow` (the link is there either way) and `remove`.

TOML (`Scenario.from_toml`; the same keys as a dict: `from_dict` / `to_dict`):

    horizon_s = 0          # optional; 0: the driver's (live: max_wall_s, sim: see atoll.sim)
    [[fault]]
    kind = "kill"          # one of KINDS
    target = "L1"          # kill_syncer: "syncer" (the default for it)
    at = 20.0
    duration = 3.0
    [[fault]]
    kind = "slow"
    target = "L2"
    at = 30
    duration = 10
    factor = 4             # slow only
    [[random]]
    kind = "kill"          # not add/remove; targets drawn among L0..L{n-1}
    rate_per_min = 1.0     # Poisson, in [start, end) (end 0: the horizon)
    duration = 5.0
    start = 0.0
    end = 0.0
    [[random]]
    kind = "kill"
    count = 3              # exactly 3, at uniform times in [lo, hi] x horizon (`random:3`)
    duration = 3.0
    lo = 0.1
    hi = 0.7

Each rate entry draws from its own stream ("{seed}-chaos-{index}"), one gap then one target at
a time, so a longer horizon only adds faults after the shorter one's. Count entries draw from
"{seed}-chaos", each from its start, as `random:N` always has.

The compact spec of the live `chaos` setting (`Scenario.from_spec`), comma separated:
`kill:L1@20+3`, `stop:L2@30+2` (a stall), `kill:syncer@40+2` (kill_syncer), `random:3`, and
`stall:`, `cut:`, `slow:L1@10+20x4` (factor after x), `add:L3@30`, `remove:L2@50`; a missing
`+duration` is `restart_delay_s` (add/remove: 0).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from atoll.compat import tomllib
from atoll.errors import ConfigError

KINDS = ("kill", "stall", "cut", "slow", "add", "remove", "kill_syncer")
RANDOM_KINDS = ("kill", "stall", "cut", "slow", "kill_syncer")  # add/remove name a learner
_TIMED = ("stall", "cut", "slow")  # a duration > 0 is required
_SPEC_KINDS = {"kill": "kill", "stop": "stall", "stall": "stall", "cut": "cut", "slow": "slow",
               "add": "add", "remove": "remove", "kill_syncer": "kill_syncer"}  # fmt: skip


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after training starts
    kind: str  # one of KINDS
    target: str  # a learner id "L<i>" or "syncer"
    duration: float = 0.0  # see the module docstring; add/remove: 0
    factor: float = 1.0  # slow: bandwidth divided by this

    @property
    def end(self) -> float:
        return self.at + self.duration


@dataclass(frozen=True)
class RandomFaults:
    """Faults of one kind at a seeded Poisson rate, targets drawn among every learner."""

    kind: str
    rate_per_min: float
    duration: float
    start: float = 0.0
    end: float = 0.0  # 0: the horizon
    factor: float = 1.0


@dataclass(frozen=True)
class RandomCount:
    """Exactly `count` faults at uniform times in [lo, hi] x horizon (`random:N`)."""

    kind: str
    count: int
    duration: float
    lo: float = 0.1
    hi: float = 0.7
    factor: float = 1.0


def _num(ok: bool, key: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(key, value, allowed)


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _learner_index(target: object) -> int | None:
    """i for a learner id "L<i>" as the drivers spell it (not "L01"), else None."""
    if isinstance(target, str) and target[1:].isdigit() and target == f"L{int(target[1:])}":
        return int(target[1:])
    return None


def _check_shape(key: str, kind: str, duration: float, factor: float, kinds: tuple) -> None:
    """The checks a fault and a random entry share: kind, duration, factor."""
    _num(kind in kinds, f"{key}.kind", kind, f"one of {', '.join(kinds)}")
    _num(_finite(duration) and duration >= 0, f"{key}.duration", duration, "seconds >= 0")
    if kind in _TIMED:
        _num(duration > 0, f"{key}.duration", duration, f"seconds > 0 (a {kind} lasts a while)")
    if kind in ("add", "remove"):
        _num(duration == 0, f"{key}.duration", duration, f"0 ({kind} is for good)")
    if kind == "slow":
        _num(_finite(factor) and factor >= 1, f"{key}.factor", factor, "a number >= 1")
    else:
        _num(factor == 1, f"{key}.factor", factor, "1 (a factor is for slow faults only)")


@dataclass(frozen=True)
class Scenario:
    faults: tuple[Fault, ...] = ()
    random: tuple[RandomFaults | RandomCount, ...] = ()
    horizon_s: float = 0.0  # 0: the horizon the driver passes to `timeline`
    name: str = field(default="", compare=False)  # where it came from, for error messages

    # -- the concrete schedule ------------------------------------------------------------
    def timeline(self, learners: int, horizon_s: float, seed: int) -> list[Fault]:
        """Every fault, sorted by time (stable: ties keep their order), deterministic in
        `seed`; random targets are drawn among L0..L{learners-1}. `horizon_s` is used when
        the scenario does not fix its own."""
        horizon = self.horizon_s or horizon_s
        out = list(self.faults)
        for i, r in enumerate(self.random):
            out += _draw(r, i, learners, horizon, seed)
        return sorted(out, key=lambda f: f.at)

    def kinds(self) -> set[str]:
        return {f.kind for f in self.faults} | {r.kind for r in self.random}

    def late_learners(self) -> dict[str, float]:
        """Learners that start late (`add`): id -> start time."""
        return {f.target: f.at for f in self.faults if f.kind == "add"}

    # -- checks -------------------------------------------------------------------------
    def validate(self, learners: int) -> Scenario:
        """ConfigError naming the value and what is allowed, for a run of `learners`."""
        try:
            self._validate(learners)
        except ConfigError as e:
            if not self.name:
                raise
            raise ConfigError(f"{self.name}: {e.setting}", e.value, e.allowed) from None
        return self

    def _validate(self, learners: int) -> None:
        _num(_finite(self.horizon_s) and self.horizon_s >= 0, "horizon_s", self.horizon_s,
             "seconds >= 0 (0: the driver's horizon)")  # fmt: skip
        ids = f"a learner id L0..L{learners - 1} (learners={learners})"
        added: dict[str, float] = {}
        removed: dict[str, float] = {}
        for i, f in enumerate(self.faults):
            key = f"fault[{i}]"
            _check_shape(key, f.kind, f.duration, f.factor, KINDS)
            _num(_finite(f.at) and f.at >= 0, f"{key}.at", f.at, "seconds >= 0 after the start")
            if f.kind == "kill_syncer":
                _num(f.target == "syncer", f"{key}.target", f.target, "'syncer' for kill_syncer")
                continue
            if f.target == "syncer":
                allowed = "a learner id: kill the syncer with kind kill_syncer"
                if f.kind == "stall":
                    allowed = "a learner id (stalling the syncer is not supported: kill_syncer)"
                raise ConfigError(f"{key}.target", f.target, allowed)
            idx = _learner_index(f.target)
            _num(idx is not None and idx < learners, f"{key}.target", f.target, ids)
            book = added if f.kind == "add" else removed if f.kind == "remove" else None
            if book is not None:
                _num(f.target not in book, f"{key}.target", f.target,
                     f"a learner not already {f.kind}ed (one {f.kind} per learner)")  # fmt: skip
                book[f.target] = f.at
        for i, f in enumerate(self.faults):
            key = f"fault[{i}]"
            if f.target in added and f.kind != "add" and f.at < added[f.target]:
                _num(False, f"{key}.at", f.at,
                     f"a time >= {added[f.target]} ({f.target} is added then)")  # fmt: skip
            if f.target in removed and f.kind != "remove" and f.at > removed[f.target]:
                _num(False, f"{key}.at", f.at,
                     f"a time <= {removed[f.target]} ({f.target} is removed then)")  # fmt: skip
        if len(added) >= learners:
            _num(False, "fault.add", sorted(added), "at least one learner there from the start")
        for i, r in enumerate(self.random):
            key = f"random[{i}]"
            _check_shape(key, r.kind, r.duration, r.factor, RANDOM_KINDS)
            if isinstance(r, RandomCount):
                ok = isinstance(r.count, int) and not isinstance(r.count, bool) and r.count >= 0
                _num(ok, f"{key}.count", r.count, "an integer >= 0")
                _num(_finite(r.lo) and _finite(r.hi) and 0 <= r.lo <= r.hi, f"{key}.lo",
                     (r.lo, r.hi), "fractions of the horizon, 0 <= lo <= hi")  # fmt: skip
                continue
            _num(_finite(r.rate_per_min) and r.rate_per_min > 0, f"{key}.rate_per_min",
                 r.rate_per_min, "faults per minute > 0")  # fmt: skip
            _num(_finite(r.start) and r.start >= 0, f"{key}.start", r.start, "seconds >= 0")
            _num(_finite(r.end) and (r.end == 0 or r.end > r.start), f"{key}.end", r.end,
                 f"0 (the horizon) or seconds > start={r.start}")  # fmt: skip

    # -- formats ------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | Path) -> Scenario:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("scenario", str(path), "an existing scenario file (.toml)")
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError("scenario", str(path), f"valid TOML ({exc})") from None
        return cls.from_dict(data, name=str(path))

    @classmethod
    def from_dict(cls, d: dict[str, Any], name: str = "") -> Scenario:
        try:
            return cls._from_dict(d, name)
        except ConfigError as e:
            if not name:
                raise
            raise ConfigError(f"{name}: {e.setting}", e.value, e.allowed) from None

    @classmethod
    def _from_dict(cls, d: dict[str, Any], name: str) -> Scenario:
        if not isinstance(d, dict):
            raise ConfigError("scenario", d, "a table with [[fault]] and [[random]] entries")
        known = ("fault", "random", "horizon_s")
        for k in d:
            _num(k in known, k, d[k], f"a known key: {', '.join(known)}")
        faults = []
        for i, t in enumerate(_tables(d, "fault")):
            t = {"target": "syncer", **t} if t.get("kind") == "kill_syncer" else t
            faults.append(_build(Fault, t, f"fault[{i}]"))
        rand: list[RandomFaults | RandomCount] = []
        for i, t in enumerate(_tables(d, "random")):
            kind = RandomCount if "count" in t else RandomFaults
            rand.append(_build(kind, t, f"random[{i}]"))
        horizon = d.get("horizon_s", 0.0)
        _num(_finite(horizon), "horizon_s", horizon, "a number of seconds")
        return cls(tuple(faults), tuple(rand), float(horizon), name)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.horizon_s:
            out["horizon_s"] = self.horizon_s
        if self.faults:
            out["fault"] = [_as_dict(f) for f in self.faults]
        if self.random:
            out["random"] = [_as_dict(r) for r in self.random]
        return out

    @classmethod
    def from_spec(cls, spec: str, restart_delay_s: float) -> Scenario:
        """The compact string of the live `chaos` setting (module docstring)."""
        faults: list[Fault] = []
        rand: list[RandomFaults | RandomCount] = []
        for item in [s.strip() for s in spec.split(",") if s.strip()]:
            if item.startswith("random:"):
                try:
                    n = int(item.split(":", 1)[1])
                except ValueError:
                    raise ConfigError("chaos", item, "random:<count>") from None
                rand.append(RandomCount("kill", n, restart_delay_s))
                continue
            faults.append(_spec_fault(item, restart_delay_s))
        return cls(tuple(faults), tuple(rand), name="chaos")


def _spec_fault(item: str, delay: float) -> Fault:
    example = "kill:L1@20+3, stop:L2@30+2, kill:syncer@40+2, slow:L1@10+20x4, add:L3@30"
    try:
        action, rest = item.split(":", 1)
        target, rest = rest.split("@", 1)
        factor = 1.0
        if "x" in rest:
            rest, fac = rest.split("x", 1)
            factor = float(fac)
        kind = _SPEC_KINDS.get(action, "")
        default = 0.0 if kind in ("add", "remove") else delay
        at_s, dur_s = rest.split("+", 1) if "+" in rest else (rest, str(default))
        at, duration = float(at_s), float(dur_s)
    except ValueError:
        raise ConfigError("chaos", item, example) from None
    if not kind:
        raise ConfigError("chaos", item, f"one of {', '.join(_SPEC_KINDS)} (e.g. {example})")
    if kind == "kill" and target == "syncer":
        kind = "kill_syncer"
    if kind == "stall" and target == "syncer":
        raise ConfigError("chaos", item, "kill:syncer (stopping the syncer is not supported)")
    return Fault(at, kind, target, duration, factor)


def _draw(
    r: RandomFaults | RandomCount, index: int, learners: int, horizon: float, seed: int
) -> list[Fault]:
    def target(rng: random.Random) -> str:
        return "syncer" if r.kind == "kill_syncer" else f"L{rng.randrange(learners)}"

    out = []
    if isinstance(r, RandomCount):
        rng = random.Random(f"{seed}-chaos")  # the stream `random:N` has always drawn from
        for _ in range(r.count):
            at = rng.uniform(r.lo, r.hi) * horizon
            out.append(Fault(at, r.kind, target(rng), r.duration, r.factor))
        return out
    rng = random.Random(f"{seed}-chaos-{index}")
    end = r.end or horizon
    t = r.start
    while True:
        t += rng.expovariate(r.rate_per_min / 60.0)
        if t >= end:
            return out
        out.append(Fault(t, r.kind, target(rng), r.duration, r.factor))


def _tables(d: dict[str, Any], key: str) -> list[dict[str, Any]]:
    ts = d.get(key, [])
    ts = [ts] if isinstance(ts, dict) else ts
    if not isinstance(ts, list) or not all(isinstance(t, dict) for t in ts):
        raise ConfigError(key, ts, f"a list of tables ([[{key}]] in TOML)")
    return ts


def _build(cls: type, t: dict[str, Any], key: str) -> Any:
    names = {f.name: f for f in fields(cls) if f.name != "name"}
    for k, v in t.items():
        _num(k in names, f"{key}.{k}", v, f"a known key: {', '.join(names)}")
    args = {}
    for name, f in names.items():
        if name not in t:
            if f.default is MISSING:
                raise ConfigError(f"{key}.{name}", None, "a value (this key is required)")
            continue
        v = t[name]
        typ = str(f.type)
        if typ == "str":
            _num(isinstance(v, str), f"{key}.{name}", v, "a string")
        elif typ == "int":
            _num(isinstance(v, int) and not isinstance(v, bool), f"{key}.{name}", v, "an integer")
        else:
            _num(_finite(v), f"{key}.{name}", v, "a number")
            v = float(v)
        args[name] = v
    return cls(**args)


def _as_dict(x: object) -> dict[str, Any]:
    return {f.name: getattr(x, f.name) for f in fields(x)}  # type: ignore[arg-type]


def load(value: str, default_duration: float) -> Scenario:
    """The `scenario` setting: a .toml (or .json) file, else a compact chaos spec whose
    missing durations are `default_duration`."""
    if value.endswith(".json"):
        p = Path(value)
        if not p.is_file():
            raise ConfigError("scenario", value, "an existing scenario file (.toml or .json)")
        return Scenario.from_dict(json.loads(p.read_text()), name=value)
    if value.endswith(".toml") or Path(value).is_file():
        return Scenario.from_toml(value)
    return Scenario.from_spec(value, default_duration)
