"""End-to-end tests: real processes (`atoll run`, syncers, learners); all marked slow."""
