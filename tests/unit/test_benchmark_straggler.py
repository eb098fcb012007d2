"""The straggler benchmark's false-drain margin is the straggler rule's own: a worker's compute time against
the median of the OTHER workers' (under --whole-hosts, of the other hosts'), not a median that counts it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
try:
    import straggler  # noqa: E402  (benchmarks/ is not a package)
finally:
    sys.path.remove(str(BENCHMARKS))


def _status(hosts: dict[str, list[float]], whole: bool = False) -> dict:
    return {"whole_host_slots": whole, "median_compute_s": None,
            "hosts": [{"host": h, "workers": [{"slot": i, "worker": f"{h}[{i}]#1", "compute_s": c}
                                              for i, c in enumerate(cs)]} for h, cs in hosts.items()]}


def test_the_margin_is_against_the_median_of_the_other_workers():
    # Median of all three: 1.2, so 1.5x; the rule holds 1.8 against the others' median, (1.0 + 1.2) / 2.
    ratio = straggler.largest_ratio(_status({"a": [1.0], "b": [1.2], "c": [1.8]}))
    assert ratio == pytest.approx(1.8 / 1.1)


def test_under_whole_hosts_the_margin_is_against_the_other_hosts():
    ratio = straggler.largest_ratio(_status({"a": [1.0, 1.0], "b": [2.0, 3.0]}, whole=True))
    assert ratio == pytest.approx(3.0 / 1.0)


def test_no_margin_without_two_measured_workers():
    assert straggler.largest_ratio(_status({"a": [1.0], "b": [None]})) is None

