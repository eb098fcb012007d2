"""The GCP provider: google-cloud-compute's REST client against a local Compute fake."""

from __future__ import annotations

import logging
import re

import pytest

from cloud_elastic.errors import ConfigError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers.api import Drain
from cloud_elastic.providers.gcp import GCPManagedInstanceGroup
from tests.emulator.fake_gcp import Member
from tests.emulator.fixtures import gcp_options, provider

pytestmark = pytest.mark.emulator

ZONE = "us-central1-a"
MIGS = "instanceGroupManagers/{}"
BUSY = {"error": {"code": 503, "message": "The service is currently unavailable.", "errors": []}}


def _members(prefix: str, count: int, zone: str = ZONE, **kw) -> list[Member]:
    return [Member(f"{prefix}-{i:04d}", zone, ip=f"10.40.{i // 250}.{i % 250 + 1}", **kw) for i in range(count)]


def test_zonal_group_states_map_to_ready_draining_absent(gcp):
    m = gcp.add_group("proj-1", "states", _members("states", 9, machine_type="a2-highgpu-4g"), zone=ZONE)
    m[1].action = "DELETING"
    m[2].action = "RECREATING"
    m[3].status, m[3].action = "STOPPING", "NONE"
    m[4].health = ["UNHEALTHY"]
    m[5].action = "CREATING"
    m[6].status = "STAGING"
    m[7].action = "VERIFYING"
    m[8].action = "REFRESHING"  # a config refresh that does not stop the VM

    snapshot = provider("gcp", gcp_options(gcp, "states")).find()

    assert dict(snapshot.ready) == {m[0].ip: 4, m[8].ip: 4}
    assert dict(snapshot.draining) == {
        m[1].ip: Drain(None, "DELETING"),
        m[2].ip: Drain(None, "RECREATING"),
        m[3].ip: Drain(None, "instance STOPPING"),
        m[4].ip: Drain(None, "unhealthy"),
    }


def test_stopped_suspended_and_terminated_instances_are_absent_and_logged_once(gcp, caplog):
    # A MIG's stopped and suspended pools (targetStoppedSize/targetSuspendedSize) and a preempted Spot VM
    # not yet recreated run nothing: they are no host at all, not hosts leaving forever.
    m = gcp.add_group("proj-1", "pools", _members("pools", 4), zone=ZONE)
    m[1].status, m[2].status, m[3].status = "STOPPED", "SUSPENDED", "TERMINATED"
    discovery = provider("gcp", gcp_options(gcp, "pools"))
    caplog.set_level(logging.INFO, logger="cloud_elastic")

    snapshot = discovery.find()
    assert dict(snapshot.ready) == {m[0].ip: 1} and dict(snapshot.draining) == {}
    logged = [r.getMessage() for r in caplog.records if "not counted" in r.getMessage()]
    assert sorted(re.search(r"instance (\S+) \(", line)[1] for line in logged) == sorted(x.instance_id for x in m[1:])
    assert any(line.endswith("is instance STOPPED; not counted") for line in logged)
    caplog.clear()
    discovery.find()
    assert not [r for r in caplog.records if "not counted" in r.getMessage()]


def test_drains_carry_the_deadline_the_group_or_instance_names(gcp):
    m = gcp.add_group("proj-1", "deadlines", _members("deadlines", 4), zone=ZONE)
    m[0].status, m[0].shutdown = "PENDING_STOP", ("2026-03-01T11:59:30.000-08:00", 90)  # graceful shutdown
    m[1].action, m[1].termination = "DELETING", "2026-03-01T20:00:00Z"
    m[2].status, m[2].termination_time = "STOPPING", "2026-03-01T12:00:00.000-08:00"  # Spot run-duration end
    m[3].termination_time = "2026-03-02T00:00:00Z"  # a far deadline does not drain a running host

    snapshot = provider("gcp", gcp_options(gcp, "deadlines")).find()

    assert dict(snapshot.draining) == {
        m[0].ip: Drain(1772395260.0, "instance PENDING_STOP"),  # 19:59:30Z + 90 s
        m[1].ip: Drain(1772395200.0, "DELETING"),
        m[2].ip: Drain(1772395200.0, "instance STOPPING"),
    }
    assert dict(snapshot.ready) == {m[3].ip: 1}


def test_hosts_are_ordered_by_creation_instant_whatever_the_offset(gcp):
    m = gcp.add_group("proj-1", "offsets", _members("offsets", 3), zone=ZONE)
    m[0].created = "2026-01-01T10:00:00.000-08:00"  # 18:00Z, the youngest
    m[1].created = "2026-01-01T09:00:00.000-07:00"  # 16:00Z, the oldest
    m[2].created = "2026-01-01T17:00:00.000-00:00"
    snapshot = provider("gcp", gcp_options(gcp, "offsets")).find()
    assert list(snapshot.ready) == [m[1].ip, m[2].ip, m[0].ip]
    assert dict(snapshot.instances) == {x.ip: x.instance_id for x in m}


