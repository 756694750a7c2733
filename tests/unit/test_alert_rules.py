"""The alert rules are one list of rule objects (backend/alerts/service.py RULES) beside the table in that module's
docstring: every kind of the table has its rule and its words in a stopped run's exit reason, and no rule is
outside the table."""
from __future__ import annotations

import re

from backend.alerts import service as alerts


def test_every_kind_of_the_table_has_its_rule_and_no_rule_is_outside_it():
    table = set(re.findall(r"^  (\w+)(?: / (\w+))? {2,}", alerts.__doc__ or "", re.MULTILINE))
    documented = {kind for row in table for kind in row if kind}
    assert documented == set(alerts.WHAT) == {k for rule in alerts.RULES for k in rule.kinds}
    assert all(alerts.WHAT.values())


def test_the_smoke_test_is_raised_first_and_the_stall_by_the_supervision_loop():
    first = alerts.RULES[0]
    assert first.kinds == ("probe_failed",)
    assert first.find is not None
    assert [rule.kinds for rule in alerts.RULES if rule.find is None] == [("stalled",)]  # the supervision loop's
