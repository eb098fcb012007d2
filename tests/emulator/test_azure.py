"""The Azure provider: azure-mgmt-compute/-network and DefaultAzureCredential against a local ARM fake."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from urllib.parse import urlencode

import pytest

from cloud_elastic.errors import ConfigError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers.api import Drain
from tests.emulator.fake_azure import TOKEN, VM
from tests.emulator.fixtures import azure_options, provider, record_sleeps

pytestmark = pytest.mark.emulator

VMSS = "/virtualMachineScaleSets/{}"
BUSY = {"error": {"code": "ServerBusy", "message": "The server is busy."}}


def _vms(prefix: str, count: int, **kw) -> list[VM]:
    return [VM(f"{prefix}{i}", ip=f"10.50.{i // 250}.{i % 250 + 1}", **kw) for i in range(count)]


def test_uniform_scale_set_states_map_to_ready_draining_absent(azure):
    v = azure.add_scale_set("sub-1", "rg-1", "uniform", _vms("u", 9))
    v[1].provisioning = "Deleting"
    v[2].power = "deallocating"
    v[3].power = "stopped"
    v[4].health = "unhealthy"
    v[5].provisioning, v[5].power = "Creating", "starting"
    v[6].provisioning = "Updating"  # an extension update keeps the VM running
    v[7].provisioning = "Failed"  # a failed extension on a VM that runs fine
    v[8].ip = None  # no NIC yet

    snapshot = provider("azure", azure_options(azure, "uniform")).find()

    assert dict(snapshot.ready) == {v[0].ip: 4, v[6].ip: 4, v[7].ip: 4}  # Standard_NC24s_v3: 4 GPUs
    assert dict(snapshot.draining) == {
        v[1].ip: Drain(None, "Deleting"),
        v[2].ip: Drain(None, "PowerState/deallocating"),
        v[4].ip: Drain(None, "unhealthy"),
    }
    assert dict(snapshot.instances) == {vm.ip: f"uniform_{i}" for i, vm in enumerate(v) if i in (0, 1, 2, 4, 6, 7)}


def test_failed_provisioning_is_judged_by_power_and_health(azure, caplog):
    v = azure.add_scale_set("sub-1", "rg-1", "failed", _vms("x", 3, provisioning="Failed"))
    v[1].health = "unhealthy"
    v[2].power = "stopped"
    caplog.set_level(logging.INFO, logger="cloud_elastic")
    discovery = provider("azure", azure_options(azure, "failed"))
    snapshot = discovery.find()
    assert dict(snapshot.ready) == {v[0].ip: 4}
    assert dict(snapshot.draining) == {v[1].ip: Drain(None, "unhealthy")}
    discovery.find()
    notes = [r.getMessage() for r in caplog.records if "provisioningState Failed" in r.getMessage()]
    assert len(notes) == 1 and "VM failed_0 is running" in notes[0]


def test_evicted_and_pooled_vms_are_absent_and_logged_once(azure, caplog):
    # A Spot VM evicted with the Deallocate policy stays deallocated; a standby pool keeps VMs deallocated
    # or running but not in service. None of them runs workers: absent, not draining forever.
    flex = azure.add_scale_set("sub-1", "rg-1", "spot", _vms("s", 4), mode="Flexible")
    flex[1].power = "deallocated"
    flex[2].standby, flex[2].power = True, "running"
    flex[3].standby, flex[3].power = True, "deallocated"
    discovery = provider("azure", azure_options(azure, "spot"))
    caplog.set_level(logging.INFO, logger="cloud_elastic")

    snapshot = discovery.find()
    assert dict(snapshot.ready) == {flex[0].ip: 4} and dict(snapshot.draining) == {}
    logged = sorted(r.getMessage().split(": ", 1)[1] for r in caplog.records if "not counted" in r.getMessage())
    assert logged == [f"instance s1 ({flex[1].ip}) is PowerState/deallocated; not counted",
                      f"instance s2 ({flex[2].ip}) is in the scale set's standby pool; not counted",
                      f"instance s3 ({flex[3].ip}) is in the scale set's standby pool; not counted"]
    caplog.clear()
    discovery.find()
    assert not [r for r in caplog.records if "not counted" in r.getMessage()]

    flex[2].standby = False  # the pool hands the VM to the scale set
    assert set(discovery.find().ready) == {flex[0].ip, flex[2].ip}


def test_hosts_are_ordered_by_creation_instant(azure):
    v = azure.add_scale_set("sub-1", "rg-1", "ordered", _vms("o", 3))
    # As strings these sort v0 < v1 < v2; as instants v2 (08:30Z) < v1 (08:59:59.9999999Z) < v0 (09:00:00.5Z).
    v[0].created = "2026-01-01T06:00:00.5000001-03:00"
    v[1].created = "2026-01-01T08:59:59.9999999+00:00"
    v[2].created = "2026-01-01T09:30:00.0000000+01:00"
    assert list(provider("azure", azure_options(azure, "ordered")).find().ready) == [v[2].ip, v[1].ip, v[0].ip]


def test_flexible_scale_set_joins_vms_with_resource_group_nics(azure):
    flex = azure.add_scale_set("sub-1", "rg-1", "flex", _vms("f", 3, size="Standard_NC6s_v3"), mode="Flexible")
    flex[2].provisioning = "Deleting"
    azure.add_scale_set("sub-1", "rg-1", "flex-other", [VM("other", ip="10.51.0.1")], mode="Flexible")

    snapshot = provider("azure", azure_options(azure, "flex")).find()

    assert dict(snapshot.ready) == {flex[0].ip: 1, flex[1].ip: 1}
    assert dict(snapshot.draining) == {flex[2].ip: Drain(None, "Deleting")}
    assert dict(snapshot.instances) == {vm.ip: vm.name for vm in flex}
    assert azure.count("/Microsoft.Network/networkInterfaces$") == 1


def test_the_fake_serves_each_mode_only_what_azure_serves_for_it(azure):
    """Guards the fake itself: were it lenient, a provider regressing to the other mode's API would still pass."""
    azure.add_scale_set("sub-1", "rg-1", "flex-only", _vms("fo", 1), mode="Flexible")
    azure.add_scale_set("sub-1", "rg-1", "uniform-only", _vms("uo", 1))
    rg = "/subscriptions/sub-1/resourceGroups/rg-1/providers"
    for route in ("Microsoft.Compute/virtualMachineScaleSets/flex-only/virtualMachines",
                  "Microsoft.Compute/virtualMachineScaleSets/flex-only/networkInterfaces"):
        status, body = _arm(azure, f"{rg}/{route}")
        assert (status, body["error"]["code"]) == (409, "OperationNotAllowed")
    vmss_id = f"{rg}/Microsoft.Compute/virtualMachineScaleSets/uniform-only"
    status, body = _arm(azure, f"{rg}/Microsoft.Compute/virtualMachines?"
                               + urlencode({"$filter": f"'virtualMachineScaleSet/id' eq '{vmss_id}'"}))
    assert (status, body["value"]) == (200, [])


