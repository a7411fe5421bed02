"""The non-finite-loss guard counts non-finite steps, not the steps between two log lines."""
import math

import pytest

from turbotrain.monitor.alerts import Alerts, NonFiniteLoss


def test_one_bad_step_at_a_sparse_log_step_does_not_stop():
    a = Alerts(max_bad_steps=3)
    a.check_loss(2.0, step=50, bad_streak=0, final=False)
    a.check_loss(math.inf, step=100, bad_streak=1, final=False)  # 50 steps since the last log, one of them bad
    a.check_loss(1.9, step=150, bad_streak=0, final=False)


def test_a_streak_reaching_the_limit_stops_and_names_the_step():
    a = Alerts(max_bad_steps=3)
    with pytest.raises(NonFiniteLoss, match=r"step 12.*3 step"):
        a.check_loss(math.nan, step=12, bad_streak=3, final=False)


def test_a_non_finite_last_step_always_stops():
    with pytest.raises(NonFiniteLoss):
        Alerts(max_bad_steps=5).check_loss(math.nan, step=20, bad_streak=1, final=True)
