"""Family `config`: `--set` pairs and JSON/TOML settings files (config/parse.py `build`, as
`atoll run/syncer/learner` read them, and `parse_overrides`, as `atoll sim` does).

Cases: pairs of known keys (values of the right type at their edges, of the wrong type,
`nan`, `inf`, huge numbers, text) and unknown or malformed keys; a settings file built from
such a table (JSON or TOML, scalars, arrays, tables, dates), mutated as bytes, or random
bytes, or JSON that is no object, deeply nested, with NaN. A clear refusal is
`atoll.errors.ConfigError` (its message names the setting, the value and what is allowed);
accepted settings must be validated configs whose every number is finite.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from atoll.config import LiveConfig, SimConfig, build, parse_overrides
from atoll.errors import ConfigError
from fuzzing.base import (
    MUTATIONS,
    Family,
    Violation,
    interesting_float,
    interesting_int,
    mostly,
    mutate,
    scratch,
)

TYPES = {f.name: f.type for c in (SimConfig, LiveConfig) for f in dataclasses.fields(c)}
KEYS = sorted(TYPES)
# the sizes a case may ask for: a run of 10^9 learners is refused elsewhere than here (settings
# allocate per learner); outside the fuzzed reader, so bounded in what is generated (reported)
SIZE_KEYS = {"learners"}
WORDS = (
    "",
    " ",
    "nan",
    "inf",
    "-inf",
    "1e999",
    "-0",
    "0x10",
    "1_000",
    " 5 ",
    "5.0",
    "true",
    "yes",
    "off",
    "2",
    "int4",
    "pull",
    "kill:L1@20+3",
    "random:3",
    "1,2",
    "é",
    "\x00",
)


NUMBERS = ("nan", "inf", "1e999", "-inf", "1,inf,1,1", "0.5,nan", "3", "0")


def value_for(key: str) -> st.SearchStrategy[Any]:
    """A Python value for `key` (what a file holds)."""
    t = TYPES.get(key, "str")
    lo, hi = (1, 64) if key in SIZE_KEYS else (None, None)
    typed = {
        "int": st.integers(lo, hi) if lo else interesting_int(),
        "float": interesting_float(),
        "bool": st.booleans(),
        "str": st.one_of(st.sampled_from(WORDS), st.text(max_size=10)),
    }[t]
    other = st.one_of(
        st.sampled_from(WORDS),
        st.booleans(),
        st.integers(-5, 10**6),
        interesting_float(),
        st.lists(st.integers(0, 3), max_size=3),
        st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2),
    )
    sane = {
        "int": st.integers(1, 8),
        "float": st.floats(0.05, 0.95),
        "bool": st.booleans(),
        "str": st.sampled_from(WORDS + NUMBERS),  # (numbers: speeds, shape_mbps are lists)
    }[t]
    return mostly(sane, st.one_of(typed, other), share=1)


KEY = st.one_of(st.sampled_from(KEYS), st.sampled_from(["", " ", "nope", "learners ", "P=H", "é"]))
VALUES = {k: value_for(k) for k in KEYS}
KEY_VALUE = st.one_of(
    st.one_of([st.tuples(st.just(k), v) for k, v in VALUES.items()]),
    st.tuples(KEY, value_for("")),
)
PAIR = st.one_of(
    KEY_VALUE.map(lambda kv: ("kv", *kv)),
    st.tuples(st.just("raw"), st.text(max_size=20)),
)
TABLE = st.lists(KEY_VALUE, max_size=6).map(dict)
FILE = st.one_of(
    st.none(),
    st.tuples(st.sampled_from(["json", "toml"]), TABLE, st.one_of(st.just([]), MUTATIONS)),
    st.tuples(st.sampled_from(["json", "toml"]), st.just({}), st.binary(max_size=80)),
    st.tuples(
        st.just("json-raw"),
        st.sampled_from(
            [
                "[1, 2]",
                "5",
                '"x"',
                "null",
                "[" * 3000 + "]" * 3000,
                '{"a": ' * 3000 + "1" + "}" * 3000,
                '{"lr": NaN}',
                '{"lr": Infinity}',
                '{"learners": 1e999}',
                '{"steps": ' + "9" * 5000 + "}",
                '{"seed": 1, "seed": 2}',
            ]  # fmt: skip
        ),
    ),
    st.tuples(
        st.just("toml-raw"),
        st.sampled_from(
            [
                "[run]\nlearners = 2",
                "learners = 2\nlearners = 3",
                "a = [" * 2000 + "]" * 2000,
                "lr = nan",
                "lr = inf",
                "when = 1979-05-27T07:32:00Z",
                "steps = 1_000",
                "x = {a = 1}",
            ]
        ),
    ),  # fmt: skip
)
CASES = st.one_of(
    st.tuples(st.lists(PAIR, max_size=5), FILE),
    st.tuples(st.lists(KEY_VALUE.map(lambda kv: ("kv", *kv)), max_size=1), st.none()),  # one key
)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return "nan" if v != v else ("inf" if v > 0 else "-inf") if math.isinf(v) else repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in v.items()) + "}"


def pair_text(p: tuple) -> str:
    if p[0] == "raw":
        return p[1]
    v = p[2]
    return f"{p[1]}={str(v).lower() if isinstance(v, bool) else v}"


def write_file(root: Path, spec: tuple | None) -> Path | None:
    if spec is None:
        return None
    kind = spec[0]
    path = root / ("settings.json" if kind.startswith("json") else "settings.toml")
    if kind.endswith("-raw"):
        path.write_text(spec[1])
    elif isinstance(spec[2], bytes):
        path.write_bytes(spec[2])
    else:
        table = spec[1]
        if kind == "json":
            text = json.dumps(table)
        else:
            text = "\n".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in table.items())
        path.write_bytes(mutate(text.encode(), spec[2]) if spec[2] else text.encode())
    return path


def check(case: tuple) -> str:
    pairs, spec = case
    root = scratch()
    try:
        file = write_file(root, spec)
        args = [pair_text(p) for p in pairs]
        try:
            scfg, lcfg = build(args, file)
        except ConfigError as exc:
            if not str(exc) or "is not allowed" not in str(exc):
                raise Violation(
                    f"ConfigError without the setting and what is allowed: {exc}"
                ) from exc
            try:  # the `atoll sim` reader: the same refusal or typed overrides
                parse_overrides(args, file)
            except ConfigError:
                pass
            return "refused"
        for cfg in (scfg, lcfg):
            for f in dataclasses.fields(cfg):
                v = getattr(cfg, f.name)
                if type(v).__name__ != f.type:
                    raise Violation(f"{f.name}={v!r} is not of type {f.type}")
                if isinstance(v, float) and not math.isfinite(v):
                    raise Violation(f"{f.name}={v!r} was accepted")
        shaped = lcfg.shape_factors(scfg.learners)
        if not all(math.isfinite(x) and x >= 0 for x in shaped):
            raise Violation(f"shape_mbps={lcfg.shape_mbps!r} accepted: {shaped}", "config/live.py")
        if not all(math.isfinite(x) and x > 0 for x in scfg.speed_factors()):
            raise Violation(
                f"speeds={scfg.speeds!r} accepted: {scfg.speed_factors()}",
                owner="config/settings.py",
            )
        return "accepted"
    finally:
        shutil.rmtree(root, ignore_errors=True)


FAMILY = Family(
    "config",
    CASES,
    check,
    "ConfigError naming the setting, the value and what is allowed",
    lambda case: 4 * 1024 * 1024,
)
