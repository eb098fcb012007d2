"""The driver's progress line below ``--min-np``: what it waits for and for how long, on a fake clock.

(Waiting for ``-np`` slots at start-up is shown by tests/integration/test_progress.py.)
"""

from __future__ import annotations

import logging
import re

import pytest

from cloud_elastic.driver.job.elastic_job import PROGRESS_EVERY_S
from tests.unit.test_job import T0, Sim, started

pytestmark = pytest.mark.timeout(10)

TICK_S = 0.5  # Sim.advance's step
_LINE = re.compile(r"^job t: below --min-np 2: (\d+) worker\(s\) ready(?: \((\d+) more starting\))? \(waiting for (\d+)s\)(?:; held back: .*)?$")


def _progress_lines(sim: Sim, caplog: pytest.LogCaptureFixture, until: float) -> list[tuple[float, str]]:
    """Advance the clock to ``until`` (seconds after T0) in driver ticks; each progress line with when it came."""
    lines = []
    while sim.now < T0 + until:
        caplog.clear()
        sim.advance(TICK_S)
        lines += [(sim.now - T0, r.getMessage()) for r in caplog.records
                  if r.name.startswith("cloud_elastic.driver.job") and r.levelno == logging.INFO
                  and "below --min-np" in r.getMessage()]
    return lines


def _parsed(lines: list[tuple[float, str]]) -> list[tuple[float, int, int, int]]:
    """(when, workers ready, workers starting, seconds waited) of each line; every line must have the format."""
    parsed = []
    for when, text in lines:
        match = _LINE.match(text)
        assert match, text
        parsed.append((when, *(int(g or 0) for g in match.groups())))  # no "more starting": 0
    return parsed


def _check_times(lines: list[tuple[float, int, int, int]], began: float) -> None:
    """Each line says how long the wait has lasted, to within one driver tick (the lines are
    decided at ticks); they come PROGRESS_EVERY_S apart, the first one PROGRESS_EVERY_S in."""
    for when, _, _, waited in lines:
        assert abs(waited - (when - began)) <= TICK_S, (when, began, waited)
    assert abs(lines[0][0] - began - PROGRESS_EVERY_S) <= TICK_S
    assert all(b[0] - a[0] == PROGRESS_EVERY_S for a, b in zip(lines, lines[1:]))


def test_below_min_np_a_progress_line_says_what_is_missing_and_how_long_the_wait_has_lasted(caplog) -> None:
    caplog.set_level(logging.INFO, logger="cloud_elastic")
    sim = started(2, {"a": 2}, cooldown=(20, 20), elastic_timeout_s=300)
    sim.exit("a[1]")  # the wait starts now (T0): one worker left, --min-np 2, the slot cools down for 20 s
    sim.join("a[0]", reason="failure")
    assert any("below --min-np 2; waiting up to 300s" in r.getMessage() for r in caplog.records)

    lines = _parsed(_progress_lines(sim, caplog, 34))
    # Every PROGRESS_EVERY_S, not every tick; the replacement launched at T0+20 s shows as "starting".
    assert [(ready, starting, waited) for _, ready, starting, waited in lines] == [(1, 0, 15), (1, 1, 30)], lines
    _check_times(lines, began=0.0)

    # The replacement reaches rendezvous: the round forms, the wait is over and the lines stop.
    sim.join("a[1]")
    assert sim.layout() == ["a[0]", "a[1]"]
    assert _progress_lines(sim, caplog, 70) == []

    # A new wait is measured from its own start, not from the first one's.
    sim.exit("a[1]")
    sim.join("a[0]", reason="failure")
    began = sim.now - T0
    lines = _parsed(_progress_lines(sim, caplog, began + PROGRESS_EVERY_S + 1))
    assert [(ready, starting, waited) for _, ready, starting, waited in lines] == [(1, 0, 15)], lines
    _check_times(lines, began)
    assert sim.outcome is None


def test_the_progress_line_says_why_listed_hosts_take_no_worker(caplog) -> None:
    # Review s63 rvU finding 8: after every worker left on a notice the wait said "0 worker(s) ready" for minutes,
    # with free hosts listed, and no word on the notice that held them back until it lapsed.
    from cloud_elastic.driver.job.hosts import NOTICE_GRACE_S
    from tests.unit.test_job_fixed_hosts import out_for_good_then_notice

    caplog.set_level(logging.INFO, logger="cloud_elastic")
    sim = out_for_good_then_notice()  # c[0] out for good, b noticed (deadline 30 s), a[0] alone below --min-np 2
    noticed_at = sim.now - 5
    lines = _progress_lines(sim, caplog, sim.now - T0 + PROGRESS_EVERY_S + 1)
    assert lines, "no progress line"
    when, line = lines[0]
    lapses = round(noticed_at + 30 + NOTICE_GRACE_S - (T0 + when))
    assert line.endswith(f"; held back: b (notice pending, lapses in {lapses}s if still listed), "
                         "c (1 slot(s) blacklisted for the rest of the job)"), line
