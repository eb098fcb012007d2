"""The IBM provider: ibm-vpc's VpcV1 and IAM authenticator against a local VPC fake."""

from __future__ import annotations

import logging

import pytest

from cloud_elastic.errors import ConfigError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers.api import Drain
from tests.emulator.fake_ibm import Member
from tests.emulator.fixtures import ibm_options, provider, record_sleeps

pytestmark = pytest.mark.emulator

BUSY = {"errors": [{"code": "service_unavailable", "message": "The service is busy."}], "trace": "t"}


def _members(prefix: str, count: int, **kw) -> list[Member]:
    return [Member(f"{prefix}-{i}", ip=f"10.60.{i // 250}.{i % 250 + 1}", **kw) for i in range(count)]


def test_membership_and_instance_states_map_to_ready_draining_absent(ibm):
    m = ibm.add_group("grp-states", _members("s", 12))
    m[1].membership = "deleting"
    m[2].membership = "unhealthy"
    m[3].status, m[3].reasons = "stopping", ["stopped_by_preemption"]
    m[4].status = "stopping"
    m[5].membership = "pending"
    m[6].status = "starting"
    m[7].attachment = True  # address on primary_network_attachment
    m[8].membership = "failed"
    m[9].health = "faulted"  # running, but the platform says it is broken
    m[10].health = "degraded"  # still runs
    m[11].lifecycle = "suspended"

    snapshot = provider("ibm", ibm_options(ibm, "grp-states")).find()

    assert dict(snapshot.ready) == {m[0].ip: 2, m[7].ip: 2, m[10].ip: 2}  # gx2-16x128x2v100: 2 V100s
    assert dict(snapshot.draining) == {
        m[1].ip: Drain(None, "membership deleting"),
        m[2].ip: Drain(None, "membership unhealthy"),
        m[3].ip: Drain(None, "preempted"),
        m[4].ip: Drain(None, "instance stopping"),
        m[8].ip: Drain(None, "membership failed"),
        m[9].ip: Drain(None, "instance faulted"),
        m[11].ip: Drain(None, "instance suspended"),
    }
    # Hosts are named by instance id (what IBM's API and events use), not by the mutable instance name.
    assert snapshot.instances[m[0].ip] == f"i-{m[0].name}"


def test_stopped_instances_are_absent_and_logged_once(ibm, caplog):
    m = ibm.add_group("grp-stopped", _members("st", 3))
    m[1].status, m[1].reasons = "stopped", ["stopped_by_preemption"]
    m[2].status = "stopped"
    discovery = provider("ibm", ibm_options(ibm, "grp-stopped"))
    caplog.set_level(logging.INFO, logger="cloud_elastic")
    snapshot = discovery.find()
    assert dict(snapshot.ready) == {m[0].ip: 2} and dict(snapshot.draining) == {}
    logged = sorted(r.getMessage().split(": ", 1)[1] for r in caplog.records if "not counted" in r.getMessage())
    assert logged == [f"instance i-st-1 ({m[1].ip}) is preempted; not counted",
                      f"instance i-st-2 ({m[2].ip}) is instance stopped; not counted"]
    caplog.clear()
    discovery.find()
    assert not [r for r in caplog.records if "not counted" in r.getMessage()]


def test_the_instances_own_gpu_count_wins_over_its_profile(ibm, caplog):
    # gx3d-160x1792x8h100's profile gpu_count is "dependent": only the instance can say.
    ibm.add_group("grp-gpu", [Member("h", ip="10.62.0.1", profile="gx3d-160x1792x8h100", gpus=8),
                              Member("l", ip="10.62.0.2", profile="gx3-16x80x1l4", gpus=1),
                              Member("d", ip="10.62.0.3", profile="gx3d-160x1792x8h100")])
    caplog.set_level(logging.WARNING, logger="cloud_elastic")
    discovery = provider("ibm", ibm_options(ibm, "grp-gpu"))
    assert discovery.find().ready == {"10.62.0.1": 8, "10.62.0.2": 1, "10.62.0.3": 1}
    discovery.find()
    assert ibm.count("/instance/profiles/") == 1  # only for the instance that states no GPUs
    assert len([r for r in caplog.records if "dependent GPU count" in r.getMessage()]) == 1


def test_hosts_are_ordered_by_creation_instant_whatever_its_notation(ibm):
    m = ibm.add_group("grp-order", _members("o", 3))
    # As strings these sort o-0 < o-1 < o-2 ("." before "Z" before "+"), and by address too;
    # as instants o-2 (08:30Z) < o-1 (09:00Z) < o-0 (09:00:00.5Z).
    m[0].created = "2026-01-01T09:00:00.500Z"
    m[1].created = "2026-01-01T09:00:00Z"
    m[2].created = "2026-01-01T10:30:00+02:00"
    assert list(provider("ibm", ibm_options(ibm, "grp-order")).find().ready) == [m[2].ip, m[1].ip, m[0].ip]


def test_slots_from_profiles_looked_up_once_and_slots_per_host_wins(ibm):
    ibm.add_group("grp-slots", [Member("a", ip="10.61.0.1", profile="gx3-16x80x1l4"),
                                Member("b", ip="10.61.0.2", profile="bx2-4x16")])
    discovery = provider("ibm", ibm_options(ibm, "grp-slots"))
    assert discovery.find().ready == {"10.61.0.1": 1, "10.61.0.2": 1}
    discovery.find()
    assert ibm.count("/instance/profiles/") == 2
    assert ibm.count("/instance_groups/grp-slots$") == 1  # the group is checked once

    ibm.reset()
    assert set(provider("ibm", ibm_options(ibm, "grp-slots"), slots_per_host=4).find().ready.values()) == {4}
    assert ibm.count("/instance/profiles/") == 0


