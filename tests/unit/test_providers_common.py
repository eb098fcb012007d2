"""Shared provider pieces: options, snapshots, slot cache, error classes, lazy SDK imports."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from cloud_elastic.errors import ConfigError, FatalDiscoveryError, MissingDependencyError, RetryableDiscoveryError
from cloud_elastic.providers import registry
from cloud_elastic.providers._common import (
    ABSENT,
    READY,
    OnceLog,
    OptionReader,
    SlotCache,
    SnapshotBuilder,
    absent,
    draining,
    error_for_status,
    one_line,
    parse_time,
)
from cloud_elastic.providers.api import Drain

CLOUDS = {
    "aws": ({"group": "g", "region": "us-east-1"}, "boto3", "boto3"),
    "gcp": ({"group": "g", "project": "p", "zone": "z"}, "google.cloud.compute_v1", "google.api_core"),
    "azure": ({"group": "g", "resource_group": "rg", "subscription": "s"}, "azure.mgmt.compute", "azure.core"),
    "ibm": ({"group": "g", "region": "us-south"}, "ibm_vpc", "ibm_cloud_sdk_core"),
}


def test_snapshot_builder_orders_oldest_first_then_by_address_and_leaving_wins():
    build = SnapshotBuilder("group")
    build.add("10.0.0.10", READY, lambda: 2, order="2026-01-02")
    build.add("10.0.0.9", READY, lambda: 2, order="2026-01-02")
    build.add("10.0.0.200", READY, lambda: 2, order="2026-01-01")
    build.add("10.0.0.5", READY, lambda: 1)
    build.add("10.0.0.5", draining("Deleting"), lambda: 1)  # same address, leaving: the safer reading
    build.add("10.0.0.6", ABSENT, lambda: pytest.fail("slots of an absent instance are never asked"))
    build.add(None, READY, lambda: 1, instance="no-ip-yet")
    snapshot = build.build()
    assert list(snapshot.ready) == ["10.0.0.200", "10.0.0.9", "10.0.0.10"]
    assert dict(snapshot.draining) == {"10.0.0.5": Drain(None, "Deleting")}


def test_creation_times_are_compared_as_instants_not_strings():
    # As strings these sort 09:00-07:00 < 10:00-08:00 < 17:00Z; as instants they are 16:00, 18:00 and 17:00 UTC.
    build = SnapshotBuilder("group")
    build.add("10.0.0.1", READY, lambda: 1, order="2026-01-01T10:00:00.000-08:00")
    build.add("10.0.0.2", READY, lambda: 1, order="2026-01-01T17:00:00Z")
    build.add("10.0.0.3", READY, lambda: 1, order="2026-01-01T09:00:00.000-07:00")
    build.add("10.0.0.4", READY, lambda: 1, order="2026-01-01T16:30:00.1234567+00:00")  # Azure's seven digits
    build.add("10.0.0.5", READY, lambda: 1, order="")  # unknown age: youngest
    assert list(build.build().ready) == ["10.0.0.3", "10.0.0.4", "10.0.0.2", "10.0.0.1", "10.0.0.5"]


@pytest.mark.parametrize(("text", "seconds"), [
    ("2026-01-01T00:00:00Z", 1767225600.0),
    ("2026-01-01T00:00:00.000-07:00", 1767225600.0 + 7 * 3600),
    ("2026-01-01 00:00:00+00:00", 1767225600.0),  # str() of a datetime (botocore's LaunchTime)
    ("2026-01-01T00:00:00", 1767225600.0),  # no offset: UTC
    ("", None), ("soon", None), (None, None),
])
def test_parse_time(text, seconds):
    assert parse_time(text) == seconds


def test_drains_carry_the_verdicts_deadline_and_instance_ids_are_kept():
    build = SnapshotBuilder("group")
    build.add("10.0.0.1", draining("PENDING_STOP", 1767225600.0), lambda: 1, instance="vm-1")
    build.add("10.0.0.2", draining("DELETING"), lambda: 1, instance="vm-2")
    build.add("10.0.0.3", READY, lambda: 1, instance="vm-3")
    snapshot = build.build()
    assert dict(snapshot.draining) == {"10.0.0.1": Drain(1767225600.0, "PENDING_STOP"), "10.0.0.2": Drain(None, "DELETING")}
    assert dict(snapshot.instances) == {"10.0.0.1": "vm-1", "10.0.0.2": "vm-2", "10.0.0.3": "vm-3"}


def test_absent_instances_with_a_reason_are_logged_once_and_again_after_they_cleared(caplog):
    once = OnceLog()
    caplog.set_level(logging.INFO, logger="cloud_elastic.providers._common")

    def cycle(*states):
        build = SnapshotBuilder("g", once=once)
        for name, verdict in states:
            build.add(None if verdict.kind == "absent" else "10.0.0.9", verdict, lambda: 1, instance=name)
        build.build()
        lines = [r.getMessage() for r in caplog.records]
        caplog.clear()
        return lines

    assert cycle(("vm-1", absent("PowerState/deallocated")), ("vm-2", ABSENT)) == [
        "g: instance vm-1 (no address) is PowerState/deallocated; not counted"]
    assert cycle(("vm-1", absent("PowerState/deallocated"))) == []
    assert cycle(("vm-1", READY)) == []
    assert len(cycle(("vm-1", absent("PowerState/deallocated")))) == 1


def test_an_instance_in_service_without_a_private_ipv4_is_warned_of_once(caplog):
    """An IPv6-only subnet: the job would wait for slots that never come, with nothing said at WARNING."""
    caplog.set_level(logging.WARNING, logger="cloud_elastic.providers._common")
    for _ in range(3):
        build = SnapshotBuilder("ipv6-group")
        build.add(None, READY, lambda: 1, instance="i-0ab6")
        build.add(None, draining("scale-in"), lambda: 1, instance="i-0cd7")
        build.add(None, ABSENT, lambda: 1, instance="i-0ef8")  # stopped: no address is expected
        assert build.build().ready == {}
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"ipv6-group: instance {i} is in service but has no private IPv4 address (an IPv6-only subnet?); "
        "cloud-elastic needs IPv4" for i in ("i-0ab6", "i-0cd7")]


def test_slot_cache_looks_each_type_up_once_gives_cpu_types_one_slot_and_fixed_wins():
    calls = []
    cache = SlotCache(lambda t: calls.append(t) or {"gpu": 8, "cpu": 0}[t], fixed=None)
    assert [cache.slots("gpu"), cache.slots("gpu"), cache.slots("cpu")] == [8, 8, 1]
    assert calls == ["gpu", "cpu"]
    assert SlotCache(lambda t: pytest.fail("no lookups"), fixed=3).slots("gpu") == 3


@pytest.mark.parametrize(("status", "kind"), [
    (None, RetryableDiscoveryError), (408, RetryableDiscoveryError), (429, RetryableDiscoveryError),
    (500, RetryableDiscoveryError), (503, RetryableDiscoveryError), (400, FatalDiscoveryError),
    (401, FatalDiscoveryError), (403, FatalDiscoveryError), (404, FatalDiscoveryError),
])
def test_status_classification(status, kind):
    assert type(error_for_status(status, "m")) is kind


def test_one_line_collapses_and_bounds_messages():
    assert one_line("a\n  b\tc") == "a b c"
    assert len(one_line("x" * 1000)) == 300


def test_option_reader_reports_bad_values_in_one_line():
    cls = registry.load("aws")
    read = OptionReader(cls, {"group": "g", "max_attempts": "many", "timeout_s": "-1", "endpoint_url": "vpce"})
    with pytest.raises(ConfigError, match="'max_attempts' must be an integer, got 'many'"):
        read.integer("max_attempts")
    with pytest.raises(ConfigError, match="'timeout_s' must be > 0"):
        read.seconds("timeout_s")
    with pytest.raises(ConfigError, match="must be an http"):
        read.endpoint("endpoint_url")
    assert OptionReader(cls, {"group": "g"}).integer("page_size", minimum=5) == 1000  # the declared default


@pytest.mark.parametrize("name", sorted(CLOUDS))
def test_a_missing_sdk_names_the_extra_to_install(name, monkeypatch):
    options, module, other = CLOUDS[name]
    for prefix in (module, other):
        # None in sys.modules makes "import x" raise ImportError, already-imported submodules included.
        for loaded in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")] or [prefix]:
            monkeypatch.setitem(sys.modules, loaded, None)
    discovery = registry.load(name).from_options(options)
    with pytest.raises(MissingDependencyError) as err:
        discovery.find()
    assert f"pip install 'cloud-elastic[{name}]'" in str(err.value)


def test_loading_and_configuring_every_cloud_provider_imports_no_sdk():
    code = textwrap.dedent(f"""
        import sys
        from cloud_elastic.providers import registry
        from cloud_elastic.providers.inspect import list_providers
        import io
        for name, (options, _, _) in {CLOUDS!r}.items():
            registry.load(name).from_options(options)
        sdks = ("boto3", "botocore", "google.cloud.compute_v1", "google.api_core", "azure.mgmt", "azure.core",
                "azure.identity", "ibm_vpc", "ibm_cloud_sdk_core")
        print(sorted(m for m in sys.modules if m.startswith(sdks)))
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
