"""The Azure provider: azure-mgmt-compute/-network and DefaultAzureCredential against a local ARM fake."""

from __future__ import annotations

import pytest

from cloud_elastic.errors import ConfigError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers.api import Drain
from tests.emulator.fake_azure import VM
from tests.emulator.fixtures import azure_options, provider

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
    v[7].provisioning = "Failed"
    v[8].ip = None  # no NIC yet

    snapshot = provider("azure", azure_options(azure, "uniform")).find()

    assert dict(snapshot.ready) == {v[0].ip: 4, v[6].ip: 4}  # Standard_NC24s_v3: 4 GPUs
    assert dict(snapshot.draining) == {
        v[1].ip: Drain(None, "Deleting"),
        v[2].ip: Drain(None, "PowerState/deallocating"),
        v[3].ip: Drain(None, "PowerState/stopped"),
        v[4].ip: Drain(None, "unhealthy"),
        v[7].ip: Drain(None, "provisioning Failed"),
    }


def test_flexible_scale_set_joins_vms_with_resource_group_nics(azure):
    flex = azure.add_scale_set("sub-1", "rg-1", "flex", _vms("f", 3, size="Standard_NC6s_v3"), mode="Flexible")
    flex[2].provisioning = "Deleting"
    azure.add_scale_set("sub-1", "rg-1", "flex-other", [VM("other", ip="10.51.0.1")], mode="Flexible")

    snapshot = provider("azure", azure_options(azure, "flex")).find()

    assert dict(snapshot.ready) == {flex[0].ip: 1, flex[1].ip: 1}
    assert dict(snapshot.draining) == {flex[2].ip: Drain(None, "Deleting")}
    assert azure.count("/Microsoft.Network/networkInterfaces$") == 1


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
