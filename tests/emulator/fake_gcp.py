"""A fake Compute Engine REST API (the subset the GCP provider calls) and an OAuth token endpoint.

Shapes follow https://cloud.google.com/compute/docs/reference/rest/v1 :
``instanceGroupManagers.get`` / ``listManagedInstances`` (zonal and regional),
``instances.list`` (with ``name eq "regex"`` filters) / ``get``,
``machineTypes.get``; errors as ``{"error": {"code", "message", "errors"}}``.
``listManagedInstances`` answers in one response, ignoring ``maxResults`` and
``pageToken``, unless the group's ``listManagedInstancesResults`` is
``PAGINATED`` (the real API's default is ``PAGELESS``); other lists page.
``machineTypes.get`` answers 404 for types it does not know.
Requests must carry a self-signed JWT from ``SERVICE_ACCOUNT`` (what
google-auth sends for service-account keys) or the token the ``/token``
endpoint hands out for such a JWT (a service-account key file written
by :meth:`FakeGCP.write_adc` points ``token_uri`` here).
"""

from __future__ import annotations

import hashlib

import base64
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from tests.emulator.httpfake import FakeCloud, Reply, Request, page_of

TOKEN = "gcp-test-access-token"
SERVICE_ACCOUNT = "discovery@test.iam.gserviceaccount.com"
_API = "/compute/v1/projects/(?P<project>[^/]+)"
_SCOPE = "(?P<kind>zones|regions)/(?P<where>[^/]+)"
_LINK = "https://www.googleapis.com/compute/v1/projects/{project}/zones/{zone}/{what}/{name}"


@dataclass
class Member:
    """One managed instance and its VM, as a test scripts it."""

    name: str
    zone: str
    ip: str | None = None
    status: str = "RUNNING"
    action: str = "NONE"
    health: list[str] = field(default_factory=list)
    machine_type: str = "n1-standard-8"
    accelerators: int = 0
    created: str = "2026-01-01T00:00:00.000-00:00"
    termination: str | None = None  # managed instance scheduling.terminationTimestamp
    shutdown: tuple[str, int] | None = None  # shutdownDetails: (requestTimestamp, maxDuration seconds)
    termination_time: str | None = None  # the instance's own scheduling.terminationTime
    #: The VM's numeric id (a string on the wire); a VM recreated under the same name gets a new one.
    id: str = ""

    @property
    def instance_id(self) -> str:
        return self.id or str(int(hashlib.sha1(self.name.encode()).hexdigest()[:12], 16))


@dataclass
class Group:
    base: str
    members: list[Member]
    list_results: str = "PAGELESS"  # listManagedInstancesResults
    #: The sizes ``instanceGroupManagers.resize`` was called with, in order (``--manage-capacity``).
    resizes: list[int] = field(default_factory=list)
    #: When set, resize answers 403 (the caller lacks compute.instanceGroupManagers.update).
    deny_resize: bool = False


