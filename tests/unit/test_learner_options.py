"""`atoll.LearnerOptions`: bad values stop in one line naming the value and what is allowed;
the secret never shows in its repr (a log line or traceback that prints the options)."""

import pytest

import atoll
from atoll.errors import ConfigError


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("heartbeat_s", 0, "heartbeat_s=0 is not allowed: a number > 0"),
        (
            "connect_timeout_s",
            float("nan"),
            "connect_timeout_s=nan is not allowed: a number > 0 (inf: for ever)",
        ),
        ("wait_s", -1.0, "wait_s=-1.0 is not allowed: a number >= 0 (inf: for ever)"),
        ("heartbeat_s", float("inf"), "heartbeat_s=inf is not allowed: a number > 0"),
        ("shape_mbps", "10", "shape_mbps='10' is not allowed: a number >= 0"),
        ("comm", "fast", "comm='fast' is not allowed: one of auto, process, thread"),
        ("switch_interval_s", 0.0, "switch_interval_s=0.0 is not allowed: a number > 0, or None"),
    ],
)
def test_a_bad_option_names_the_value_and_what_is_allowed(field, value, says):
    with pytest.raises(ConfigError) as e:
        atoll.LearnerOptions(**{field: value})
    assert str(e.value) == says


def test_the_secret_is_not_in_its_repr():
    o = atoll.LearnerOptions(learner_id="L0", secret="s3cret-value-42")
    assert "s3cret-value-42" not in repr(o) and "L0" in repr(o)
    assert o.secret == "s3cret-value-42"
