"""A fake Azure Resource Manager (the subset the Azure provider calls) and an
App Service managed-identity token endpoint.

Shapes follow the ARM REST reference: ``virtualMachineScaleSets`` get,
``virtualMachineScaleSets/{name}/virtualMachines`` (Uniform, with instance
view), ``virtualMachines`` filtered on ``'virtualMachineScaleSet/id'``
(Flexible), the scale set's and the resource group's ``networkInterfaces``,
``skus``; lists paged with ``nextLink``; errors as ``{"error": {"code", "message"}}``.
Each orchestration mode gets only what Azure serves for it: the scale set's
VM and NIC lists refuse a Flexible scale set (``OperationNotAllowed``), and
the resource group's ``virtualMachines`` filtered on a Uniform scale set is
empty (Uniform VMs are not ``Microsoft.Compute/virtualMachines`` resources).
``isVMInStandbyPool`` appears in Flexible VMs' instance views.
``DefaultAzureCredential`` reaches the token endpoint through the standard
``IDENTITY_ENDPOINT`` / ``IDENTITY_HEADER`` variables (App Service managed
identity), so the real credential chain runs without leaving the machine.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from urllib.parse import urlencode

from tests.emulator.httpfake import FakeCloud, Reply, Request, page_of

TOKEN = "azure-test-access-token"
IDENTITY_HEADER = "azure-test-identity-header"
_RG = "(?i)/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers"
_VMSS = _RG + "/Microsoft.Compute/virtualMachineScaleSets/(?P<name>[^/]+)"


@dataclass
class VM:
    """One scale-set VM as a test scripts it."""

    name: str
    ip: str | None = None
    provisioning: str = "Succeeded"
    power: str | None = "running"
    health: str | None = None
    size: str = "Standard_NC24s_v3"
    created: str = "2026-01-01T00:00:00.0000000+00:00"
    standby: bool = False  # in a standby pool (Flexible only)


@dataclass
class ScaleSet:
    mode: str
    location: str
    vms: list[VM]
    #: The capacities a PATCH of ``sku.capacity`` asked for, in order (``--manage-capacity``).
    capacities: list[int] = field(default_factory=list)
    #: When set, the PATCH answers 403 AuthorizationFailed (no Microsoft.Compute/virtualMachineScaleSets/write).
    deny_update: bool = False


class FakeAzure(FakeCloud):
    """ARM fake: state lives in ``scale_sets`` and ``skus``; ``page_size`` is ARM's server-side page."""

    def __init__(self) -> None:
        super().__init__()
        self.scale_sets: dict[tuple[str, str, str], ScaleSet] = {}
        # The ND H100 v5 entry is what Azure's SKU list really says for it (12); the size has 8 GPUs.
        self.skus: dict[str, int] = {"Standard_NC24s_v3": 4, "Standard_NC6s_v3": 1, "Standard_D4s_v5": 0,
                                     "Standard_ND96isr_H100_v5": 12}
        self.forbidden_subscriptions: set[str] = set()
        self.page_size = 500
        self.route("GET", "/msi/token", self._token)
        self.route("GET", _VMSS, self._get_scale_set)
        self.route("PATCH", _VMSS, self._update_scale_set)
        self.route("GET", _VMSS + "/virtualMachines", self._uniform_vms)
        self.route("GET", _VMSS + "/networkInterfaces", self._uniform_nics)
        self.route("GET", _RG + "/Microsoft.Compute/virtualMachines", self._flexible_vms)
        self.route("GET", _RG + "/Microsoft.Network/networkInterfaces", self._group_nics)
        self.route("GET", "(?i)/subscriptions/(?P<sub>[^/]+)/providers/Microsoft.Compute/skus", self._skus)

    def add_scale_set(self, sub: str, rg: str, name: str, vms: list[VM], *, mode: str = "Uniform",
                      location: str = "eastus") -> list[VM]:
        self.scale_sets[(sub, rg.lower(), name.lower())] = ScaleSet(mode, location, vms)
        return vms

    # -- REST ------------------------------------------------------------------------

    def authorize(self, request: Request) -> Reply | None:
        if request.path == "/msi/token":
            return None
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return _error(401, "InvalidAuthenticationToken", "The access token is invalid.")
        sub = request.path.split("/")[2]
        if sub in self.forbidden_subscriptions:
            return _error(403, "AuthorizationFailed",
                          f"The client does not have authorization to perform action over scope '/subscriptions/{sub}'.")
        return None

    def not_found(self, message: str) -> Reply:
        return _error(404, "ResourceNotFound", message)

    def _token(self, request: Request) -> Reply:
        if request.headers.get("x-identity-header") != IDENTITY_HEADER:
            return Reply(400, {"error": "invalid_request", "error_description": "unknown identity header"})
        return Reply(200, {"access_token": TOKEN, "expires_on": str(int(time.time()) + 3600),
                           "resource": request.query.get("resource", ""), "token_type": "Bearer"})

    def _scale_set(self, request: Request) -> ScaleSet:
        p = request.params
        key = (p["sub"], p["rg"].lower(), p["name"].lower())
        if key not in self.scale_sets:
            raise KeyError(f"The Resource 'Microsoft.Compute/virtualMachineScaleSets/{p['name']}' under resource "
                           f"group '{p['rg']}'")
        return self.scale_sets[key]

    def _get_scale_set(self, request: Request) -> Reply:
        ss = self._scale_set(request)
        p = request.params
        return Reply(200, {"id": _vmss_id(p["sub"], p["rg"], p["name"]), "name": p["name"], "location": ss.location,
                           "properties": {"orchestrationMode": ss.mode}})

    def _update_scale_set(self, request: Request) -> Reply:
        """Records ``sku.capacity``; the test adds or removes the VMs it stands for."""
        ss = self._scale_set(request)
        p = request.params
        if ss.deny_update:
            return _error(403, "AuthorizationFailed", "The client does not have authorization to perform action "
                          "'Microsoft.Compute/virtualMachineScaleSets/write'.")
        ss.capacities.append(int(request.json()["sku"]["capacity"]))
        return Reply(200, {"id": _vmss_id(p["sub"], p["rg"], p["name"]), "name": p["name"], "location": ss.location,
                           "sku": {"capacity": ss.capacities[-1]},
                           "properties": {"orchestrationMode": ss.mode, "provisioningState": "Succeeded"}})

    def _page(self, request: Request, items: list) -> Reply:
        page, token = page_of(items, request.query.get("$skiptoken"), self.page_size)
        body: dict = {"value": page}
        if token:
            query = {k: v for k, v in request.query.items() if k != "api-version"}
            body["nextLink"] = f"{self.url}{request.path}?{urlencode({**query, '$skiptoken': token})}"
        return Reply(200, body)

    def _uniform(self, request: Request) -> ScaleSet:
        ss = self._scale_set(request)
        if ss.mode != "Uniform":
            what = "VMScaleSetVMs.List" if request.path.endswith("virtualMachines") else "VMScaleSetNetworkInterfaces.List"
            raise _Refused(_error(409, "OperationNotAllowed",
                                  f"Operation '{what}.GET' is not allowed on Virtual Machine Scale Set "
                                  f"'{request.params['name']}' since it is in Flexible orchestration mode."))
        return ss

    def _dispatch(self, request: Request) -> Reply:
        try:
            return super()._dispatch(request)
        except _Refused as refused:
            return refused.reply

    def _uniform_vms(self, request: Request) -> Reply:
        ss = self._uniform(request)
        p = request.params
        base = _vmss_id(p["sub"], p["rg"], p["name"])
        expand = request.query.get("$expand") == "instanceView"
        return self._page(request, [
            {"id": f"{base}/virtualMachines/{i}", "name": f"{p['name']}_{i}", "instanceId": str(i),
             "sku": {"name": vm.size, "tier": "Standard"}, "properties": _vm_properties(vm, expand)}
            for i, vm in enumerate(ss.vms)
        ])

    def _uniform_nics(self, request: Request) -> Reply:
        ss = self._uniform(request)
        p = request.params
        base = _vmss_id(p["sub"], p["rg"], p["name"])
        return self._page(request, [_nic(f"{base}/virtualMachines/{i}", vm.ip) for i, vm in enumerate(ss.vms) if vm.ip])

    def _flexible(self, request: Request) -> list[tuple[str, VM]]:
        p = request.params
        return [(_vm_id(sub, rg, vm.name), vm) for (sub, rg, _), ss in self.scale_sets.items()
                if sub == p["sub"] and rg == p["rg"].lower() and ss.mode == "Flexible" for vm in ss.vms]

    def _flexible_vms(self, request: Request) -> Reply:
        p = request.params
        flt = request.query.get("$filter", "")
        wanted = {f"'virtualMachineScaleSet/id' eq '{_vmss_id(sub, rg, name)}'".lower(): (sub, rg, name)
                  for sub, rg, name in self.scale_sets}
        if flt.lower() not in wanted:
            return _error(400, "InvalidParameter", f"The value of parameter $filter is invalid: {flt}")
        key = wanted[flt.lower()]
        if key[0] != p["sub"] or key[1] != p["rg"].lower() or self.scale_sets[key].mode != "Flexible":
            return self._page(request, [])
        vms = self.scale_sets[key].vms
        expand = request.query.get("$expand") == "instanceView"
        return self._page(request, [
            {"id": _vm_id(key[0], key[1], vm.name), "name": vm.name,
             "properties": {**_vm_properties(vm, expand, flexible=True), "hardwareProfile": {"vmSize": vm.size},
                            "virtualMachineScaleSet": {"id": _vmss_id(*key)}}}
            for vm in vms
        ])

    def _group_nics(self, request: Request) -> Reply:
        # Every NIC of the group, including a VM outside the scale set, as the real API would.
        nics = [_nic(vm_id, vm.ip) for vm_id, vm in self._flexible(request) if vm.ip]
        nics.append(_nic(_vm_id(request.params["sub"], request.params["rg"], "unrelated-vm"), "10.9.9.9"))
        return self._page(request, nics)

    def _skus(self, request: Request) -> Reply:
        location = request.query.get("$filter", "").split("'")[1] if "'" in request.query.get("$filter", "") else ""
        return self._page(request, [
            {"resourceType": "virtualMachines", "name": name, "locations": [location],
             "capabilities": [{"name": "vCPUs", "value": "8"}] + ([{"name": "GPUs", "value": str(g)}] if g else [])}
            for name, g in self.skus.items()
        ] + [{"resourceType": "disks", "name": "Premium_LRS", "locations": [location], "capabilities": []}])