def test_a_vm_recreated_under_the_same_name_is_a_new_instance(gcp):
    """A MIG recreate keeps the name (and often the IP) but makes a new VM with new host keys."""
    m = gcp.add_group("proj-1", "recreate", _members("recreate", 1), zone=ZONE)
    discovery = provider("gcp", gcp_options(gcp, "recreate"))
    before = discovery.find().instances[m[0].ip]
    m[0].id = "4242"
    assert discovery.find().instances[m[0].ip] == "4242" != before


def test_regional_group_spans_zones_with_one_filtered_list_per_zone(gcp):
    a = _members("regional", 2, zone="us-central1-a")
    b = [Member("regional-b0", "us-central1-b", ip="10.41.0.1"), Member("regional-b1", "us-central1-b", ip="10.41.0.2")]
    gcp.add_group("proj-1", "regional", a + b, region="us-central1")
    gcp.extra_instances[("proj-1", "us-central1-b")] = [Member("regional-bystander", "us-central1-b", ip="10.41.9.9")]

    snapshot = provider("gcp", gcp_options(gcp, "regional", region="us-central1")).find()

    assert set(snapshot.ready) == {x.ip for x in a + b}  # the bystander matches the name filter but is no member
    assert gcp.count("/zones/us-central1-a/instances$") == 1
    assert gcp.count("/zones/us-central1-b/instances$") == 1
    assert gcp.count("/regions/us-central1/instanceGroupManagers/regional/listManagedInstances") == 1


def test_slots_from_attached_gpus_machine_type_or_one_and_looked_up_once(gcp):
    attached = Member("slots-0", ZONE, ip="10.42.0.1", accelerators=2)  # N1 + 2 T4s
    builtin = Member("slots-1", ZONE, ip="10.42.0.2", machine_type="a2-highgpu-4g")
    cpu = Member("slots-2", ZONE, ip="10.42.0.3", machine_type="n1-standard-8")
    gcp.add_group("proj-1", "slots", [attached, builtin, cpu], zone=ZONE)

    discovery = provider("gcp", gcp_options(gcp, "slots"))
    assert discovery.find().ready == {"10.42.0.1": 2, "10.42.0.2": 4, "10.42.0.3": 1}
    discovery.find()
    assert gcp.count("/machineTypes/a2-highgpu-4g") == 1
    assert gcp.count("/machineTypes/n1-standard-8") == 1

    gcp.reset()
    pinned = provider("gcp", gcp_options(gcp, "slots"), slots_per_host=3).find()
    assert set(pinned.ready.values()) == {3} and gcp.count("/machineTypes/") == 0


def test_custom_and_unknown_machine_types_cannot_make_discovery_fatal(gcp, caplog):
    custom = Member("odd-0", ZONE, ip="10.42.1.1", machine_type="custom-8-30720")
    custom_n2 = Member("odd-1", ZONE, ip="10.42.1.2", machine_type="n2-custom-8-30720-ext")
    custom_gpu = Member("odd-2", ZONE, ip="10.42.1.3", machine_type="custom-12-79872", accelerators=2)
    unknown = Member("odd-3", ZONE, ip="10.42.1.4", machine_type="z9-future-8")  # machineTypes.get: 404
    gcp.add_group("proj-1", "odd", [custom, custom_n2, custom_gpu, unknown], zone=ZONE)
    discovery = provider("gcp", gcp_options(gcp, "odd"))
    caplog.set_level(logging.WARNING, logger="cloud_elastic")

    assert discovery.find().ready == {"10.42.1.1": 1, "10.42.1.2": 1, "10.42.1.3": 2, "10.42.1.4": 1}
    discovery.find()
    assert gcp.count("/machineTypes/custom") == 0 and gcp.count("/machineTypes/n2-custom") == 0
    assert gcp.count("/machineTypes/z9-future-8") == 1  # the 404 is remembered, not asked every cycle
    warnings = [r.getMessage() for r in caplog.records if "z9-future-8" in r.getMessage()]
    assert len(warnings) == 1 and "using 1 slot" in warnings[0]


def test_a_paginated_group_is_paged_and_a_pageless_one_answers_at_once(gcp):
    paged = gcp.add_group("proj-1", "paged", _members("paged", 5), zone=ZONE, list_results="PAGINATED")
    snapshot = provider("gcp", gcp_options(gcp, "paged", page_size="2")).find()
    assert set(snapshot.ready) == {x.ip for x in paged}
    assert gcp.count("/paged/listManagedInstances") == 3
    assert gcp.count(f"/zones/{ZONE}/instances$") == 3

    gcp.reset()
    pageless = gcp.add_group("proj-1", "pageless", _members("pageless", 5), zone=ZONE)  # the API's default
    snapshot = provider("gcp", gcp_options(gcp, "pageless", page_size="2")).find()
    assert set(snapshot.ready) == {x.ip for x in pageless}
    assert gcp.count("/pageless/listManagedInstances") == 1
    assert gcp.count(f"/zones/{ZONE}/instances$") == 3


