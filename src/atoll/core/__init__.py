"""The sans-I/O core: pure functions on tensors and protocol state machines, no sockets,
threads or sleeps. Time is always passed in.

Where to look:
- fragments.py  balanced tensor packing and the H/tau schedule
- counters.py   per-fragment step/token counters and the tokens^2/steps weight
- merge.py      weighted mean and radial-directional averaging (RDA)
- outer.py      outer optimizers (Nesterov, Delayed Nesterov)
- grace.py      minimum quorum and the adaptive grace window
- codec.py      wire format of fragment payloads (fp32/bf16/int8/int4, error feedback, zstd)
- receipt.py    what a learner does with a received global fragment
- learner.py    the learner protocol state machine
- syncer.py     the syncer protocol state machine
- events.py     the typed event stream every component emits
"""
