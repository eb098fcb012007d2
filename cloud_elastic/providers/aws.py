"""AWS Auto Scaling group discovery (``--aws-asg NAME``).

Each :meth:`~AWSAutoScalingGroup.find` reads the group's members with
``DescribeAutoScalingGroups`` and joins them with ``DescribeInstances`` (chunks
of 200 instance ids, pages of ``page_size``) for private IPs, EC2 state and
launch time. GPU counts come from ``DescribeInstanceTypes`` (``GpuInfo``),
once per instance type. A group of 1,000 instances costs 1 + 5 calls per cycle.

State mapping (first matching row wins; only instances with a private IP appear):

=======================================================  ==========  ================  ==================
ASG ``LifecycleState``                                   health      EC2 state         result
=======================================================  ==========  ================  ==================
``Terminating``, ``Terminating:Wait``/``:Proceed``       any         any               draining (state)
``Detaching``, ``EnteringStandby``, ``Standby``          any         any               draining (state)
``InService``                                            Unhealthy   any               draining "Unhealthy"
``InService``                                            Healthy     ``stopping``,     draining "EC2 <state>"
                                                                     ``stopped``,
                                                                     ``shutting-down``,
                                                                     ``terminated``
``InService``                                            Healthy     ``running``       ready
``Pending*``, ``Warmed:*``, ``Detached``, ``Terminated``  any         any               absent
anything else (including EC2 ``pending``)                                               absent
=======================================================  ==========  ================  ==================

The group API gives no deadline, so drains carry ``deadline=None``; spot
interruption times come from the instance metadata service on the worker.

Credentials and endpoint: boto3's standard chain (environment, shared files,
SSO, container and instance roles). ``endpoint_url`` overrides both APIs'
endpoint; without it boto3 honours ``AWS_ENDPOINT_URL`` (and the
per-service ``AWS_ENDPOINT_URL_EC2`` / ``AWS_ENDPOINT_URL_AUTO_SCALING``).
Throttling, timeouts and 5xx are retried by botocore's ``standard`` retry mode
up to ``max_attempts``; what survives raises RetryableDiscoveryError. A
missing group, missing credentials or a denied call raise FatalDiscoveryError.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator, Mapping

from cloud_elastic.errors import ConfigError, DiscoveryError, FatalDiscoveryError, RetryableDiscoveryError
from cloud_elastic.providers._common import (
    ABSENT,
    READY,
    CloudGroupProvider,
    OptionReader,
    SlotCache,
    SnapshotBuilder,
    Verdict,
    draining,
    error_for_status,
    one_line,
    retry_options,
)
from cloud_elastic.providers.api import DiscoveredHosts, ProviderOption

__all__ = ["AWSAutoScalingGroup", "classify"]

_log = logging.getLogger(__name__)

_ID_CHUNK = 200  # EC2 accepts at most 200 values in one filter
_LEAVING_STATES = ("Terminating", "Detaching", "EnteringStandby", "Standby")
_EC2_LEAVING = ("stopping", "stopped", "shutting-down", "terminated")
_AUTH_CODES = {
    "AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure",
    "UnrecognizedClientException", "InvalidClientTokenId", "SignatureDoesNotMatch",
    "ExpiredToken", "ExpiredTokenException", "OptInRequired",
}


def classify(lifecycle: str, health: str, ec2_state: str | None) -> Verdict:
    """Map one member's ASG lifecycle state, ASG health and EC2 state (see the table)."""
    if lifecycle.startswith(_LEAVING_STATES):
        return draining(lifecycle)
    if lifecycle != "InService":
        return ABSENT
    if health != "Healthy":
        return draining(health or "Unhealthy")
    if ec2_state in _EC2_LEAVING:
        return draining(f"EC2 {ec2_state}")
    return READY if ec2_state == "running" else ABSENT


