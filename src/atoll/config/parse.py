"""The one reader of settings: `--set key=value` strings and JSON/TOML files of the same keys,
typed by the settings dataclasses' fields. Serves `atoll sim` (SimConfig keys) and the live
commands (SimConfig and LiveConfig keys); `to_args` writes settings back as `--set` arguments.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tomllib
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

from atoll.config.live import LiveConfig
from atoll.config.settings import SimConfig
from atoll.errors import ConfigError

C = TypeVar("C")


def add_set_argument(p: argparse.ArgumentParser, help: str) -> None:
    """The repeatable `--set KEY=VALUE` option whose values the parsers below read."""
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help
    )


def read_file(file: str | Path) -> dict[str, str]:
    """A JSON or TOML table of settings, as `key -> raw string` (booleans as true/false). A file
    that is not UTF-8 JSON/TOML, not a table, or holds a value that is not a number, string or
    boolean is a ConfigError."""
    path = Path(file)
    if not path.is_file():
        raise ConfigError("config", str(file), "an existing .json or .toml file")
    kind = "JSON" if path.suffix == ".json" else "TOML"
    try:
        text = path.read_bytes().decode("utf-8")
        data = json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except OSError as exc:
        raise ConfigError("config", str(file), f"a readable file ({exc.strerror})") from None
    except (ValueError, RecursionError) as exc:  # bad UTF-8, JSON or TOML; nesting too deep
        why = f"{type(exc).__name__}: {exc}"[:200]
        allowed = f"a UTF-8 {kind} table of settings ({why})"
        raise ConfigError("config", str(file), allowed) from None
    if not isinstance(data, dict):
        raise ConfigError("config", str(file), f"a {kind} table of key = value settings")
    out = {}
    for k, v in data.items():
        if isinstance(v, bool):
            out[k] = str(v).lower()
        elif isinstance(v, (int, float, str)):
            out[k] = str(v)
        else:
            raise ConfigError(k, v, "a number, a string or a boolean (one setting per key)")
    return out


def parse(
    pairs: list[str], classes: tuple[type, ...], file: str | Path | None = None
) -> list[dict[str, object]]:
    """Typed overrides from a settings file, then `key=value` strings (a later value of a key
    wins), one dict per settings class in `classes`. An unknown key is an error listing the
    known keys of all of them."""
    types = [{f.name: f.type for f in fields(cls)} for cls in classes]
    out: list[dict[str, object]] = [{} for _ in classes]
    items = list(read_file(file).items()) if file else []
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError("--set", pair, "key=value")
        key, raw = pair.split("=", 1)
        items.append((key.strip(), raw))
    for key, raw in items:
        where = next((i for i, t in enumerate(types) if key in t), None)
        if where is None:
            known = sorted(set().union(*types))
            raise ConfigError(key, raw, f"a known key; known keys: {', '.join(known)}")
        out[where][key] = _convert(key, raw, types[where][key])
    return out


def parse_overrides(pairs: list[str], file: str | Path | None = None) -> dict[str, object]:
    """SimConfig overrides (`atoll sim --set`)."""
    return parse(pairs, (SimConfig,), file)[0]


def split_overrides(
    pairs: list[str], file: str | Path | None = None
) -> tuple[dict[str, object], dict[str, object]]:
    """(SimConfig overrides, LiveConfig overrides) from a config file and `key=value` strings."""
    sim, live = parse(pairs, (SimConfig, LiveConfig), file)
    return sim, live


def build(
    pairs: list[str], file: str | Path | None = None, base: dict[str, object] | None = None
) -> tuple[SimConfig, LiveConfig]:
    """The validated settings of a live command: defaults < `base` < file < `--set`."""
    sim, live = split_overrides(pairs, file)
    base = dict(base or {})
    sim_base = {k: v for k, v in base.items() if k in {f.name for f in fields(SimConfig)}}
    live_base = {k: v for k, v in base.items() if k in {f.name for f in fields(LiveConfig)}}
    scfg = dataclasses.replace(SimConfig(), **{**sim_base, **sim}).validate()
    lcfg = dataclasses.replace(LiveConfig(), **{**live_base, **live}).validate()
    lcfg.shape_factors(scfg.learners)
    return scfg, lcfg


def with_overrides(cfg: C, overrides: dict[str, object]) -> C:
    return dataclasses.replace(cfg, **overrides)  # type: ignore[type-var]


def to_args(scfg: SimConfig, lcfg: LiveConfig) -> list[str]:
    """`--set` arguments reproducing every non-default setting (for child processes)."""
    out = []
    for cfg, default in ((scfg, SimConfig()), (lcfg, LiveConfig())):
        for f in fields(cfg):
            v = getattr(cfg, f.name)
            if v != getattr(default, f.name):
                out += ["--set", f"{f.name}={v}"]
    return out


def _convert(key: str, raw: str, typ: object) -> object:
    name = typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))
    try:
        if name == "bool":
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if name == "int":
            return int(raw)
        if name == "float":
            v = float(raw)
        else:
            return raw
    except ValueError:  # (also an int of more digits than Python converts)
        raise ConfigError(key, raw, f"a value of type {name}") from None
    if not math.isfinite(v):
        raise ConfigError(key, raw, "a finite number")
    return v
