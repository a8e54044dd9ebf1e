"""Run a family's cases with hypothesis and count what happened, without stopping at a crash.

After WARM_UP uncounted cases (imports, caches, fixtures), each case is timed and its traced
memory peak taken (tracemalloc, started for the case); a peak over the family's bound for the
case is measured once more, and counts as a crash ("memory") when it comes back. A crash is
recorded with the case's repr (the reproducer: `Family.check(case)` raises again), the
exception and the innermost atoll source line it came from.
"""

from __future__ import annotations

import os
import resource
import signal
import statistics
import sys
import time
import traceback
import tracemalloc
from collections import Counter
from typing import Any

from hypothesis import HealthCheck, Phase, given, seed, settings

from fuzzing.base import Family, Violation

REPR_MAX = 4000
WARM_UP = 25  # cases run before the measured ones (not counted)
CASE_LIMIT_S = 60.0  # a case that runs longer is a hang (counted as a crash)


class Hang(BaseException):
    """Raised in a case that ran past CASE_LIMIT_S (a BaseException: no `except Exception`
    in the code under test can take it for a refusal)."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang(f"the case ran for more than {CASE_LIMIT_S} s")


def where(exc: BaseException) -> str:
    """The innermost frame of the traceback inside atoll's sources (else the innermost)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [
        f for f in frames if f"{os.sep}atoll{os.sep}" in f.filename and "fuzzing" not in f.filename
    ]
    f = (ours or frames or [None])[-1]
    if f is None:
        return "?"
    path = f.filename.split(f"{os.sep}src{os.sep}")[-1]
    return f"{path}:{f.lineno}"


def kind_of(exc: BaseException) -> str:
    if isinstance(exc, Hang):
        return "hang"
    return "violation" if isinstance(exc, Violation) else "exception"


def rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _warm_up(fam: Family, seed_value: int | None, n: int = WARM_UP) -> None:
    """A few cases first, not counted: imports, caches and the family's fixture are then not
    in the first measured case's time and memory."""

    def quiet(case: Any) -> None:
        try:
            fam.check(case)
        except Exception:
            pass

    test = settings(max_examples=n, database=None, deadline=None, derandomize=seed_value is None,
                    phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
    test = test(given(fam.cases)(quiet))
    (seed(seed_value)(test) if seed_value is not None else test)()


def _traced_peak(fam: Family, case: Any) -> int:
    """A case's traced peak, measured again. The first can include a one-off of the
    interpreter's (its table of interned strings doubling, ~4 MB, whichever case adds the
    string that fills it); an allocation of the code under test is made again."""
    tracemalloc.start()
    try:
        fam.check(case)
    except BaseException:
        pass
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak


def run_family(
    fam: Family, cases: int, seed_value: int | None = None, progress: bool = True
) -> dict[str, Any]:
    counts = {"refused": 0, "accepted": 0}
    crashes: list[dict[str, Any]] = []
    times: list[float] = []
    peaks: list[int] = []
    ratios: list[float] = []
    remeasured: list[int] = []  # first peaks over the bound that a second run did not repeat
    rss_before = rss_kib()
    started = time.perf_counter()
    step = max(1, cases // 20)

    def one(case: Any) -> None:
        bound = fam.bound(case)
        tracemalloc.start()  # only around the case: hypothesis' own allocations stay out
        t0 = time.perf_counter()
        signal.setitimer(signal.ITIMER_REAL, CASE_LIMIT_S)
        try:
            outcome = fam.check(case)
        except BaseException as exc:  # a crash: recorded, and the run goes on
            if isinstance(exc, KeyboardInterrupt):
                raise
            outcome = "crash"
            at = where(exc)
            owner = getattr(exc, "owner", None) or at.rsplit(":", 1)[0].removeprefix("atoll/")
            crashes.append(
                {
                    "case": repr(case)[:REPR_MAX],
                    "error": f"{type(exc).__name__}: {exc}"[:1000],
                    "kind": kind_of(exc),
                    "where": at,
                    "owner": owner,
                }
            )
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        dt = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        if outcome != "crash":
            counts[outcome] += 1
            if peak > bound:  # once more: what the code under test allocates comes back
                first, peak = peak, _traced_peak(fam, case)
                remeasured.append(first)
            if peak > bound:
                crashes.append(
                    {
                        "case": repr(case)[:REPR_MAX],
                        "error": f"traced {first} then {peak} B > bound {bound} B",
                        "kind": "memory",
                        "where": fam.name,
                        "owner": fam.name,
                    }
                )
        times.append(dt)
        peaks.append(peak)
        ratios.append(peak / bound)
        n = len(times)
        if progress and (n % step == 0 or n == cases):
            el = time.perf_counter() - started
            print(
                f"  {fam.name:9s} {n:6d}/{cases} cases  refused {counts['refused']}  accepted "
                f"{counts['accepted']}  crashes {len(crashes)}  {el:6.1f} s",
                file=sys.stderr,
                flush=True,
            )

    signal.signal(signal.SIGALRM, _alarm)
    _warm_up(fam, seed_value)
    test = settings(
        max_examples=cases,
        database=None,
        deadline=None,
        derandomize=seed_value is None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )(given(fam.cases)(one))
    if seed_value is not None:
        test = seed(seed_value)(test)
    test()
    return {
        "cases": len(times),
        "refused": counts["refused"],
        "accepted": counts["accepted"],
        "crashes": len(crashes),
        "crashes_by_owner": dict(Counter(c["owner"] for c in crashes)),
        "crash_list": crashes[:50],
        "refusal": fam.refusal,
        "max_s": max(times, default=0.0),
        "median_s": statistics.median(times) if times else 0.0,
        "total_s": time.perf_counter() - started,
        "peak_traced_bytes_max": max(peaks, default=0),
        "peak_traced_bytes_median": statistics.median(peaks) if peaks else 0,
        "peak_over_bound_max": max(ratios, default=0.0),
        "remeasured": len(remeasured),
        "remeasured_first_peaks": sorted(remeasured)[-5:],
        "rss_growth_kib": rss_kib() - rss_before,
    }