class AWSAutoScalingGroup(CloudGroupProvider):
    """Ready and draining members of one EC2 Auto Scaling group (see module docstring)."""

    name = "aws"
    description = "members of an AWS EC2 Auto Scaling group (--aws-asg); needs cloud-elastic[aws]"
    requires = ("boto3",)
    extra = "aws"
    sdk_package = "boto3"
    sdk_modules = {"boto3": "boto3", "config": "botocore.config", "errors": "botocore.exceptions"}
    options = (
        ProviderOption("group", "Auto Scaling group name", required=True),
        ProviderOption("region", "AWS region (default: boto3's, e.g. AWS_REGION or ~/.aws/config)"),
        ProviderOption("endpoint_url", "endpoint for both APIs (private/sovereign; default: AWS_ENDPOINT_URL or AWS's)"),
        *retry_options(),
        ProviderOption("page_size", "DescribeInstances page size (5-1000)", default="1000"),
    )

    def __init__(self, group: str, *, region: str | None = None, endpoint_url: str | None = None,
                 max_attempts: int = 5, timeout_s: float = 10.0, page_size: int = 1000,
                 slots_per_host: int | None = None) -> None:
        self.group = group
        self.region = region
        self.endpoint_url = endpoint_url
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.page_size = page_size
        self.label = f"AWS Auto Scaling group {group!r}"
        self._slots = SlotCache(self._gpus_of, fixed=slots_per_host)
        self._clients: tuple[Any, Any] | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str], *, slots_per_host: int | None = None) -> "AWSAutoScalingGroup":
        read = OptionReader(cls, options)
        group = read.text("group") or ""
        if len(group) > 255:
            raise ConfigError("provider 'aws': option 'group' is longer than 255 characters")
        return cls(
            group,
            region=read.text("region"),
            endpoint_url=read.endpoint("endpoint_url"),
            max_attempts=read.integer("max_attempts", maximum=20),
            timeout_s=read.seconds("timeout_s"),
            page_size=read.integer("page_size", minimum=5, maximum=1000),
            slots_per_host=slots_per_host,
        )

    # -- the SDK edge ------------------------------------------------------------------

    def _client_pair(self) -> tuple[Any, Any]:
        if self._clients is None:
            config = self.sdk["config"].Config(
                retries={"mode": "standard", "total_max_attempts": self.max_attempts},  # first attempt included
                connect_timeout=self.timeout_s,
                read_timeout=self.timeout_s,
            )
            session = self.sdk["boto3"].session.Session(region_name=self.region)
            kwargs = {"config": config}
            if self.endpoint_url:
                kwargs["endpoint_url"] = self.endpoint_url
            self._clients = (session.client("autoscaling", **kwargs), session.client("ec2", **kwargs))
            _log.debug("%s: clients for region %s", self.label, session.region_name)
        return self._clients

    def _discover(self) -> DiscoveredHosts:
        autoscaling, ec2 = self._client_pair()
        members = self._members(autoscaling)
        instances = dict(self._instances(ec2, [m["InstanceId"] for m in members]))
        self._learn_types(ec2, {m.get("InstanceType") for m in members} - {None})
        snapshot = SnapshotBuilder(self.label)
        for member in members:
            inst = instances.get(member["InstanceId"], {})
            verdict = classify(member.get("LifecycleState", ""), member.get("HealthStatus", ""),
                               inst.get("State", {}).get("Name"))
            itype = member.get("InstanceType") or inst.get("InstanceType")
            snapshot.add(inst.get("PrivateIpAddress"), verdict, lambda t=itype: self._slots.slots(t),
                         order=str(inst.get("LaunchTime", "")), instance=member["InstanceId"])
        return snapshot.build()

    def _members(self, autoscaling: Any) -> list[dict]:
        pages = autoscaling.get_paginator("describe_auto_scaling_groups").paginate(
            AutoScalingGroupNames=[self.group]
        )
        groups = [g for page in pages for g in page.get("AutoScalingGroups", [])]
        if not groups:
            region = autoscaling.meta.region_name
            raise FatalDiscoveryError(f"{self.label} not found in region {region}")
        return list(groups[0].get("Instances", []))

    def _instances(self, ec2: Any, ids: list[str]) -> Iterator[tuple[str, dict]]:
        paginator = ec2.get_paginator("describe_instances")
        for start in range(0, len(ids), _ID_CHUNK):
            chunk = ids[start:start + _ID_CHUNK]
            pages = paginator.paginate(
                Filters=[{"Name": "instance-id", "Values": chunk}],
                PaginationConfig={"PageSize": self.page_size},
            )
            for page in pages:
                for reservation in page.get("Reservations", []):
                    for inst in reservation.get("Instances", []):
                        yield inst["InstanceId"], inst

    def _learn_types(self, ec2: Any, types: set[str]) -> None:
        """One DescribeInstanceTypes call for the types not seen before (up to 100 per call).

        A batch the API rejects as naming an unknown type is retried type by
        type, so one odd type cannot hide the GPUs of the others; a type the
        API does not know gets 1 slot, with one warning.
        """
        unknown = sorted(t for t in types if not self._slots.known(t))
        for start in range(0, len(unknown), 100):
            batch = unknown[start:start + 100]
            try:
                self._describe_types(ec2, batch)
            except self.sdk["errors"].ClientError as exc:
                if exc.response.get("Error", {}).get("Code") != "InvalidInstanceType":
                    raise
                for one in batch if len(batch) > 1 else ():
                    try:
                        self._describe_types(ec2, [one])
                    except self.sdk["errors"].ClientError:
                        pass
        for odd in (t for t in unknown if not self._slots.known(t)):
            _log.warning("%s: DescribeInstanceTypes does not know %s; using 1 slot", self.label, odd)
            self._slots.prime(odd, 0)

    def _describe_types(self, ec2: Any, types: list[str]) -> None:
        for page in ec2.get_paginator("describe_instance_types").paginate(InstanceTypes=types):
            for info in page.get("InstanceTypes", []):
                gpus = sum(g.get("Count", 0) for g in info.get("GpuInfo", {}).get("Gpus", []))
                self._slots.prime(info["InstanceType"], gpus)

    def _gpus_of(self, instance_type: Any) -> int:
        # Only reached for a member without a type (never in practice): count it as CPU-only.
        return 0

    def _translate(self, exc: Exception, sdk: Mapping[str, Any]) -> DiscoveryError | None:
        errors = sdk["errors"]
        if not isinstance(exc, errors.BotoCoreError | errors.ClientError):
            return None
        if isinstance(exc, errors.NoCredentialsError | errors.PartialCredentialsError):
            return FatalDiscoveryError(f"{self.label}: no AWS credentials found by boto3's credential chain")
        if isinstance(exc, errors.NoRegionError):
            return FatalDiscoveryError(f"{self.label}: no AWS region; pass --aws-region or set AWS_REGION")
        if isinstance(exc, errors.ClientError):
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = f"{self.label}: {one_line(exc)}"
            if code in _AUTH_CODES:
                return FatalDiscoveryError(message)
            if "Throttl" in code or code in ("RequestLimitExceeded", "RequestTimeout", "ServiceUnavailable"):
                return RetryableDiscoveryError(message)
            return error_for_status(status, message)
        if isinstance(exc, errors.EndpointConnectionError | errors.ConnectionError | errors.HTTPClientError):
            return RetryableDiscoveryError(
                f"{self.label}: cannot reach the AWS endpoint (check the region): {one_line(exc)}"
            )
        return FatalDiscoveryError(f"{self.label}: {one_line(exc)}")

    def close(self) -> None:
        if self._clients is not None:
            for client in self._clients:
                client.close()
        self._clients = None
