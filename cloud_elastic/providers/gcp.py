"""Google Cloud Managed Instance Group discovery (``--gcp-mig NAME``).

Zonal (``zone``) and regional (``region``) MIGs. Each
:meth:`~GCPManagedInstanceGroup.find` lists the managed instances
(``listManagedInstances``), then the instances of each zone the group spans
with ``instances.list`` filtered on the group's base instance name (private IP
``networkInterfaces[0].networkIP``, accelerators, machine type, scheduling).
Instances named outside that pattern (stateful names) are read one by one
with ``instances.get``. The group is read once with ``instanceGroupManagers.get``
(base name); a machine type's accelerators once per type.

``listManagedInstances`` answers in one response unless the group's
``listManagedInstancesResults`` is ``PAGINATED``; only then does ``page_size``
split it. A zonal group of 1,000 instances therefore costs 1 + 2 calls per
cycle (2 + 2 for a ``PAGINATED`` group) at the default page size.

State mapping (first matching row wins; only instances with a private IP appear):

==================================================  =======================================  ==================
``currentAction``                                   ``instanceStatus`` / health               result
==================================================  =======================================  ==================
``DELETING``, ``ABANDONING``, ``RECREATING``,       any                                      draining (action)
``RESTARTING``, ``STOPPING``, ``SUSPENDING``
any                                                 ``STOPPED``, ``SUSPENDED``,              absent, logged once
                                                    ``TERMINATED``
any                                                 ``STOPPING``, ``PENDING_STOP``,           draining (status)
                                                    ``SUSPENDING``, ``DEPROVISIONING``,
                                                    ``REPAIRING``
any                                                 health ``UNHEALTHY``/``TIMEOUT``         draining "unhealthy"
any                                                 health ``DRAINING``                      draining "draining"
``NONE``, ``REFRESHING``                            ``RUNNING``                              ready
anything else (``CREATING``, ``VERIFYING``...)      any                                      absent
==================================================  =======================================  ==================

A stopped, suspended or terminated instance runs no workers, so it is not a
leaving host but no host at all: the group's stopped and suspended pools
(``targetStoppedSize``, ``targetSuspendedSize``) and a preempted Spot VM the
group has not recreated yet. Drains by action or status carry a deadline
when the cloud names one (health-check drains never do), the earliest of: the managed instance's ``scheduling.terminationTimestamp``,
its ``shutdownDetails`` (``requestTimestamp`` + ``maxDuration``, while in
``PENDING_STOP``), the instance's ``resourceStatus.scheduling.terminationTimestamp``
and ``scheduling.terminationTime``; otherwise ``None`` (Spot preemption
itself is seen only on the VM, ~30 s ahead).

Slots: the sum of the instance's ``guestAccelerators`` counts (N1 with
attached GPUs, and A2/A3/G2, whose GPUs are listed there too); else the
machine type's ``accelerators`` from ``machineTypes.get``; else 1. Custom
machine types (``custom-8-30720``, ``n2-custom-...``) carry no built-in GPUs
and are not looked up; a type ``machineTypes.get`` does not know (404/400)
gets 1 slot and a warning instead of failing discovery.

Credentials: Google Application Default Credentials (``GOOGLE_APPLICATION_CREDENTIALS``,
``gcloud auth application-default login``, the metadata server). ``endpoint``
overrides the Compute API endpoint (Private Service Connect, sovereign
clouds); the SDK has no environment variable for it. 429 and 5xx are retried
by google-api-core with exponential back-off until ``retry_deadline_s``; what
survives raises RetryableDiscoveryError. 404 (group, project or zone), 400,
401 and 403 raise FatalDiscoveryError.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Iterable, Mapping

from cloud_elastic.errors import (CapacityDeniedError, CapacityError, ConfigError, DiscoveryError, FatalDiscoveryError,
                                  RetryableDiscoveryError)
from cloud_elastic.providers._common import (ABSENT, READY, CloudGroupProvider, OnceLog, OptionReader, SlotCache,
                                             SnapshotBuilder, Verdict, absent, draining, error_for_status, one_line,
                                             parse_time)
from cloud_elastic.providers.api import DiscoveredHosts, ProviderOption

__all__ = ["GCPManagedInstanceGroup", "classify"]

_log = logging.getLogger(__name__)

_SCOPES = ["https://www.googleapis.com/auth/compute.readonly"]
_LEAVING_ACTIONS = {"DELETING", "ABANDONING", "RECREATING", "RESTARTING", "STOPPING", "SUSPENDING"}
_LEAVING_STATUS = {"STOPPING", "PENDING_STOP", "SUSPENDING", "DEPROVISIONING", "REPAIRING"}
_OFF_STATUS = {"STOPPED", "SUSPENDED", "TERMINATED"}
_RUNNING_ACTIONS = {"NONE", "REFRESHING"}
_INSTANCE_URL = re.compile(r"/zones/(?P<zone>[^/]+)/instances/(?P<name>[^/]+)$")
_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# custom-CPUS-MEMORY, with an optional series prefix (n2-, n2d-, e2-...) and -ext suffix.
_CUSTOM_TYPE = re.compile(r"^([a-z0-9]+-)?custom-[0-9]+-[0-9]+(-ext)?$")


def classify(current_action: str, instance_status: str, health: Iterable[str] = (),
             deadline: float | None = None) -> Verdict:
    """Map one managed instance's action, status and health-check states (see the table).

    ``deadline`` (Unix seconds, or ``None``) is put on drains the group or the
    instance is carrying out (an action or a leaving status). A health-check
    drain gets none: the instance is not being taken, and a stale termination
    time must not make the driver remove its workers by force.
    """
    if current_action in _LEAVING_ACTIONS:
        return draining(current_action, deadline)
    if instance_status in _OFF_STATUS:
        return absent(f"instance {instance_status}")
    if instance_status in _LEAVING_STATUS:
        return draining(f"instance {instance_status}", deadline)
    health = set(health)
    if health & {"UNHEALTHY", "TIMEOUT"}:
        return draining("unhealthy")
    if "DRAINING" in health:
        return draining("draining")
    if current_action in _RUNNING_ACTIONS and instance_status == "RUNNING":
        return READY
    return ABSENT


class GCPManagedInstanceGroup(CloudGroupProvider):
    """Ready and draining instances of one zonal or regional MIG (see module docstring)."""

    name = "gcp"
    description = "instances of a Google Cloud Managed Instance Group (--gcp-mig); needs cloud-elastic[gcp]"
    requires = ("google.cloud.compute_v1",)
    extra = "gcp"
    sdk_package = "google-cloud-compute"
    sdk_modules = {
        "errors": "google.api_core.exceptions",
        "auth_errors": "google.auth.exceptions",
        "requests": "requests",
        "compute": "google.cloud.compute_v1",
        "retry": "google.api_core.retry",
        "client_options": "google.api_core.client_options",
        "auth": "google.auth",
    }
    options = (
        ProviderOption("group", "Managed Instance Group name", required=True),
        ProviderOption("project", "project ID", required=True),
        ProviderOption("zone", "zone of a zonal MIG (give zone or region)"),
        ProviderOption("region", "region of a regional MIG (give zone or region)"),
        ProviderOption("endpoint", "Compute API endpoint (default https://compute.googleapis.com)"),
        ProviderOption("retry_deadline_s", "give up retrying 429/5xx of one call after this many seconds", default="30"),
        ProviderOption("timeout_s", "timeout of one API request, seconds", default="10"),
        ProviderOption("page_size", "results per page of instances.list, and of listManagedInstances for a "
                       "PAGINATED group (1-500)", default="500"),
    )

    can_set_capacity = True

    def __init__(self, group: str, *, project: str, zone: str | None = None, region: str | None = None,
                 endpoint: str | None = None, retry_deadline_s: float = 30.0, timeout_s: float = 10.0,
                 page_size: int = 500, slots_per_host: int | None = None) -> None:
        if (zone is None) == (region is None):
            raise ConfigError("provider 'gcp' needs exactly one of options 'zone' and 'region'")
        self.group = group
        self.project = project
        self.zone = zone
        self.region = region
        self.endpoint = endpoint
        self.retry_deadline_s = retry_deadline_s
        self.timeout_s = timeout_s
        self.page_size = page_size
        where = f"zone {zone}" if zone else f"region {region}"
        self.label = f"GCP managed instance group {group!r} ({project}, {where})"
        self._slots = SlotCache(self._machine_type_gpus, fixed=slots_per_host)
        self._api: dict[str, Any] | None = None
        self._base_name: str | None = None
        self._once = OnceLog(_log)

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "GCPManagedInstanceGroup":
        read = OptionReader(cls, options)
        group = read.text("group") or ""
        if not _NAME.match(group):
            raise ConfigError(f"provider 'gcp': {group!r} is not a valid instance group name")
        return cls(
            group,
            project=read.text("project") or "",
            zone=read.text("zone"),
            region=read.text("region"),
            endpoint=read.endpoint("endpoint"),
            retry_deadline_s=read.seconds("retry_deadline_s"),
            timeout_s=read.seconds("timeout_s"),
            page_size=read.integer("page_size", maximum=500),
            slots_per_host=slots_per_host,
        )

    # -- the SDK edge ------------------------------------------------------------------

    def _clients(self) -> dict[str, Any]:
        if self._api is None:
            sdk = self.sdk
            errors, requests, retry = sdk["errors"], sdk["requests"], sdk["retry"]
            credentials, _ = sdk["auth"].default(scopes=_SCOPES)
            kwargs: dict[str, Any] = {"credentials": credentials, "transport": "rest"}
            if self.endpoint:
                kwargs["client_options"] = sdk["client_options"].ClientOptions(api_endpoint=self.endpoint)
            compute = sdk["compute"]
            groups = compute.InstanceGroupManagersClient if self.zone else compute.RegionInstanceGroupManagersClient
            transient = (errors.TooManyRequests, errors.InternalServerError, errors.BadGateway,
                         errors.ServiceUnavailable, errors.GatewayTimeout, requests.ConnectionError, requests.Timeout)
            self._api = {
                "groups": groups(**kwargs),
                "instances": compute.InstancesClient(**kwargs),
                "machine_types": compute.MachineTypesClient(**kwargs),
                "call": {
                    "retry": retry.Retry(predicate=retry.if_exception_type(*transient), initial=0.5, maximum=8.0,
                                         multiplier=2.0, timeout=self.retry_deadline_s),
                    "timeout": self.timeout_s,
                },
            }
        return self._api

    def _where(self) -> dict[str, str]:
        return {"zone": self.zone} if self.zone else {"region": self.region}

    def _discover(self) -> DiscoveredHosts:
        api = self._clients()
        call, groups = api["call"], api["groups"]
        if self._base_name is None:
            igm = groups.get(project=self.project, instance_group_manager=self.group, **self._where(), **call)
            self._base_name = igm.base_instance_name
        managed = []
        for member in groups.list_managed_instances(
            request={"project": self.project, "instance_group_manager": self.group,
                     "max_results": self.page_size, **self._where()},
            **call,
        ):
            match = _INSTANCE_URL.search(member.instance)
            if match:  # a member still being created may have no instance URL yet
                managed.append((match["zone"], match["name"], member))
        instances = self._instances(api, managed)
        snapshot = SnapshotBuilder(self.label, once=self._once)
        for zone, name, member in managed:
            inst = instances.get((zone, name))
            if inst is None:
                continue
            health = [h.detailed_health_state for h in member.instance_health]
            verdict = classify(member.current_action, member.instance_status, health, _deadline(member, inst))
            address = inst.network_interfaces[0].network_i_p if inst.network_interfaces else None
            snapshot.add(address, verdict, lambda i=inst, z=zone: self._slots_of(i, z),
                         # The numeric id, not the name: a recreated VM keeps its name (and often its IP)
                         # but is a new machine with new host keys.
                         order=inst.creation_timestamp, instance=str(inst.id) if inst.id else name)
        return snapshot.build()

    def _instances(self, api: Mapping[str, Any], managed: list[tuple[str, str, Any]]) -> dict[tuple[str, str], Any]:
        """The members' instances by (zone, name): one filtered list per zone, plus a get per odd name."""
        by_zone: dict[str, set[str]] = {}
        for zone, name, _ in managed:
            by_zone.setdefault(zone, set()).add(name)
        found: dict[tuple[str, str], Any] = {}
        for zone, names in sorted(by_zone.items()):
            pages = api["instances"].list(
                request={"project": self.project, "zone": zone, "max_results": self.page_size,
                         # Base names are [-a-z0-9] only, so they need no regex escaping.
                         "filter": f'name eq "{self._base_name}-.*"'},
                **api["call"],
            )
            found.update(((zone, inst.name), inst) for inst in pages if inst.name in names)
            for name in sorted(n for n in names if (zone, n) not in found):
                try:
                    found[(zone, name)] = api["instances"].get(project=self.project, zone=zone, instance=name,
                                                               **api["call"])
                except self.sdk["errors"].NotFound:
                    _log.debug("%s: instance %s/%s is already gone", self.label, zone, name)
        return found

    def _slots_of(self, inst: Any, zone: str) -> int:
        # GPUs attached to the instance (N1 style) win; otherwise the machine type's own (A2, A3, G2).
        attached = sum(a.accelerator_count for a in inst.guest_accelerators)
        if attached:
            return self._slots.slots(("attached", attached))
        return self._slots.slots((zone, inst.machine_type.rsplit("/", 1)[-1]))

    def _machine_type_gpus(self, key: Any) -> int:
        if key[0] == "attached":
            return key[1]
        zone, machine_type = key
        if _CUSTOM_TYPE.match(machine_type):
            return 0  # custom types are CPU and memory only; GPUs come attached (guestAccelerators)
        api, errors = self._clients(), self.sdk["errors"]
        try:
            info = api["machine_types"].get(project=self.project, zone=zone, machine_type=machine_type, **api["call"])
        except (errors.NotFound, errors.BadRequest) as exc:
            # Cached like any answer, so this is said once per type; discovery must not die of one odd type.
            _log.warning("%s: machine type %s (%s) cannot be described (%s); using 1 slot, or pass --slots-per-host",
                         self.label, machine_type, zone, one_line(exc.message or exc, 120))
            return 0
        return sum(a.guest_accelerator_count for a in info.accelerators)

    def set_capacity(self, hosts: int, *, source: str | None = None) -> None:
        """Resize the MIG to ``hosts`` instances (``--manage-capacity``): one ``instanceGroupManagers.resize``,
        whose operation is not waited for (the next finds show the instances as they come)."""
        errors = self.sdk["errors"]
        try:
            api = self._clients()
            api["groups"].resize_unary(project=self.project, instance_group_manager=self.group, size=hosts,
                                       **self._where(), **api["call"])
        except errors.Forbidden as exc:
            raise CapacityDeniedError(f"{self.label}: resize: {one_line(exc.message or exc)}") from exc
        except Exception as exc:
            error = self._translate(exc, self.sdk)
            if error is None:
                raise
            raise CapacityError(f"resize to {hosts}: {error}") from exc

    def _translate(self, exc: Exception, sdk: Mapping[str, Any]) -> DiscoveryError | None:
        auth, errors = sdk["auth_errors"], sdk["errors"]
        if isinstance(exc, auth.TransportError):
            return RetryableDiscoveryError(f"{self.label}: cannot reach the token endpoint: {one_line(exc)}")
        if isinstance(exc, auth.RefreshError) and (isinstance(exc.__cause__, auth.TransportError)
                                                  or getattr(exc, "retryable", False)):
            # google-auth wraps a metadata server's 5xx or a dropped connection while refreshing a token in a
            # RefreshError: the next call refreshes again, so it is no proof the credentials are unusable.
            return RetryableDiscoveryError(f"{self.label}: could not refresh the access token: {one_line(exc)}")
        if isinstance(exc, auth.GoogleAuthError):
            return FatalDiscoveryError(
                f"{self.label}: no usable Google credentials (Application Default Credentials): {one_line(exc)}"
            )
        if isinstance(exc, errors.RetryError):
            return RetryableDiscoveryError(
                f"{self.label}: still failing after retrying for {self.retry_deadline_s:g}s: {one_line(exc.cause or exc)}"
            )
        if isinstance(exc, errors.GoogleAPICallError):
            status = exc.code if isinstance(exc.code, int) else None
            hint = " (check the group name, project and zone/region)" if status == 404 else ""
            return error_for_status(status, f"{self.label}: {one_line(exc.message or exc)}{hint}")
        if isinstance(exc, sdk["requests"].RequestException):
            return RetryableDiscoveryError(f"{self.label}: cannot reach the Compute API: {one_line(exc)}")
        return None

    def close(self) -> None:
        if self._api is not None:
            for key in ("groups", "instances", "machine_types"):
                client = self._api.get(key)
                transport = getattr(client, "transport", None)
                if transport is not None:
                    transport.close()
        self._api = None


def _deadline(member: Any, inst: Any) -> float | None:
    """The earliest time the cloud says it will stop or delete the instance, or ``None`` (see the module docstring)."""
    times = [parse_time(member.scheduling.termination_timestamp),
             parse_time(inst.resource_status.scheduling.termination_timestamp),
             parse_time(inst.scheduling.termination_time)]
    shutdown = member.shutdown_details
    requested = parse_time(shutdown.request_timestamp)
    if requested is not None and "max_duration" in shutdown:
        times.append(requested + shutdown.max_duration.seconds + shutdown.max_duration.nanos / 1e9)
    known = [t for t in times if t is not None]
    return min(known) if known else None