def test_pages_are_followed(ibm):
    members = ibm.add_group("grp-paged", _members("p", 5))
    snapshot = provider("ibm", ibm_options(ibm, "grp-paged", page_size="2")).find()
    assert set(snapshot.ready) == {x.ip for x in members}
    assert ibm.count("/memberships$") == 3 and ibm.count("/v1/instances$") == 3


def test_a_thousand_instances_cost_twenty_calls_at_the_api_page_cap(ibm):
    ibm.add_group("grp-large", _members("l", 1000))
    discovery = provider("ibm", ibm_options(ibm, "grp-large"))
    discovery.find()
    ibm.reset()
    assert len(discovery.find().ready) == 1000
    assert ibm.count("/memberships$") == 10 and ibm.count("/v1/instances$") == 10 and len(ibm.log) == 20


def test_429_then_success_is_retried_by_the_sdk(ibm):
    members = ibm.add_group("grp-throttled", _members("t", 2))
    ibm.fail("/memberships$", 1, 429, {"errors": [{"code": "too_many_requests", "message": "slow down"}]},
             {"Retry-After": "0"})
    assert set(provider("ibm", ibm_options(ibm, "grp-throttled")).find().ready) == {x.ip for x in members}
    assert ibm.count("/memberships$") == 2


def test_persistent_5xx_is_retryable_after_max_attempts(ibm):
    ibm.add_group("grp-down", _members("d", 1))
    ibm.fail("/v1/instances$", 100, 503, BUSY)
    with pytest.raises(RetryableDiscoveryError, match="still failing after 2 attempts"):
        provider("ibm", ibm_options(ibm, "grp-down", max_attempts="2")).find()
    assert ibm.count("/v1/instances$") == 2


def test_missing_group_is_fatal(ibm):
    with pytest.raises(FatalDiscoveryError, match=r"HTTP 404: .*\(check the instance group ID and region\)$"):
        provider("ibm", ibm_options(ibm, "no-such-group")).find()


def test_api_key_iam_refuses_is_fatal(ibm, monkeypatch):
    monkeypatch.setenv("IBMCLOUD_API_KEY", "revoked")
    with pytest.raises(FatalDiscoveryError, match="IAM refused the API key"):
        provider("ibm", ibm_options(ibm, "any")).find()
    assert ibm.count("/v1/") == 0


def test_missing_credentials_are_fatal_before_any_request(ibm, monkeypatch):
    monkeypatch.delenv("IBMCLOUD_API_KEY")
    with pytest.raises(FatalDiscoveryError, match="no IBM Cloud credentials; set IBMCLOUD_API_KEY"):
        provider("ibm", ibm_options(ibm, "any")).find()
    assert ibm.log == []


def test_sdk_environment_configuration_is_honoured_and_a_refused_token_is_fatal(ibm, monkeypatch):
    members = ibm.add_group("grp-env", _members("e", 1))
    monkeypatch.delenv("IBMCLOUD_API_KEY")
    monkeypatch.setenv("VPC_AUTH_TYPE", "bearerToken")
    monkeypatch.setenv("VPC_BEARER_TOKEN", "a-token-from-elsewhere")
    monkeypatch.setenv("VPC_URL", f"{ibm.url}/v1")
    options = {"group": "grp-env", "region": "us-south"}  # no endpoint: VPC_URL applies
    with pytest.raises(FatalDiscoveryError, match=r"HTTP 401: .*check the IBM Cloud API key"):
        provider("ibm", options).find()
    ibm.tokens.add("a-token-from-elsewhere")
    assert set(provider("ibm", options).find().ready) == {members[0].ip}


@pytest.mark.parametrize(("options", "message"), [
    ({"region": "Dallas"}, "not a VPC region name"),
    ({"page_size": "101"}, "between 1 and 100"),
    ({"endpoint": "ftp://x"}, "must be an http"),
    ({"max_attempts": "0"}, "between 1 and 20"),
])
def test_option_errors_are_config_errors(ibm, options, message):
    with pytest.raises(ConfigError, match=message):
        provider("ibm", {**ibm_options(ibm, "g"), **options})


def test_a_retry_after_of_minutes_is_waited_timeout_s_at_most(ibm, monkeypatch):
    """Found by review: urllib3 follows a Retry-After for up to 6 hours, so one find() with timeout_s=1 and three
    attempts took a minute on a 429 saying 25 s (the driver waits for no call that long any more either)."""
    ibm.add_group("grp-patient", _members("p", 1))
    ibm.fail("/memberships$", 100, 429, {"errors": [{"code": "too_many_requests", "message": "slow down"}]},
             {"Retry-After": "25"})
    slept = record_sleeps(monkeypatch)
    with pytest.raises(RetryableDiscoveryError, match="still failing after 3 attempts"):
        provider("ibm", ibm_options(ibm, "grp-patient", timeout_s="1", max_attempts="3")).find()
    assert [s for s in slept if s >= 1] == [1, 1]  # not 25 s each
