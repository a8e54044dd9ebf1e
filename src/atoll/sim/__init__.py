"""The virtual-time driver: M learners, the syncer and their links on one event queue with
simulated clocks and real model math; data-parallel and synchronous DiLoCo as baselines."""
