"""The documentation says what the code does: the fields of ``status JOB --json``, the sources of ``notice``
events, and which metrics are always served.

A reviewer found ``status --json``'s fields documented nowhere (the README said "--json for scripts"), the
``operator`` source of ``cloud-elastic drain`` missing from docs/events.md (it counts in
``cloud_elastic_notices_total{source="operator"}``), ``soft: false`` read as "a termination" although a rebalance
under ``--drain-on-rebalance`` is written so, and the README saying the ``_cost_*`` metrics appear "with several
priced host sources" while all four are always served, at 0."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from cloud_elastic.driver.job.status_reply import _STATE_WORDS
from cloud_elastic.metrics import MetricsServer
from cloud_elastic.notices.api import SOURCES
from cloud_elastic.protocol_status import BlacklistedSlot, HostStatus, PendingNotice, StatusReply, WorkerStatus
from cloud_elastic.worker.termination import SOURCE as SIGTERM_SOURCE
from tests.unit.test_job import started

pytestmark = pytest.mark.timeout(30)

REPO = Path(__file__).resolve().parents[2]
EVENTS = (REPO / "docs" / "events.md").read_text()
README = (REPO / "README.md").read_text()


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = re.search(r"^#{2,3} ", text[start + len(heading):], re.M)
    return text[start:start + len(heading) + end.start()] if end else text[start:]


def _named(text: str) -> set[str]:
    """The backticked names of ``text``, a list's (``hosts[].workers[]``) as its parts (``hosts``, ``workers``)."""
    names = set()
    for token in re.findall(r"`([^`]+)`", text):
        names |= {token, *(part.removesuffix("[]") for part in token.split("."))}
    return names


def test_every_field_of_the_status_reply_is_documented_and_nothing_else() -> None:
    section = _section(EVENTS, "## Status JSON")
    named = _named(section)
    fields = {f.name for f in dataclasses.fields(StatusReply)}
    for record in (HostStatus, WorkerStatus, BlacklistedSlot, PendingNotice):
        fields |= {f.name for f in dataclasses.fields(record)}
    missing = fields - named
    assert not missing, f"status --json fields not in docs/events.md: {sorted(missing)}"
    rows = re.findall(r"^\| (`[^|]+`) \|", section, re.M)
    listed = {name.removesuffix("[]") for row in rows for name in re.findall(r"`([^`.]+)`", row)}
    assert listed and listed <= fields, f"rows naming no field: {sorted(listed - fields)}"
    for word in ("waiting for slots", "starting", "training", "below --min-np", "finishing", "done",
                 *_STATE_WORDS.values(), "spare"):
        assert f"`{word}`" in section, word
    assert '{"job", "running": false, "ended_at", "how"}' in section  # the ended job's object


def test_the_readme_links_the_status_fields_from_its_status_section() -> None:
    assert "docs/events.md#status-json" in _section(README, "- **Status**")


def test_every_notice_source_is_documented_the_operators_too() -> None:
    sim = started(3, {"a": 1, "b": 1, "c": 1}, min_np=1)
    assert sim.job.drain("c", None, sim.now)[0]
    sim.advance(0.5)
    operator = [f["source"] for kind, f in sim.events if kind == "notice"]
    assert operator == ["operator"]
    section = _section(EVENTS, "### `notice`")
    for source in (*SOURCES, SIGTERM_SOURCE, *operator):
        assert f"`{source}`" in section, source


def test_soft_false_is_said_to_cover_a_rebalance_under_drain_on_rebalance() -> None:
    soft = next(line for line in _section(EVENTS, "### `notice`").split("\n- ") if line.startswith("`soft`"))
    assert "--drain-on-rebalance" in soft, soft


def test_the_cost_metrics_are_always_served_and_the_readme_says_they_read_0() -> None:
    value = MetricsServer("j", 0).registry.get_sample_value
    for name in ("cost_dollars_total", "cost_dollars_per_hour", "cost_unpriced_slot_hours_total",
                 "cost_idle_slot_hours_total"):
        assert value(f"cloud_elastic_{name}") == 0.0, name
    metrics = " ".join(_section(README, "- **Metrics**").split())
    assert "with several priced host sources `_cost_dollars_total`" not in metrics
    assert "always served, they read 0" in metrics
