"""Whether a (re)joining learner resumes, and from another epoch: decided once, in the core
(atoll.core.admission.resume_of); the wire only translates a Hello's fields."""

from __future__ import annotations

from atoll.core.admission import rejoin, resume_of
from atoll.core.messages import Resume
from atoll.wire import convert

KNOWN = ("e-old", "e-now")


def test_a_fresh_learner_has_no_past():
    assert resume_of([], [], "", "e-now", KNOWN, keep_progress=False) is None


def test_same_epoch_is_not_another_epoch():
    r = resume_of([1, 2], [3, 4], "e-now", "e-now", KNOWN, keep_progress=True)
    assert r == Resume((1, 2), (3, 4), other_epoch=False, keep_progress=True)


def test_an_earlier_epoch_of_this_run_is_checked():
    r = resume_of([1], [3], "e-old", "e-now", KNOWN, keep_progress=False)
    assert r == Resume((1,), (3,), other_epoch=True, keep_progress=False)


def test_an_epoch_this_syncer_never_had_gives_nothing_to_check_by():
    r = resume_of([1], [3], "e-elsewhere", "e-now", KNOWN, keep_progress=True)
    assert r is not None and not r.other_epoch and r.keep_progress


def test_no_epoch_but_keeping_progress_resumes_without_a_check():
    r = resume_of([0], [0], "", "e-now", KNOWN, keep_progress=True)
    assert r == Resume((0,), (0,), other_epoch=False, keep_progress=True)


def test_the_wire_translates_a_hello_to_the_same_decision():
    h = convert.hello("L0", "i1", Resume((1, 2), (3, 4)), epoch="e-old")
    assert convert.resume_from_hello(h, "e-now", KNOWN) == Resume((1, 2), (3, 4), True, True)
    fresh = convert.hello("L0", "i1", None)
    assert convert.resume_from_hello(fresh, "e-now", KNOWN) is None


def test_what_a_learner_says_at_a_rejoin_comes_back_as_the_same_decision():
    """The learner's half (admission.rejoin, both drivers' hellos) and the syncer's half
    (resume_of through the wire) agree: nothing trained is a fresh learner, a heal asked for
    gives up the progress, otherwise it is kept."""
    assert rejoin(None) is None and rejoin(None, heal=True) is None
    kept = rejoin(([1, 2], [3, 4]))
    assert kept == Resume((1, 2), (3, 4), other_epoch=False, keep_progress=True)
    healing = rejoin(([1, 2], [3, 4]), heal=True)
    assert healing is not None and not healing.keep_progress
    assert rejoin(([1], [1]), other_epoch=True).other_epoch
    for said in (kept, healing):
        h = convert.hello("L0", "i1", said, epoch="e-now")
        assert convert.resume_from_hello(h, "e-now", KNOWN) == said
