"""Fuzzing of everything atoll reads from the network or disk (benchmarks/fuzz.py runs it,
tests/unit/test_fuzz.py runs a few cases of each family).

A family is a hypothesis strategy of cases (readable recipes: a reproducer is the case's repr)
and a check that runs one case against the decoder under test and says "refused" or
"accepted"; it raises `Violation` when a property is broken (state changed by a refused input,
a wrong result), and any other exception is a crash. Families:

    codec     codec frames (core/codec.py decode, peek): mutated valid frames, zstd bombs
    chunks    chunk reassembly (wire/chunks.py Assembler)
    messages  protobuf messages and the conversions the syncer and learner use
              (wire/convert.py), the call metadata check (wire/auth.py)
    syncer    contributions into SyncerProtocol.on_contribution: a refused one leaves
              state_dict() bit-identical
    store     tape segments and snapshots (live/syncer/store.py restore)
    config    --set pairs and JSON/TOML files (config/parse.py build)
"""

from __future__ import annotations

from fuzzing.configs import FAMILY as CONFIG
from fuzzing.frames import CHUNKS, CODEC
from fuzzing.messages import FAMILY as MESSAGES
from fuzzing.store import FAMILY as STORE
from fuzzing.syncer import FAMILY as SYNCER

FAMILIES = {f.name: f for f in (CODEC, CHUNKS, MESSAGES, SYNCER, STORE, CONFIG)}
