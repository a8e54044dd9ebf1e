"""Calibration against the paper's goodput table, and the table itself.

Honest split: the unknown timing constants (restart, checkpoint cost, down-scale, up-scale,
rejoin wait, chip speed spread) are fitted by least squares on the two data-parallel rows
only (10 cells), using the closed-form model. The four Decoupled DiLoCo rows are then
simulated with those constants as predictions. The slice size and the recovery-delay
distribution are fixed assumptions, not fitted.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace

import numpy as np
from scipy.optimize import least_squares

from atoll.goodput.analytic import expected_goodput
from atoll.goodput.simulate import simulate
from atoll.goodput.systems import (
    TABLE_SYSTEMS,
    TIMING_CONSTANTS,
    Cluster,
    Constants,
    parse_system,
)

TABLE_CHIPS = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)
# Paper (arXiv 2604.21428), goodput vs chips at a chip MTBI of one year.
PAPER: dict[str, tuple[float, ...]] = {
    "dp": (0.72, 0.57, 0.38, 0.27, 0.18),
    "dp_elastic": (0.88, 0.80, 0.69, 0.58, 0.40),
    "decoupled_m2": (0.94, 0.88, 0.80, 0.70, 0.54),
    "decoupled_m4": (0.96, 0.93, 0.89, 0.82, 0.73),
    "decoupled_m8": (0.98, 0.96, 0.94, 0.88, 0.80),
    "decoupled_m16": (0.99, 0.98, 0.96, 0.93, 0.86),
}
FIT_ON = ("dp", "dp_elastic")
FITTED = TIMING_CONSTANTS
_START = np.array([60.0, 1.0, 20.0, 15.0, 60.0, 0.001])
_LOWER = np.array([0.0, 1e-3, 0.0, 0.0, 0.0, 0.0])
_UPPER = np.array([3600.0, 600.0, 3600.0, 3600.0, 3600.0, 0.02])


def fit(base: Constants | None = None, fixed: frozenset[str] = frozenset()) -> Constants:
    """Fit the timing constants on the data-parallel rows; return the fitted `Constants`.

    Constants named in `fixed` keep their value in `base` and are not fitted.
    """
    base = base or Constants()
    free = [i for i, name in enumerate(FITTED) if name not in fixed]
    names = [FITTED[i] for i in free]
    if not names:
        return base

    def residuals(x: np.ndarray) -> np.ndarray:
        c = replace(base, **dict(zip(names, map(float, x), strict=True)))
        return np.array(
            [
                expected_goodput(parse_system(s), Cluster(n), c) - p
                for s in FIT_ON
                for n, p in zip(TABLE_CHIPS, PAPER[s], strict=True)
            ]
        )

    sol = least_squares(
        residuals, _START[free], bounds=(_LOWER[free], _UPPER[free]), x_scale=_START[free]
    )
    return replace(base, **dict(zip(names, map(float, sol.x), strict=True)))


def table(
    base: Constants | None = None,
    fixed: frozenset[str] = frozenset(),
    horizon_s: float = 30 * 86400.0,
    seed: int = 0,
) -> dict:
    """Fit on the data-parallel rows, then simulate the paper's whole table.

    Returns the JSON document written by ``atoll goodput --table --json``.
    """
    t0 = time.perf_counter()
    fitted = fit(base, fixed)
    fit_s = time.perf_counter() - t0
    cells = []
    for name in TABLE_SYSTEMS:
        for i, chips in enumerate(TABLE_CHIPS):
            result = simulate(parse_system(name), Cluster(chips), fitted, horizon_s, seed + i)
            cells.append(
                {"system": name, "chips": chips, "goodput": result.goodput, "paper": PAPER[name][i]}
            )
    errors = np.array([c["goodput"] - c["paper"] for c in cells])
    predicted = np.array([c["system"] not in FIT_ON for c in cells])
    fitted_doc = {k: v for k, v in asdict(fitted).items() if k != "recovery"}
    fitted_doc["recovery"] = asdict(fitted.recovery)
    fitted_doc["fitted_names"] = [n for n in FITTED if n not in fixed]
    fitted_doc["fitted_on"] = list(FIT_ON)
    return {
        "cells": cells,
        "fitted": fitted_doc,
        "summary": {
            "mae_fit_rows": float(np.mean(np.abs(errors[~predicted]))),
            "mae_decoupled_rows": float(np.mean(np.abs(errors[predicted]))),
            "max_abs_error": float(np.max(np.abs(errors))),
            "horizon_days": horizon_s / 86400.0,
            "seed": seed,
            "fit_seconds": fit_s,
            "seconds": time.perf_counter() - t0,
        },
    }
