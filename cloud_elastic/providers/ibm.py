"""IBM Cloud VPC instance group discovery (``--ibm-instance-group ID``).

Each :meth:`~IBMInstanceGroup.find` lists the group's memberships
(``GET /instance_groups/{id}/memberships``) and the group's instances
(``GET /instances?instance_group_membership.instance_group.id={id}``), both
paged at ``page_size`` (the API caps pages at 100), and joins them on the
instance id. Slots are the instance's own ``gpu.count``; only an instance
without a ``gpu`` object falls back to its profile's ``gpu_count``, read once
per profile (a ``dependent`` profile count has no value: 1 slot and a
warning). The group itself is read once. A group of 1,000 instances costs
10 + 10 calls per cycle: the API's page cap, not one call per instance.

State mapping (first matching row wins; only instances with a primary IP appear):

=====================================  ====================================================  ===========================
membership ``status``                  instance ``status`` / ``lifecycle_state`` / health    result
=====================================  ====================================================  ===========================
``deleting``, ``failed``,              any                                                   draining "membership <status>"
``unhealthy``
any                                    ``stopped``                                           absent, logged once
                                                                                             ("instance stopped", or
                                                                                             "preempted" with reason
                                                                                             ``stopped_by_preemption``)
any                                    ``status_reasons`` has ``stopped_by_preemption``      draining "preempted"
any                                    ``stopping``, ``deleting``, ``failed``,               draining "instance <status>"
                                       ``restarting``
any                                    ``lifecycle_state`` ``deleting``, ``failed``,         draining "instance <state>"
                                       ``suspended``
any                                    ``health_state`` ``faulted``                          draining "instance faulted"
``healthy``                            ``running``                                           ready
anything else (``pending``...)         ``pending``, ``starting``...                          absent
=====================================  ====================================================  ===========================

Instance ``status`` is one of ``deleting failed pending restarting running
starting stopped stopping``; ``suspended`` is a ``lifecycle_state``. A
stopped instance runs nothing, so it is absent rather than draining forever;
``health_state`` ``degraded`` (like ``ok`` and ``inapplicable``) stays ready
(the instance still runs). IBM gives no advance notice and no time in the group
or instance state, so drains carry ``deadline=None``. Hosts are the instances'
primary IPs; each snapshot names the instance behind a host by its id
(``DiscoveredHosts.instances``).

Credentials, first found wins: the IBM SDK's external configuration for the
``vpc`` service (``VPC_AUTH_TYPE``, ``VPC_APIKEY``, ``VPC_AUTH_URL``...,
or an ``ibm-credentials.env`` file), else an API key in ``IBMCLOUD_API_KEY``
(or ``IC_API_KEY``) exchanged at IAM (``iam_endpoint`` overrides IAM's URL,
e.g. ``https://private.iam.cloud.ibm.com``). ``endpoint`` overrides the VPC
API URL; without it ``VPC_URL`` applies, else the region's public endpoint.
429 and 5xx are retried by the SDK (``enable_retries``: ``max_attempts``,
exponential back-off, ``Retry-After`` honoured up to ``timeout_s``); what survives raises
RetryableDiscoveryError. 404, 401/403 and missing credentials raise
FatalDiscoveryError.
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Iterable, Mapping

from cloud_elastic.errors import ConfigError, DiscoveryError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers._common import (ABSENT, READY, CloudGroupProvider, OnceLog, OptionReader, SlotCache,
                                             SnapshotBuilder, Verdict, absent, draining, error_for_status, one_line,
                                             retry_options)
from cloud_elastic.providers.api import DiscoveredHosts, ProviderOption

__all__ = ["IBMInstanceGroup", "classify"]

_log = logging.getLogger(__name__)

_LEAVING_MEMBERSHIP = {"deleting", "failed", "unhealthy"}
_LEAVING_STATUS = {"stopping", "deleting", "failed", "restarting"}
_LEAVING_LIFECYCLE = {"deleting", "failed", "suspended"}
_API_KEY_VARS = ("IBMCLOUD_API_KEY", "IC_API_KEY")
_REGION = re.compile(r"^[a-z]{2}-[a-z]+(-[0-9]+)?$")


def classify(membership_status: str, instance_status: str, status_reasons: Iterable[str] = (),
             lifecycle_state: str = "", health_state: str = "") -> Verdict:
    """Map one membership's status and its instance's status, lifecycle and health (see the table)."""
    preempted = "stopped_by_preemption" in set(status_reasons)
    if membership_status in _LEAVING_MEMBERSHIP:
        return draining(f"membership {membership_status}")
    if instance_status == "stopped":
        return absent("preempted" if preempted else "instance stopped")
    if preempted:
        return draining("preempted")
    if instance_status in _LEAVING_STATUS:
        return draining(f"instance {instance_status}")
    if lifecycle_state in _LEAVING_LIFECYCLE:
        return draining(f"instance {lifecycle_state}")
    if health_state == "faulted":
        return draining("instance faulted")
    if membership_status == "healthy" and instance_status == "running":
        return READY
    return ABSENT


class IBMInstanceGroup(CloudGroupProvider):
    """Ready and draining instances of one IBM Cloud VPC instance group (see module docstring)."""

    name = "ibm"
    description = "instances of an IBM Cloud VPC instance group (--ibm-instance-group); needs cloud-elastic[ibm]"
    requires = ("ibm_vpc",)
    extra = "ibm"
    sdk_package = "ibm-vpc"
    sdk_modules = {
        "core": "ibm_cloud_sdk_core",
        "auth": "ibm_cloud_sdk_core.authenticators",
        "requests": "requests",
        "vpc": "ibm_vpc.vpc_v1",
    }
    options = (
        ProviderOption("group", "instance group ID", required=True),
        ProviderOption("region", "VPC region, e.g. us-south", required=True),
        ProviderOption("endpoint", "VPC API URL (default: VPC_URL, else https://REGION.iaas.cloud.ibm.com/v1)"),
        ProviderOption("iam_endpoint", "IAM URL for API-key exchange (default: IBM's public IAM)"),
        *retry_options(),
        ProviderOption("page_size", "results per page (1-100)", default="100"),
    )

    def __init__(self, group: str, *, region: str, endpoint: str | None = None, iam_endpoint: str | None = None,
                 max_attempts: int = 5, timeout_s: float = 10.0, page_size: int = 100,
                 slots_per_host: int | None = None) -> None:
        self.group = group
        self.region = region
        self.endpoint = endpoint
        self.iam_endpoint = iam_endpoint
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.page_size = page_size
        self.label = f"IBM instance group {group!r} ({region})"
        self._slots = SlotCache(self._profile_gpus, fixed=slots_per_host)
        self._vpc: Any = None
        self._group_checked = False
        self._once = OnceLog(_log)

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "IBMInstanceGroup":
        read = OptionReader(cls, options)
        region = read.text("region") or ""
        if not _REGION.match(region):
            raise ConfigError(f"provider 'ibm': {region!r} is not a VPC region name (for example us-south)")
        return cls(
            read.text("group") or "",
            region=region,
            endpoint=read.endpoint("endpoint"),
            iam_endpoint=read.endpoint("iam_endpoint"),
            max_attempts=read.integer("max_attempts", maximum=20),
            timeout_s=read.seconds("timeout_s"),
            page_size=read.integer("page_size", maximum=100),
            slots_per_host=slots_per_host,
        )

    # -- the SDK edge ------------------------------------------------------------------

    def _service(self) -> Any:
        """The VpcV1 client, built once: credentials, endpoint, retries and timeout applied."""
        if self._vpc is None:
            vpc = self.sdk["vpc"].VpcV1
            service = vpc(authenticator=self._authenticator())
            service.configure_service("vpc")  # VPC_URL and friends, the SDK's standard variables
            if self.endpoint:
                service.set_service_url(self.endpoint)
            elif service.service_url == vpc.DEFAULT_SERVICE_URL:
                service.set_service_url(
                    vpc.get_service_url_for_region(self.region) or f"https://{self.region}.iaas.cloud.ibm.com/v1"
                )
            if self.max_attempts > 1:
                service.enable_retries(max_retries=self.max_attempts - 1, retry_interval=min(30.0, 4 * self.timeout_s))
                # urllib3 follows a server's Retry-After for up to 6 hours unless told otherwise.
                service.retry_config.retry_after_max = self.timeout_s
            else:
                service.disable_retries()
            service.set_http_config({"timeout": self.timeout_s})
            _log.debug("%s: VPC API at %s", self.label, service.service_url)
            self._vpc = service
        return self._vpc

    def _authenticator(self) -> Any:
        try:
            found = self.sdk["core"].get_authenticator_from_environment("vpc")
        except ValueError as exc:
            raise FatalDiscoveryError(f"{self.label}: bad IBM SDK credential configuration: {one_line(exc)}") from exc
        if found is not None:
            return found
        apikey = next((os.environ[v] for v in _API_KEY_VARS if os.environ.get(v)), None)
        if apikey is None:
            raise FatalDiscoveryError(
                f"{self.label}: no IBM Cloud credentials; set IBMCLOUD_API_KEY (or VPC_APIKEY / VPC_AUTH_TYPE)"
            )
        return self.sdk["auth"].IAMAuthenticator(apikey, url=self.iam_endpoint)

    def _discover(self) -> DiscoveredHosts:
        service, pagers = self._service(), self.sdk["vpc"]
        if not self._group_checked:
            service.get_instance_group(self.group)  # a clear 404 for a wrong ID or region
            self._group_checked = True
        memberships = pagers.InstanceGroupMembershipsPager(
            client=service, instance_group_id=self.group, limit=self.page_size
        ).get_all()
        instances = {
            inst["id"]: inst
            for inst in pagers.InstancesPager(
                client=service, instance_group_membership_instance_group_id=self.group, limit=self.page_size
            ).get_all()
        }
        snapshot = SnapshotBuilder(self.label, once=self._once)
        for member in memberships:
            inst = instances.get(member.get("instance", {}).get("id", ""))
            if inst is None:
                continue
            verdict = classify(
                member.get("status", ""),
                inst.get("status", ""),
                [r.get("code", "") for r in inst.get("status_reasons", [])],
                inst.get("lifecycle_state", ""),
                inst.get("health_state", ""),
            )
            snapshot.add(_primary_ip(inst), verdict, lambda i=inst: self._slots_of(i),
                         order=inst.get("created_at", ""), instance=inst["id"])
        return snapshot.build()

    def _slots_of(self, inst: Mapping[str, Any]) -> int:
        # The instance states its own GPUs; the profile is asked only when it does not.
        gpu = inst.get("gpu")
        if isinstance(gpu, Mapping) and gpu.get("count") is not None:
            return self._slots.slots(("instance", int(gpu["count"])))
        return self._slots.slots(inst.get("profile", {}).get("name", ""))

    def _profile_gpus(self, key: Any) -> int:
        if isinstance(key, tuple):
            return key[1]
        result = self._service().get_instance_profile(key).get_result()
        gpu_count = result.get("gpu_count") or {}
        value = gpu_count.get("value", gpu_count.get("default"))
        if value is None and gpu_count.get("type") == "dependent":
            # Asked once per profile (SlotCache), so this is said once.
            _log.warning("%s: profile %s has a dependent GPU count and its instances state none; using 1 slot, "
                         "or pass --slots-per-host", self.label, key)
        return int(value or 0)

    def _translate(self, exc: Exception, sdk: Mapping[str, Any]) -> DiscoveryError | None:
        requests = sdk["requests"]
        if isinstance(exc, sdk["core"].ApiException):
            # ``status_code`` in recent SDKs; ``code`` (deprecated there) in older ones.
            status = getattr(exc, "status_code", None) or exc.__dict__.get("code")
            url = str(getattr(getattr(exc.http_response, "request", None), "url", ""))
            if "/identity/token" in url and status < 500:
                return FatalDiscoveryError(f"{self.label}: IBM Cloud IAM refused the API key: {one_line(exc.message)}")
            hint = " (check the instance group ID and region)" if status == 404 else ""
            if status in (401, 403):
                hint = " (check the IBM Cloud API key and its access policies)"
            return error_for_status(status, f"{self.label}: HTTP {status}: {one_line(exc.message)}{hint}")
        if isinstance(exc, requests.exceptions.RetryError):
            return RetryableDiscoveryError(
                f"{self.label}: still failing after {self.max_attempts} attempts: {one_line(exc)}"
            )
        if isinstance(exc, requests.exceptions.RequestException):
            return RetryableDiscoveryError(f"{self.label}: cannot reach the IBM Cloud API: {one_line(exc)}")
        return None

    def close(self) -> None:
        if self._vpc is not None:
            self._vpc.http_client.close()
        self._vpc = None


def _primary_ip(inst: Mapping[str, Any]) -> str | None:
    """The primary IPv4 of an instance, from a network interface or a network attachment."""
    for key in ("primary_network_interface", "primary_network_attachment"):
        nic = inst.get(key) or {}
        address = (nic.get("primary_ip") or {}).get("address") or nic.get("primary_ipv4_address")
        if not address:
            address = (((nic.get("virtual_network_interface") or {}).get("primary_ip")) or {}).get("address")
        if address and address != "0.0.0.0":
            return address
    return None