@pytest.mark.parametrize(("list_results", "calls"), [("PAGELESS", 3), ("PAGINATED", 4)])
def test_a_thousand_instances_cost_three_or_four_calls_per_cycle(gcp, list_results, calls):
    gcp.add_group("proj-1", "large", _members("large", 1000), zone=ZONE, list_results=list_results)
    discovery = provider("gcp", gcp_options(gcp, "large"))
    discovery.find()
    gcp.reset()
    assert len(discovery.find().ready) == 1000
    # 1 (PAGELESS) or 2 (PAGINATED, 500 a page) listManagedInstances, and 2 pages of instances.list
    assert len(gcp.log) == calls
    assert gcp.count("/listManagedInstances") == calls - 2


def test_instances_named_outside_the_base_name_are_read_one_by_one(gcp):
    odd = Member("stateful-worker", ZONE, ip="10.43.0.9")
    gcp.add_group("proj-1", "named", [*_members("named", 2), odd], zone=ZONE, base="named")
    snapshot = provider("gcp", gcp_options(gcp, "named")).find()
    assert odd.ip in snapshot.ready
    assert gcp.count(f"/instances/{odd.name}$") == 1


def test_429_then_success_is_retried_by_the_sdk(gcp):
    members = gcp.add_group("proj-1", "throttled", _members("throttled", 2), zone=ZONE)
    gcp.fail("/listManagedInstances", 2, 429, {"error": {"code": 429, "message": "Rate Limit Exceeded"}})
    assert set(provider("gcp", gcp_options(gcp, "throttled")).find().ready) == {x.ip for x in members}
    assert gcp.count("/listManagedInstances") == 3


def test_persistent_5xx_is_retryable_and_bounded_by_the_deadline(gcp):
    gcp.add_group("proj-1", "down", _members("down", 1), zone=ZONE)
    gcp.fail("/instances$", 100, 503, BUSY)
    with pytest.raises(RetryableDiscoveryError, match="still failing after retrying for 1s"):
        provider("gcp", gcp_options(gcp, "down", retry_deadline_s="1")).find()
    # Full-jitter back-off (up to 0.5 s, 1 s, 2 s...) within a 1 s deadline: a handful of attempts, not a storm.
    assert 2 <= gcp.count("/instances$") <= 6


@pytest.mark.parametrize("options", [
    {"group": "no-such-group"},
    {"group": "states", "zone": "europe-west4-a"},
    {"group": "states", "project": "other-project"},
])
def test_missing_group_zone_or_project_is_fatal(gcp, options):
    gcp.add_group("proj-1", "states", _members("states", 1), zone=ZONE)
    with pytest.raises(FatalDiscoveryError, match="was not found .check the group name, project and zone/region.$"):
        provider("gcp", {**gcp_options(gcp, "x"), **options}).find()


def test_forbidden_project_is_fatal(gcp):
    gcp.forbidden_projects.add("locked")
    with pytest.raises(FatalDiscoveryError, match="Required 'compute.instanceGroupManagers.get' permission"):
        provider("gcp", gcp_options(gcp, "any", project="locked")).find()


def test_credentials_the_api_refuses_are_fatal(gcp, monkeypatch, tmp_path):
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(gcp.write_adc(tmp_path, "intruder@test.iam.gserviceaccount.com")))
    with pytest.raises(FatalDiscoveryError, match="invalid authentication credentials"):
        provider("gcp", gcp_options(gcp, "any")).find()


def test_missing_credentials_are_fatal_before_any_api_call(gcp, monkeypatch):
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    with pytest.raises(FatalDiscoveryError, match="no usable Google credentials"):
        provider("gcp", gcp_options(gcp, "any")).find()
    assert gcp.log == []


@pytest.mark.parametrize("retryable", ["transport", "flag", "neither"])
def test_a_token_refresh_that_could_not_reach_the_metadata_server_is_retryable(monkeypatch, retryable):
    # What google-auth's compute_engine credentials raise for a metadata server 5xx or a dropped connection.
    import google.auth.exceptions as ga

    def refresh_fails(self):
        self.sdk  # loaded, as the real _discover loads it before any call
        if retryable == "transport":
            raise ga.RefreshError("metadata server: 503") from ga.TransportError("503 Service Unavailable")
        raise ga.RefreshError("token endpoint: internal_failure", retryable=retryable == "flag")

    monkeypatch.setattr(GCPManagedInstanceGroup, "_discover", refresh_fails)
    discovery = GCPManagedInstanceGroup("gpus", project="proj-1", zone=ZONE)
    expected = FatalDiscoveryError if retryable == "neither" else RetryableDiscoveryError
    with pytest.raises(expected) as err:
        discovery.find()
    assert type(err.value) is expected  # RetryableDiscoveryError is no FatalDiscoveryError, but be exact
    if retryable != "neither":
        assert "could not refresh the access token" in str(err.value)


@pytest.mark.parametrize(("options", "message"), [
    ({"zone": "a", "region": "b"}, "exactly one of options 'zone' and 'region'"),
    ({"zone": ""}, "exactly one of options 'zone' and 'region'"),
    ({"group": "Not_A_Name"}, "not a valid instance group name"),
    ({"page_size": "501"}, "between 1 and 500"),
])
def test_option_errors_are_config_errors(gcp, options, message):
    with pytest.raises(ConfigError, match=message):
        provider("gcp", {**gcp_options(gcp, "ok"), **options})
