"""Pure tests: no sockets, no processes, no gRPC (tests/unit/test_tiers.py checks)."""
