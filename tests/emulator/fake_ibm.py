"""A fake IBM Cloud VPC API (the subset the IBM provider calls) and an IAM token endpoint.

Shapes follow the VPC API reference: ``GET /v1/instance_groups/{id}``,
``/v1/instance_groups/{id}/memberships`` and
``/v1/instances?instance_group_membership.instance_group.id=`` paged with
``limit``/``start`` and ``next.href`` (instances with ``health_state``,
``lifecycle_state`` and, where set, ``gpu``); ``/v1/instance/profiles/{name}``
(``gpu_count`` fixed or ``dependent``);
errors as ``{"errors": [{"code", "message"}], "trace"}``. IAM's
``POST /identity/token`` turns the API key ``API_KEY`` into a JWT bearer token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from urllib.parse import urlencode

import jwt

from tests.emulator.httpfake import FakeCloud, Reply, Request, page_of

API_KEY = "ibm-test-api-key"


@dataclass
class Member:
    """One membership and its instance as a test scripts them."""

    name: str
    ip: str | None = None
    membership: str = "healthy"
    status: str = "running"
    reasons: list[str] = field(default_factory=list)
    profile: str = "gx2-16x128x2v100"
    attachment: bool = False  # address on primary_network_attachment instead of primary_network_interface
    created: str = "2026-01-01T00:00:00Z"
    gpus: int | None = None  # the instance's own gpu.count; None: no gpu object (CPU profiles, older records)
    health: str = "ok"  # health_state: ok, degraded, faulted, inapplicable
    lifecycle: str = "stable"


class FakeIBM(FakeCloud):
    """VPC fake: state lives in ``groups`` and ``profiles``."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[str, list[Member]] = {}
        # A GPU count, or "dependent" (the profile cannot say; the instance does).
        self.profiles: dict[str, int | str] = {"gx2-16x128x2v100": 2, "gx3-16x80x1l4": 1, "bx2-4x16": 0,
                                               "gx3d-160x1792x8h100": "dependent"}
        self.tokens: set[str] = set()
        self.route("POST", "/identity/token", self._iam_token)
        self.route("GET", "/v1/instance_groups/(?P<group>[^/]+)", self._get_group)
        self.route("GET", "/v1/instance_groups/(?P<group>[^/]+)/memberships", self._memberships)
        self.route("GET", "/v1/instances", self._instances)
        self.route("GET", "/v1/instance/profiles/(?P<name>[^/]+)", self._profile)

    def add_group(self, group_id: str, members: list[Member]) -> list[Member]:
        self.groups[group_id] = members
        return members

    # -- REST ------------------------------------------------------------------------

    def authorize(self, request: Request) -> Reply | None:
        if request.path == "/identity/token":
            return None
        if request.headers.get("authorization", "").removeprefix("Bearer ") not in self.tokens:
            return _error(401, "not_authorized", "The request is not authorized.")
        if "version" not in request.query or request.query.get("generation") != "2":
            return _error(400, "missing_version", "The version and generation=2 query parameters are required.")
        return None

    def not_found(self, message: str) -> Reply:
        return _error(404, "not_found", message)

    def _iam_token(self, request: Request) -> Reply:
        form = request.form()
        if form.get("apikey") != API_KEY:
            return Reply(400, {"errorCode": "BXNIM0415E", "errorMessage": "Provided API key could not be found."})
        now = int(time.time())
        token = jwt.encode({"iat": now, "exp": now + 3600, "sub": "test"}, "a-test-only-signing-key-of-32-bytes-or-more", algorithm="HS256")
        self.tokens.add(token)
        return Reply(200, {"access_token": token, "refresh_token": "r", "token_type": "Bearer",
                           "expires_in": 3600, "expiration": now + 3600})

    def _group(self, request: Request) -> list[Member]:
        group = request.params.get("group") or request.query.get("instance_group_membership.instance_group.id", "")
        if group not in self.groups:
            raise KeyError(f"Instance group {group}")
        return self.groups[group]

    def _get_group(self, request: Request) -> Reply:
        members = self._group(request)
        return Reply(200, {"id": request.params["group"], "name": "gpus", "status": "healthy",
                           "membership_count": len(members), "vpc": {"id": "vpc-1"}})

    def _page(self, request: Request, key: str, items: list) -> Reply:
        limit = int(request.query.get("limit", 50))
        page, token = page_of(items, request.query.get("start"), limit)
        body: dict = {key: page, "limit": limit, "total_count": len(items),
                      "first": {"href": f"{self.url}{request.path}?limit={limit}"}}
        if token:
            query = {k: v for k, v in request.query.items() if k != "start"}
            body["next"] = {"href": f"{self.url}{request.path}?{urlencode({**query, 'start': token})}"}
        return Reply(200, body)

    def _memberships(self, request: Request) -> Reply:
        group = request.params["group"]
        return self._page(request, "memberships", [
            {"id": f"m-{m.name}", "status": m.membership, "created_at": m.created,
             "instance": {"id": f"i-{m.name}", "name": m.name}, "instance_group": {"id": group}}
            for m in self._group(request)
        ])

    def _instances(self, request: Request) -> Reply:
        return self._page(request, "instances", [_instance(m) for m in self._group(request)])

    def _profile(self, request: Request) -> Reply:
        name = request.params["name"]
        gpus = self.profiles[name]
        body: dict = {"name": name, "vcpu_count": {"type": "fixed", "value": 16}}
        if gpus == "dependent":
            body["gpu_count"] = {"type": "dependent"}
        elif gpus:
            body["gpu_count"] = {"type": "fixed", "value": gpus}
        return Reply(200, body)


def _instance(m: Member) -> dict:
    nic = {"id": f"nic-{m.name}", "primary_ip": {"address": m.ip or "0.0.0.0"}}
    body = {"id": f"i-{m.name}", "name": m.name, "status": m.status, "created_at": m.created,
            "status_reasons": [{"code": r, "message": r} for r in m.reasons],
            "lifecycle_state": m.lifecycle, "profile": {"name": m.profile},
            "health_state": m.health if m.status == "running" else "inapplicable"}
    body["primary_network_attachment" if m.attachment else "primary_network_interface"] = nic
    if m.gpus is not None:
        body["gpu"] = {"count": m.gpus, "manufacturer": "nvidia", "memory": 80 * m.gpus, "model": "H100"}
    return body


def _error(status: int, code: str, message: str) -> Reply:
    return Reply(status, {"errors": [{"code": code, "message": message}], "trace": "test-trace"})