def _arm(fake, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(f"{fake.url}{path}", headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def test_slots_from_sku_capabilities_fetched_once_and_slots_per_host_wins(azure):
    azure.add_scale_set("sub-1", "rg-1", "cpu", _vms("c", 2, size="Standard_D4s_v5"))
    discovery = provider("azure", azure_options(azure, "cpu"))
    assert set(discovery.find().ready.values()) == {1}  # no GPUs capability: one slot
    discovery.find()
    assert azure.count("/skus$") == 1
    assert azure.count(VMSS.format("cpu") + "$") == 1  # mode and location are read once

    azure.reset()
    pinned = provider("azure", azure_options(azure, "cpu"), slots_per_host=8).find()
    assert set(pinned.ready.values()) == {8} and azure.count("/skus$") == 0


def test_sizes_whose_sku_gpu_count_is_known_wrong_are_corrected_once_and_slots_per_host_wins(azure, caplog):
    vms = azure.add_scale_set("sub-1", "rg-1", "h100", _vms("h", 2, size="Standard_ND96isr_H100_v5"))
    caplog.set_level(logging.INFO, logger="cloud_elastic")
    discovery = provider("azure", azure_options(azure, "h100"))
    assert discovery.find().ready == {vms[0].ip: 8, vms[1].ip: 8}  # the SKU list says 12
    discovery.find()
    notes = [r.getMessage() for r in caplog.records if "Standard_ND96isr_H100_v5" in r.getMessage()]
    assert len(notes) == 1 and "has 8 GPU(s); the SKU list says 12" in notes[0]
    assert set(provider("azure", azure_options(azure, "h100"), slots_per_host=4).find().ready.values()) == {4}


def test_a_role_without_sku_read_is_fatal_with_advice_unless_slots_are_given(azure):
    vms = azure.add_scale_set("sub-1", "rg-1", "no-skus", _vms("n", 1))
    azure.fail("/skus$", 10, 403, {"error": {"code": "AuthorizationFailed", "message": "no skus/read"}})
    with pytest.raises(FatalDiscoveryError, match="needs Microsoft.Compute/skus/read.*--slots-per-host"):
        provider("azure", azure_options(azure, "no-skus")).find()
    assert provider("azure", azure_options(azure, "no-skus"), slots_per_host=4).find().ready == {vms[0].ip: 4}


def test_pages_are_followed_and_a_thousand_vms_cost_four_calls(azure):
    vms = azure.add_scale_set("sub-1", "rg-1", "large", _vms("l", 1000))
    discovery = provider("azure", azure_options(azure, "large"))
    discovery.find()
    azure.reset()
    assert set(discovery.find().ready) == {vm.ip for vm in vms}
    assert len(azure.log) == 4  # 2 pages of VMs, 2 pages of NICs at ARM's 500 per page


def test_429_with_retry_after_then_success_is_retried_by_the_sdk(azure):
    vms = azure.add_scale_set("sub-1", "rg-1", "throttled", _vms("t", 2))
    azure.fail(VMSS.format("throttled") + "/virtualMachines", 2, 429,
               {"error": {"code": "TooManyRequests", "message": "slow down"}}, {"Retry-After": "0"})
    assert set(provider("azure", azure_options(azure, "throttled")).find().ready) == {vm.ip for vm in vms}
    assert azure.count(VMSS.format("throttled") + "/virtualMachines") == 3


def test_persistent_5xx_is_retryable_after_max_attempts(azure):
    azure.add_scale_set("sub-1", "rg-1", "down", _vms("d", 1))
    azure.fail("/networkInterfaces", 100, 503, BUSY, {"Retry-After": "0"})
    with pytest.raises(RetryableDiscoveryError, match="busy"):
        provider("azure", azure_options(azure, "down", max_attempts="2")).find()
    assert azure.count("/networkInterfaces") == 2


def test_missing_scale_set_is_fatal(azure):
    with pytest.raises(FatalDiscoveryError, match=r"not found \(check the scale set, resource group and subscription\)"):
        provider("azure", azure_options(azure, "no-such-vmss")).find()


def test_forbidden_subscription_is_fatal(azure):
    azure.forbidden_subscriptions.add("sub-locked")
    with pytest.raises(FatalDiscoveryError, match="AuthorizationFailed"):
        provider("azure", azure_options(azure, "any", subscription="sub-locked")).find()


def test_credentials_that_cannot_get_a_token_are_fatal_before_any_arm_call(azure, monkeypatch):
    monkeypatch.setenv("IDENTITY_HEADER", "not-the-identity")
    with pytest.raises(FatalDiscoveryError, match="Azure credentials missing or refused") as err:
        provider("azure", azure_options(azure, "any")).find()
    assert "\n" not in str(err.value)
    assert azure.count("/subscriptions/") == 0


def test_subscription_from_the_environment(azure, monkeypatch):
    vms = azure.add_scale_set("sub-env", "rg-1", "env", _vms("e", 1))
    monkeypatch.setenv("AZURE_SUBSCRIPTION_ID", "sub-env")
    options = azure_options(azure, "env")
    del options["subscription"]
    assert set(provider("azure", options).find().ready) == {vms[0].ip}


def test_option_errors_are_config_errors(azure):
    options = azure_options(azure, "x")
    del options["subscription"]
    with pytest.raises(ConfigError, match="AZURE_SUBSCRIPTION_ID"):
        provider("azure", options)
    with pytest.raises(ConfigError, match="only allowed on loopback"):
        provider("azure", azure_options(azure, "x", endpoint="http://management.example.com"))


def test_a_retry_after_of_minutes_is_waited_timeout_s_at_most(azure, monkeypatch):
    """Found by review: azure-core follows a Retry-After however long, so one find() with timeout_s=1 and three
    attempts took a minute on a 429 saying 25 s (the driver waits for no call that long any more either)."""
    azure.add_scale_set("sub-1", "rg-1", "patient", _vms("p", 1))
    azure.fail(VMSS.format("patient") + "/virtualMachines", 100, 429,
               {"error": {"code": "TooManyRequests", "message": "slow down"}}, {"Retry-After": "25"})
    slept = record_sleeps(monkeypatch)
    with pytest.raises(RetryableDiscoveryError, match="slow down"):
        provider("azure", azure_options(azure, "patient", timeout_s="1", max_attempts="3")).find()
    assert [s for s in slept if s >= 1] == [1, 1]  # not 25 s each
