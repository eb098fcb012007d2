"""Azure Virtual Machine Scale Set discovery (``--azure-vmss NAME``).

Both orchestration modes. The scale set is read once (``virtualMachineScaleSets.get``:
mode and location). Then each :meth:`~AzureScaleSet.find` lists

* **Uniform**: the scale set's VMs with their instance view
  (``virtualMachineScaleSetVMs.list $expand=instanceView``) and its network
  interfaces (the Network provider's ``.../virtualMachineScaleSets/NAME/networkInterfaces``);
* **Flexible**: the resource group's VMs filtered on the scale set
  (``virtualMachines.list $filter='virtualMachineScaleSet/id' eq ...``, with instance
  view) and the resource group's network interfaces;

and joins them on the VM id for the primary NIC's primary private IP. Each
mode is read only through the routes Azure serves for it: a Flexible scale
set refuses the Uniform VM and NIC lists, and a Uniform one has no
``virtualMachines`` resources. GPU counts come from the resource SKUs of the
location (capability ``GPUs``), read once, with a small table of corrections
for sizes whose capability is known to be wrong (below). A scale set of
1,000 VMs costs a few paged calls per cycle.

State mapping (first matching row wins; only VMs with a private IP appear):

==================================  ==========================================  ==========================
``provisioningState``               instance view                               result
==================================  ==========================================  ==========================
any                                 ``isVMInStandbyPool`` true                  absent, logged once
``Deleting``                        any                                         draining "Deleting"
any                                 ``PowerState/stopping``, ``deallocating``   draining "PowerState/<x>"
any                                 ``PowerState/stopped``, ``deallocated``     absent, logged once
any                                 ``HealthState/unhealthy``                   draining "unhealthy"
``Succeeded``, ``Updating``,        ``PowerState/running``                      ready
``Failed``
anything else (``Creating``...)     ``PowerState/starting``, none...            absent
==================================  ==========================================  ==========================

``Updating`` counts as ready because extension and model updates keep the VM
running. ``Failed`` is judged by power state and health too: on scale sets
it usually means an extension failed on a VM that runs fine, and draining it
would lose the host for good; a VM that really is broken fails its health
probe or its workers, which the driver handles. Such a VM is logged once. A stopped or deallocated VM
(a Spot VM evicted with the ``Deallocate`` policy, a VM kept in a standby
pool) runs nothing, so it is absent rather than draining forever. Drains
carry no deadline: Resource Manager shows none (Spot eviction and terminate
notifications are Scheduled Events, seen on the VM with their ``NotBefore``).

GPU corrections (``_GPU_CORRECTIONS``): ``Standard_ND96isr_H100_v5`` has 8
H100 GPUs; its SKU capability says 12 (Azure CLI issue #31176). When a
correction overrides the SKU list, the provider logs it once per size.
``--slots-per-host`` wins over both.

Credentials: ``DefaultAzureCredential`` (environment, workload identity,
managed identity, Azure CLI...). The subscription comes from the
``subscription`` option or ``AZURE_SUBSCRIPTION_ID``. ``endpoint`` overrides
the Resource Manager endpoint (sovereign clouds; the token scope follows it);
without it the SDK's own ``AZURE_CLOUD`` setting applies. A plain ``http://``
endpoint is accepted only on loopback (tests). 408, 429 and 5xx are retried
by azure-core's retry policy (``max_attempts``, exponential back-off,
``Retry-After`` honoured up to ``timeout_s``: a server asking for minutes
does not hold the call for them); what survives raises RetryableDiscoveryError.
404, 401/403 and missing credentials raise FatalDiscoveryError.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Mapping
from urllib.parse import urlsplit

from cloud_elastic.errors import (CapacityDeniedError, CapacityError, ConfigError, DiscoveryError, FatalDiscoveryError,
                                  RetryableDiscoveryError)
from cloud_elastic.providers._common import (ABSENT, READY, CloudGroupProvider, OnceLog, OptionReader, SlotCache,
                                             SnapshotBuilder, Verdict, absent, draining, error_for_status, one_line,
                                             retry_options)
from cloud_elastic.providers.api import DiscoveredHosts, ProviderOption

__all__ = ["AzureScaleSet", "classify"]

_log = logging.getLogger(__name__)

_LEAVING_POWER = {"PowerState/stopping", "PowerState/deallocating"}
_OFF_POWER = {"PowerState/stopped", "PowerState/deallocated"}
_RUNNING_PROVISIONING = {"Succeeded", "Updating", "Failed"}
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}

#: VM size (lowercase) -> true GPU count, for sizes whose resource-SKU ``GPUs``
#: capability is known to be wrong. Keep each entry sourced.
_GPU_CORRECTIONS = {
    "standard_nd96isr_h100_v5": 8,  # 8x H100; the SKU list says 12 (Azure CLI issue #31176)
}


def classify(provisioning_state: str, statuses: Iterable[str], *, standby: bool = False) -> Verdict:
    """Map one VM's provisioning state, instance-view status codes and standby flag (see the table)."""
    codes = set(statuses)
    if standby:
        return absent("in the scale set's standby pool")
    if provisioning_state == "Deleting":
        return draining("Deleting")
    power = sorted(codes & _LEAVING_POWER)
    if power:
        return draining(power[0])
    off = sorted(codes & _OFF_POWER)
    if off:
        return absent(off[0])
    if any(c.lower() == "healthstate/unhealthy" for c in codes):
        return draining("unhealthy")
    if provisioning_state in _RUNNING_PROVISIONING and "PowerState/running" in codes:
        return READY
    return ABSENT