class _Refused(Exception):
    def __init__(self, reply: Reply) -> None:
        super().__init__(reply.status)
        self.reply = reply


def _vm_properties(vm: VM, expand: bool, flexible: bool = False) -> dict:
    props: dict = {"provisioningState": vm.provisioning, "timeCreated": vm.created}
    if expand:
        statuses = [{"code": f"ProvisioningState/{vm.provisioning.lower()}"}]
        if vm.power:
            statuses.append({"code": f"PowerState/{vm.power}"})
        props["instanceView"] = {"statuses": statuses}
        if flexible:
            props["instanceView"]["isVMInStandbyPool"] = vm.standby
        if vm.health:
            props["instanceView"]["vmHealth"] = {"status": {"code": f"HealthState/{vm.health}"}}
    return props


def _nic(vm_id: str, ip: str) -> dict:
    return {"id": f"{vm_id}/networkInterfaces/nic0", "name": "nic0", "properties": {
        "primary": True, "virtualMachine": {"id": vm_id},
        "ipConfigurations": [{"name": "ipconfig1", "properties": {"primary": True, "privateIPAddress": ip}}],
    }}


def _vmss_id(sub: str, rg: str, name: str) -> str:
    return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachineScaleSets/{name}"


def _vm_id(sub: str, rg: str, name: str) -> str:
    return f"/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{name}"


def _error(status: int, code: str, message: str) -> Reply:
    return Reply(status, {"error": {"code": code, "message": message}})