class FakeGCP(FakeCloud):
    """Compute Engine fake: state lives in ``groups`` and ``machine_types``."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[tuple[str, str, str], Group] = {}
        self.extra_instances: dict[tuple[str, str], list[Member]] = {}  # (project, zone): VMs in no group
        self.machine_types: dict[str, int] = {"n1-standard-8": 0, "a2-highgpu-4g": 4, "g2-standard-8": 1}
        self.forbidden_projects: set[str] = set()
        self.page_size_cap = 500
        self.route("POST", "/token", self._token)
        self.route("GET", f"{_API}/{_SCOPE}/instanceGroupManagers/(?P<name>[^/]+)", self._get_group)
        self.route("POST", f"{_API}/{_SCOPE}/instanceGroupManagers/(?P<name>[^/]+)/listManagedInstances", self._list_managed)
        self.route("POST", f"{_API}/{_SCOPE}/instanceGroupManagers/(?P<name>[^/]+)/resize", self._resize)
        self.route("GET", f"{_API}/zones/(?P<zone>[^/]+)/instances", self._list_instances)
        self.route("GET", f"{_API}/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)", self._get_instance)
        self.route("GET", f"{_API}/zones/(?P<zone>[^/]+)/machineTypes/(?P<name>[^/]+)", self._machine_type)

    # -- test helpers ---------------------------------------------------------------

    def add_group(self, project: str, name: str, members: list[Member], *, zone: str | None = None,
                  region: str | None = None, base: str | None = None, list_results: str = "PAGELESS") -> list[Member]:
        scope = f"zones/{zone}" if zone else f"regions/{region}"
        self.groups[(project, scope, name)] = Group(base or name, members, list_results)
        return members

    def write_adc(self, directory: Path, email: str = SERVICE_ACCOUNT) -> Path:
        """A service-account key file (a fresh RSA key) for Application Default Credentials.

        Its ``token_uri`` is this fake, so the real google-auth chain signs a
        JWT assertion and exchanges it here for an access token.
        """
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        path = directory / f"adc-{email.split('@')[0]}.json"
        path.write_text(json.dumps({
            "type": "service_account", "project_id": "test", "private_key_id": "k1", "private_key": pem,
            "client_email": email, "client_id": "1", "token_uri": f"{self.url}/token",
        }))
        return path

    # -- REST ------------------------------------------------------------------------

    def authorize(self, request: Request) -> Reply | None:
        if request.path == "/token":
            return None
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
        # An exchanged access token, or the self-signed JWT google-auth sends for service accounts.
        if bearer != TOKEN and _jwt_claims(bearer).get("iss") != SERVICE_ACCOUNT:
            return _error(401, "Request had invalid authentication credentials.", "authError")
        project = request.path.split("/")[4]
        if project in self.forbidden_projects:
            return _error(403, f"Required 'compute.instanceGroupManagers.get' permission for 'projects/{project}'",
                          "forbidden")
        return None

    def not_found(self, message: str) -> Reply:
        return _error(404, f"The resource {message}", "notFound")

    def _token(self, request: Request) -> Reply:
        claims = _jwt_claims(request.form().get("assertion", ""))
        if claims.get("iss") != SERVICE_ACCOUNT:
            return Reply(400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
        return Reply(200, {"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"})

    def _group(self, request: Request) -> Group:
        p = request.params
        key = (p["project"], f"{p['kind']}/{p['where']}", p["name"])
        if key not in self.groups:
            raise KeyError(f"'projects/{key[0]}/{key[1]}/instanceGroupManagers/{key[2]}'")
        return self.groups[key]

    def _get_group(self, request: Request) -> Reply:
        group = self._group(request)
        return Reply(200, {"name": request.params["name"], "baseInstanceName": group.base,
                           "listManagedInstancesResults": group.list_results,
                           "targetSize": len(group.members), "kind": "compute#instanceGroupManager"})

    def _resize(self, request: Request) -> Reply:
        """Records the size asked for; the test adds or removes the members it stands for."""
        group = self._group(request)
        if group.deny_resize:
            return _error(403, "Required 'compute.instanceGroupManagers.update' permission for "
                               f"'{request.params['name']}'", "forbidden")
        group.resizes.append(int(request.query["size"]))
        return Reply(200, {"kind": "compute#operation", "name": f"operation-resize-{len(group.resizes)}",
                           "operationType": "compute.instanceGroupManagers.resize", "status": "DONE",
                           "progress": 100})

    def _list_managed(self, request: Request) -> Reply:
        group = self._group(request)
        if group.list_results == "PAGINATED":
            size = min(int(request.query.get("maxResults", 500)), self.page_size_cap)
            page, token = page_of(group.members, request.query.get("pageToken"), size)
        else:  # PAGELESS: maxResults and pageToken are ignored, everything comes in one response
            page, token = group.members, None
        project = request.params["project"]
        body: dict = {"managedInstances": [_managed(project, m) for m in page]}
        if token:
            body["nextPageToken"] = token
        return Reply(200, body)

    def _vms(self, project: str, zone: str) -> list[Member]:
        vms = [m for (p, _, _), g in self.groups.items() if p == project for m in g.members if m.zone == zone]
        return vms + self.extra_instances.get((project, zone), [])

    def _list_instances(self, request: Request) -> Reply:
        project, zone = request.params["project"], request.params["zone"]
        vms = self._vms(project, zone)
        flt = request.query.get("filter")
        if flt:
            match = re.fullmatch(r'name eq "(.*)"', flt)
            if not match:
                return _error(400, f"Invalid value for field 'filter': '{flt}'.", "invalid")
            vms = [m for m in vms if re.fullmatch(match.group(1), m.name)]
        size = min(int(request.query.get("maxResults", 500)), self.page_size_cap)
        page, token = page_of(vms, request.query.get("pageToken"), size)
        body: dict = {"items": [_instance(project, m) for m in page]}
        if token:
            body["nextPageToken"] = token
        return Reply(200, body)

    def _get_instance(self, request: Request) -> Reply:
        project, zone, name = request.params["project"], request.params["zone"], request.params["name"]
        for m in self._vms(project, zone):
            if m.name == name:
                return Reply(200, _instance(project, m))
        raise KeyError(f"'projects/{project}/zones/{zone}/instances/{name}'")

    def _machine_type(self, request: Request) -> Reply:
        name = request.params["name"]
        if name not in self.machine_types:
            raise KeyError(f"'projects/{request.params['project']}/zones/{request.params['zone']}/machineTypes/{name}'")
        gpus = self.machine_types[name]
        body: dict = {"name": name, "guestCpus": 8}
        if gpus:
            body["accelerators"] = [{"guestAcceleratorType": "nvidia-test", "guestAcceleratorCount": gpus}]
        return Reply(200, body)


def _managed(project: str, m: Member) -> dict:
    body: dict = {
        "instance": _LINK.format(project=project, zone=m.zone, what="instances", name=m.name),
        "name": m.name,
        "instanceStatus": m.status,
        "currentAction": m.action,
        "instanceHealth": [{"detailedHealthState": h} for h in m.health],
    }
    if m.termination:
        body["scheduling"] = {"terminationTimestamp": m.termination}
    if m.shutdown:
        body["shutdownDetails"] = {"requestTimestamp": m.shutdown[0], "maxDuration": {"seconds": str(m.shutdown[1])}}
    return body


def _instance(project: str, m: Member) -> dict:
    body: dict = {
        "id": m.instance_id,
        "name": m.name,
        "status": m.status,
        "creationTimestamp": m.created,
        "machineType": _LINK.format(project=project, zone=m.zone, what="machineTypes", name=m.machine_type),
        "networkInterfaces": [{"name": "nic0", "networkIP": m.ip}] if m.ip else [],
    }
    if m.termination_time:
        body["scheduling"] = {"provisioningModel": "SPOT", "terminationTime": m.termination_time}
    if m.accelerators:
        body["guestAccelerators"] = [{"acceleratorType": "nvidia-tesla-t4", "acceleratorCount": m.accelerators}]
    return body


def _jwt_claims(assertion: str) -> dict:
    """The payload of a JWT (signature not checked: the fake only tells test identities apart)."""
    try:
        payload = assertion.split(".")[1]
        return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError):
        return {}


def _error(code: int, message: str, reason: str) -> Reply:
    return Reply(code, {"error": {"code": code, "message": message,
                                  "errors": [{"message": message, "domain": "global", "reason": reason}]}})