def _capped_retry(policy: type, cap_s: float, **settings: Any) -> Any:
    """azure-core's ``policy`` (a RetryPolicy) with the server's ``Retry-After`` cut to ``cap_s``: azure-core
    follows it however long (a 429 saying 25 s held one call for a minute at ``timeout_s=1``)."""

    class CappedRetryPolicy(policy):  # type: ignore[misc,valid-type]
        def get_retry_after(self, response: Any) -> float | None:
            after = super().get_retry_after(response)
            return None if after is None else min(after, cap_s)

    return CappedRetryPolicy(**settings)


class AzureScaleSet(CloudGroupProvider):
    """Ready and draining VMs of one Uniform or Flexible scale set (see module docstring).

    ``credential`` replaces ``DefaultAzureCredential`` (any azure-core
    ``TokenCredential``); it is for embedding, not a ``-o`` option.
    """

    name = "azure"
    description = "VMs of an Azure Virtual Machine Scale Set, Uniform or Flexible (--azure-vmss); needs cloud-elastic[azure]"
    requires = ("azure.identity", "azure.mgmt.compute", "azure.mgmt.network")
    extra = "azure"
    sdk_package = "azure-mgmt-compute"
    sdk_modules = {
        "errors": "azure.core.exceptions",
        "compute": "azure.mgmt.compute",
        "network": "azure.mgmt.network",
        "identity": "azure.identity",
        "policies": "azure.core.pipeline.policies",
    }
    options = (
        ProviderOption("group", "scale set name", required=True),
        ProviderOption("resource_group", "resource group of the scale set", required=True),
        ProviderOption("subscription", "subscription ID (default: AZURE_SUBSCRIPTION_ID)"),
        ProviderOption("endpoint", "Resource Manager endpoint (default: the SDK's cloud, https://management.azure.com)"),
        *retry_options(),
    )

    def __init__(self, group: str, *, resource_group: str, subscription: str, endpoint: str | None = None,
                 max_attempts: int = 5, timeout_s: float = 10.0, slots_per_host: int | None = None,
                 credential: Any = None) -> None:
        self.group = group
        self.resource_group = resource_group
        self.subscription = subscription
        self.endpoint = endpoint
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.label = f"Azure scale set {group!r} (resource group {resource_group})"
        self._credential = credential
        self._slots = SlotCache(self._sku_gpus, fixed=slots_per_host)
        self._api: dict[str, Any] | None = None
        self._scale_set: dict[str, Any] | None = None
        self._sku_gpus_by_name: dict[str, int] | None = None
        self._once = OnceLog(_log)

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "AzureScaleSet":
        read = OptionReader(cls, options)
        subscription = read.text("subscription") or os.environ.get("AZURE_SUBSCRIPTION_ID", "").strip()
        if not subscription:
            raise ConfigError(
                "provider 'azure' needs a subscription: pass --azure-subscription or set AZURE_SUBSCRIPTION_ID"
            )
        endpoint = read.endpoint("endpoint")
        if endpoint and endpoint.startswith("http://") and urlsplit(endpoint).hostname not in _LOOPBACK:
            raise ConfigError("provider 'azure': a plain http:// endpoint is only allowed on loopback")
        return cls(
            read.text("group") or "",
            resource_group=read.text("resource_group") or "",
            subscription=subscription,
            endpoint=endpoint,
            max_attempts=read.integer("max_attempts", maximum=20),
            timeout_s=read.seconds("timeout_s"),
            slots_per_host=slots_per_host,
        )

    # -- the SDK edge ------------------------------------------------------------------

    def _clients(self) -> dict[str, Any]:
        if self._api is None:
            sdk = self.sdk
            owned = None if self._credential else sdk["identity"].DefaultAzureCredential()
            credential = self._credential or owned
            kwargs: dict[str, Any] = {
                "retry_policy": _capped_retry(sdk["policies"].RetryPolicy, self.timeout_s,
                                              retry_total=self.max_attempts - 1),
                "connection_timeout": self.timeout_s,
                "read_timeout": self.timeout_s,
            }
            if self.endpoint:
                kwargs.update(base_url=self.endpoint, credential_scopes=[f"{self.endpoint}/.default"])
            self._api = {
                "compute": sdk["compute"].ComputeManagementClient(credential, self.subscription, **kwargs),
                "network": sdk["network"].NetworkManagementClient(credential, self.subscription, **kwargs),
                # Bearer tokens over plain http are refused by azure-core; from_options allows that on loopback only.
                "call": {"enforce_https": False} if (self.endpoint or "").startswith("http://") else {},
                "owned_credential": owned,
            }
        return self._api

    def _discover(self) -> DiscoveredHosts:
        api = self._clients()
        compute, network, call = api["compute"], api["network"], api["call"]
        if self._scale_set is None:
            self._scale_set = _rest(compute.virtual_machine_scale_sets.get(self.resource_group, self.group, **call))
        flexible = self._scale_set.get("properties", {}).get("orchestrationMode") == "Flexible"
        if flexible:
            vm_filter = f"'virtualMachineScaleSet/id' eq '{self._scale_set['id']}'"
            vms = compute.virtual_machines.list(self.resource_group, filter=vm_filter, expand="instanceView", **call)
            nics = network.network_interfaces.list(self.resource_group, **call)
        else:
            vms = compute.virtual_machine_scale_set_vms.list(self.resource_group, self.group, expand="instanceView",
                                                             **call)
            nics = network.network_interfaces.list_virtual_machine_scale_set_network_interfaces(
                self.resource_group, self.group, **call
            )
        vms = [_rest(vm) for vm in vms]
        addresses = _private_ips([_rest(nic) for nic in nics])
        snapshot = SnapshotBuilder(self.label, once=self._once)
        for vm in vms:
            props = vm.get("properties", {})
            view = props.get("instanceView", {})
            codes = [s.get("code", "") for s in view.get("statuses", [])]
            health = view.get("vmHealth", {}).get("status", {}).get("code")
            verdict = classify(props.get("provisioningState", ""), codes + ([health] if health else []),
                               standby=bool(view.get("isVMInStandbyPool")))
            if verdict is READY and props.get("provisioningState") == "Failed":
                self._once.note((vm.get("name"), "Failed"), "%s: VM %s is running with provisioningState Failed "
                                "(usually a failed extension); counted as ready", self.label, vm.get("name"))
            size = vm.get("sku", {}).get("name") or props.get("hardwareProfile", {}).get("vmSize", "")
            snapshot.add(addresses.get(vm.get("id", "").lower()), verdict, lambda s=size: self._slots.slots(s),
                         order=props.get("timeCreated", ""), instance=vm.get("name", ""))
        return snapshot.build()

    def _sku_gpus(self, size: Any) -> int:
        if self._sku_gpus_by_name is None:
            api = self._clients()
            location = (self._scale_set or {}).get("location", "")
            table: dict[str, int] = {}
            try:
                for sku in api["compute"].resource_skus.list(filter=f"location eq '{location}'", **api["call"]):
                    sku = _rest(sku)
                    if sku.get("resourceType") == "virtualMachines":
                        caps = {c.get("name"): c.get("value") for c in sku.get("capabilities", [])}
                        table[str(sku.get("name", "")).lower()] = int(caps.get("GPUs") or 0)
            except self.sdk["errors"].HttpResponseError as exc:
                if exc.status_code != 403:
                    raise
                raise FatalDiscoveryError(
                    f"{self.label}: may not read VM sizes' GPU counts (needs Microsoft.Compute/skus/read); "
                    "grant it or pass --slots-per-host"
                ) from exc
            self._sku_gpus_by_name = table
        gpus = self._sku_gpus_by_name.get(str(size).lower())
        corrected = _GPU_CORRECTIONS.get(str(size).lower())
        if corrected is not None:
            if gpus != corrected:  # SlotCache asks once per size, so this is said once
                _log.info("%s: VM size %s has %d GPU(s); the SKU list says %s, which is known to be wrong",
                          self.label, size, corrected, gpus)
            return corrected
        if gpus is None:
            _log.warning("%s: VM size %s is not among the location's SKUs; using 1 slot", self.label, size)
        return gpus or 0

    can_set_capacity = True

    def set_capacity(self, hosts: int, *, source: str | None = None) -> None:
        """Set the scale set's ``sku.capacity`` to ``hosts`` (``--manage-capacity``): one PATCH, not waited for."""
        errors = self.sdk["errors"]
        try:
            api = self._clients()
            api["compute"].virtual_machine_scale_sets.begin_update(
                self.resource_group, self.group, {"sku": {"capacity": hosts}}, polling=False, **api["call"])
        except errors.HttpResponseError as exc:
            first = one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            if exc.status_code == 403:
                raise CapacityDeniedError(f"{self.label}: {first}") from exc
            raise CapacityError(f"{self.label}: capacity {hosts}: {first}") from exc
        except errors.AzureError as exc:
            raise CapacityError(f"{self.label}: capacity {hosts}: {one_line(exc)}") from exc

    def _translate(self, exc: Exception, sdk: Mapping[str, Any]) -> DiscoveryError | None:
        errors = sdk["errors"]
        if not isinstance(exc, errors.AzureError):
            return None
        first = one_line(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        if isinstance(exc, errors.ClientAuthenticationError):
            return FatalDiscoveryError(f"{self.label}: Azure credentials missing or refused (DefaultAzureCredential): {first}")
        if isinstance(exc, errors.ResourceNotFoundError):
            return FatalDiscoveryError(
                f"{self.label}: not found (check the scale set, resource group and subscription): {first}"
            )
        if isinstance(exc, errors.HttpResponseError) and exc.status_code is not None:
            return error_for_status(exc.status_code, f"{self.label}: {first}")
        return RetryableDiscoveryError(f"{self.label}: cannot reach Azure Resource Manager: {first}")

    def close(self) -> None:
        if self._api is not None:
            self._api["compute"].close()
            self._api["network"].close()
            if self._api["owned_credential"] is not None:
                self._api["owned_credential"].close()
        self._api = None


def _rest(model: Any) -> dict[str, Any]:
    """An SDK model as its REST JSON (camelCase keys), whatever the SDK generation."""
    if isinstance(model, Mapping):
        as_dict = getattr(model, "as_dict", None)
        return as_dict() if callable(as_dict) else dict(model)
    return model.serialize(keep_readonly=True)  # older, msrest-based SDK releases


def _private_ips(nics: list[dict[str, Any]]) -> dict[str, str]:
    """VM id (lowercase) -> primary private IP of its primary NIC."""
    best: dict[str, tuple[bool, str]] = {}
    for nic in nics:
        props = nic.get("properties", {})
        vm_id = props.get("virtualMachine", {}).get("id", "").lower()
        configs = [c.get("properties", {}) for c in props.get("ipConfigurations", [])]
        configs.sort(key=lambda c: not c.get("primary", False))
        address = next((c["privateIPAddress"] for c in configs if c.get("privateIPAddress")), None)
        if not vm_id or not address:
            continue
        primary = bool(props.get("primary", False))
        if vm_id not in best or (primary and not best[vm_id][0]):
            best[vm_id] = (primary, address)
    return {vm: address for vm, (_, address) in best.items()}
