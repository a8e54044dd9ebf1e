"""atoll's tests, in three tiers: unit (pure), integration (in-process gRPC and threads),
e2e (processes, marked slow). Shared helpers are in tests/helpers.py, fixtures in
tests/conftest.py."""
