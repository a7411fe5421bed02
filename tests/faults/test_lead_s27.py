"""The lead's tests of session 27: changes made on helpers' reports, outside their scopes."""
from __future__ import annotations

import pytest

from turbotrain.errors import UserError
from turbotrain.monitor.rules import MonitorConfig


def test_webhook_retries_are_bounded():
    """Each try waits out its timeout: a billion tries would hold the first alert until the run ends."""
    with pytest.raises(UserError, match=r"^monitor.webhook_retries = 1000000000: at most 100 tries an alert$"):
        MonitorConfig(webhook_retries=1_000_000_000)
    assert MonitorConfig(webhook_retries=100).webhook_retries == 100
