"""AWS Auto Scaling group discovery (``--aws-asg NAME``), with queue-mode notices and lifecycle hooks.

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
``ReplacingRootVolume*``, ``RootVolumeReplaced``         any         any               draining (state)
``Pending*``, ``Warmed:*``, ``Detached``, ``Terminated``  any         any               absent
``InService``                                            Unhealthy   any               draining "Unhealthy"
``InService``                                            Healthy     ``stopping``,     draining "EC2 <state>"
                                                                     ``stopped``,
                                                                     ``shutting-down``,
                                                                     ``terminated``
``InService``                                            Healthy     ``running``       ready
``InService``                                            Healthy     anything else     absent
                                                                     (``pending``)
any other state (one this version does not know)         any         any               draining (state)
=======================================================  ==========  ================  ==================

A root-volume replacement reboots the instance, so its workers die: the host
drains. An unknown state drains too: leaving is the safer reading.

Slots: one per GPU device an instance sees, ``LogicalGpuCount`` summed over
``GpuInfo.Gpus`` (``Count`` where it is absent), 1 for CPU-only types. A
fractional-GPU type (g6f: ``Count`` 0, ``LogicalGpuCount`` 1,
``GpuPartitionSize`` 0.125) is one slot per partition: a worker per device.

Order: hosts are ordered by parsed ``LaunchTime`` (oldest first, so the
longest-lived hosts get the lowest ranks), whatever offset the time is written in.

Deadlines and notices, laid over the group state (the earliest deadline wins;
a notice's reason wins over the state's):

* ``Terminating:Wait`` held by a termination lifecycle hook: deadline = when
  the hold started + the hook's ``HeartbeatTimeout``; heartbeats move it while
  the job still needs the host, :meth:`~AWSAutoScalingGroup.release` completes
  the action (see :mod:`cloud_elastic.providers.aws_hooks`).
* With ``notice_queue`` (``--aws-notice-queue URL``): spot interruption
  warnings (deadline = event time + 120 s), terminate lifecycle actions and
  rebalance recommendations read from SQS (see
  :mod:`cloud_elastic.providers.aws_notices`). A rebalance recommendation is a
  soft notice (:attr:`~AWSAutoScalingGroup.soft_notices`) unless
  ``drain_on_rebalance``. A notice lasts until its instance leaves the group
  or it lapses (:meth:`~cloud_elastic.providers.aws_notices.NoticeBook.lapse`:
  a spot or lifecycle notice 2 minutes past its deadline while the group
  state shows the instance ready, a rebalance recommendation 10 minutes after
  it was sent). Each find() reads what waits in the queue; once the driver
  asks for news (:meth:`~AWSAutoScalingGroup.wake_on_news`), a receiver thread
  long-polls the queue instead and wakes the driver's poller when a notice
  for a member arrives. Queue trouble never fails discovery after the first
  one (the group state still answers; WARNING at most once a minute); on the
  first discovery a queue that does not exist or may not be read is fatal.

Credentials and endpoint: boto3's standard chain (environment, shared files,
SSO, container and instance roles). ``endpoint_url`` overrides the three APIs'
endpoint; without it boto3 honours ``AWS_ENDPOINT_URL`` (and the per-service
``AWS_ENDPOINT_URL_EC2`` / ``AWS_ENDPOINT_URL_AUTO_SCALING`` / ``AWS_ENDPOINT_URL_SQS``).
Throttling, timeouts and 5xx are retried by botocore's ``standard`` retry mode
up to ``max_attempts``; what survives raises RetryableDiscoveryError. A
missing group, missing credentials or a denied call raise FatalDiscoveryError.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping

from cloud_elastic.errors import (CapacityError, ConfigError, DiscoveryError, FatalDiscoveryError,
                                  RetryableDiscoveryError)
from cloud_elastic.providers._common import (ABSENT, READY, CloudGroupProvider, OptionReader, SlotCache,
                                             SnapshotBuilder, Verdict, draining, error_for_status, one_line,
                                             retry_options)
from cloud_elastic.providers.api import DiscoveredHosts, Drain, ProviderOption, parse_bool
from cloud_elastic.providers.aws_hooks import LifecycleHolds
from cloud_elastic.providers.aws_pricing import InstancePrice, SpotPrices, set_desired_capacity
from cloud_elastic.providers.aws_notices import (Ignored, Notice, NoticeBook, QueueReceiver, parse_message, receive_all)

__all__ = ["AWSAutoScalingGroup", "classify", "gpu_devices", "launch_order"]

_log = logging.getLogger(__name__)

_ID_CHUNK = 200  # EC2 accepts at most 200 values in one filter
_LEAVING_STATES = ("Terminating", "Detaching", "EnteringStandby", "Standby", "ReplacingRootVolume",
                   "RootVolumeReplaced")
_ABSENT_STATES = ("Pending", "Warmed:", "Detached", "Terminated")
_EC2_LEAVING = ("stopping", "stopped", "shutting-down", "terminated")
_NO_QUEUE_CODES = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "InvalidAddress"}
_QUEUE_WARN_EVERY_S = 60.0
_AUTH_CODES = {
    "AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure",
    "UnrecognizedClientException", "InvalidClientTokenId", "SignatureDoesNotMatch",
    "ExpiredToken", "ExpiredTokenException", "OptInRequired",
}


def classify(lifecycle: str, health: str, ec2_state: str | None) -> Verdict:
    """Map one member's ASG lifecycle state, ASG health and EC2 state (see the table)."""
    if lifecycle.startswith(_LEAVING_STATES):
        return draining(lifecycle)
    if lifecycle.startswith(_ABSENT_STATES) or not lifecycle:
        return ABSENT
    if lifecycle != "InService":
        # A state this version does not know: leaving is the safer reading (the host's
        # workers leave at their next commit instead of being cut off mid-step).
        return draining(lifecycle)
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
        ProviderOption("endpoint_url",
                       "endpoint for every AWS API used (private/sovereign; default: AWS_ENDPOINT_URL or AWS's)"),
        *retry_options(),
        ProviderOption("page_size", "DescribeInstances page size (5-1000)", default="1000"),
        ProviderOption("notice_queue", "SQS queue URL fed by EventBridge with spot, rebalance and lifecycle events "
                       "(--aws-notice-queue; see docs/providers.md)"),
        ProviderOption("drain_on_rebalance", "drain a host on a rebalance recommendation instead of only "
                       "reporting it", default="false"),
        ProviderOption("lifecycle_hook", "the termination lifecycle hook to heartbeat and complete; needed when "
                       "the group has several (default: the one a notice names, or the group's only one)"),
        ProviderOption("on_demand_price", "dollars per instance-hour of the group's on-demand instances, for the "
                       "job's cost (spot instances are priced from DescribeSpotPriceHistory)"),
    )
    can_set_capacity = True

    def __init__(self, group: str, *, region: str | None = None, endpoint_url: str | None = None,
                 max_attempts: int = 5, timeout_s: float = 10.0, page_size: int = 1000,
                 slots_per_host: int | None = None, notice_queue: str | None = None,
                 drain_on_rebalance: bool = False, lifecycle_hook: str | None = None,
                 clock: Callable[[], float] = time.time, queue_wait_s: int = 20,
                 on_demand_price: float | None = None) -> None:
        self.group = group
        self.region = region
        self.endpoint_url = endpoint_url
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self.page_size = page_size
        self.notice_queue = notice_queue
        self.drain_on_rebalance = drain_on_rebalance
        self.label = f"AWS Auto Scaling group {group!r}"
        self._clock = clock
        self._slots = SlotCache(self._gpus_of, fixed=slots_per_host)
        self._clients: dict[str, Any] = {}
        self._book = NoticeBook(self.label, group)
        self._holds = LifecycleHolds(self.label, group, clock, hook_name=lifecycle_hook)
        self._soft: Mapping[str, str] = MappingProxyType({})
        self._hosts: dict[str, str] = {}  # host -> instance id, from the last snapshot
        self._first = True
        self._queue_warned_at = float("-inf")
        self._queue_wait_s = queue_wait_s  # the receiver's long-poll (WaitTimeSeconds)
        self._wake: Callable[[], None] | None = None
        self._receiver: QueueReceiver | None = None
        self._member_ids: frozenset[str] = frozenset()  # instance ids of the last snapshot, for the receiver
        self.on_demand_price = on_demand_price
        self._spot = SpotPrices(clock)
        self._priced: dict[str, InstancePrice] = {}  # host -> what decides its price, from the last snapshot
        self._limits: tuple | None = None  # the group's (MinSize, MaxSize[, DesiredCapacity]), from the last snapshot

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
            notice_queue=read.endpoint("notice_queue"),
            drain_on_rebalance=parse_bool("drain_on_rebalance", read.text("drain_on_rebalance") or "false"),
            lifecycle_hook=read.text("lifecycle_hook"),
            on_demand_price=_price(read.text("on_demand_price")),
        )

    @property
    def soft_notices(self) -> Mapping[str, str]:
        """Ready hosts with a soft notice in the last snapshot (host -> reason), read-only.

        A rebalance recommendation says AWS may reclaim the instance soon; the
        host stays ready (unless ``drain_on_rebalance``), but a careful driver
        places no new worker on it.
        """
        return self._soft

    # -- the SDK edge ------------------------------------------------------------------

    def _client(self, service: str) -> Any:
        """One boto3 client per service (autoscaling, ec2, sqs), built on first use with the retry bounds."""
        if service not in self._clients:
            self._clients[service] = self._new_client(service, self.timeout_s)
        return self._clients[service]

    def _new_client(self, service: str, read_timeout_s: float) -> Any:
        config = self.sdk["config"].Config(
            retries={"mode": "standard", "total_max_attempts": self.max_attempts},  # first attempt included
            connect_timeout=self.timeout_s,
            read_timeout=read_timeout_s,
        )
        session = self.sdk["boto3"].session.Session(region_name=self.region)
        kwargs: dict[str, Any] = {"config": config}
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        _log.debug("%s: %s client for region %s", self.label, service, session.region_name)
        return session.client(service, **kwargs)

    def _discover(self) -> DiscoveredHosts:
        autoscaling, ec2 = self._client("autoscaling"), self._client("ec2")
        members = self._members(autoscaling)
        ids = [m["InstanceId"] for m in members]
        instances = dict(self._instances(ec2, ids))
        self._learn_types(ec2, {m.get("InstanceType") for m in members} - {None})
        if self.notice_queue:
            self._read_queue(ids, instances)
            self._lapse(members, instances)
        self._book.forget(ids)
        self._holds.forget(ids)
        for member in members:
            state = member.get("LifecycleState", "")
            if state == "Terminating:Wait":
                self._holds.waiting(member["InstanceId"])
            elif state in ("Terminating:Proceed", "Terminated"):
                self._holds.past_wait(member["InstanceId"])
        self._holds.service(autoscaling, self._client_errors())
        snapshot = SnapshotBuilder(self.label)
        for member in members:
            inst = instances.get(member["InstanceId"], {})
            verdict = classify(member.get("LifecycleState", ""), member.get("HealthStatus", ""),
                               inst.get("State", {}).get("Name"))
            itype = member.get("InstanceType") or inst.get("InstanceType")
            snapshot.add(inst.get("PrivateIpAddress"), verdict, lambda t=itype: self._slots.slots(t),
                         order=launch_order(inst.get("LaunchTime")), instance=member["InstanceId"])
        result = self._with_notices(snapshot.build())
        for host in result.ready:
            self._holds.in_use(result.instances.get(host, ""))
        self._hosts = dict(result.instances)
        by_id = {i: h for h, i in result.instances.items()}
        self._priced = {by_id[i]: InstancePrice.of(inst) for i, inst in instances.items() if i in by_id}
        self._member_ids = frozenset(ids)
        self._first = False
        if self._wake is not None and self._receiver is None:
            self._start_receiver()
        return result

    def _with_notices(self, snapshot: DiscoveredHosts) -> DiscoveredHosts:
        """Lay notices and lifecycle-hook deadlines over the group state's snapshot.

        Deadline: the earliest one known (a spot interruption, the hook's
        timeout). Reason: a notice's, else the group state's.
        """
        ready, drain, soft = dict(snapshot.ready), dict(snapshot.draining), {}
        for host, instance in snapshot.instances.items():
            notices = self._book.of(instance)
            hold = self._holds.held(instance)
            deadlines = [d for d in (notices["spot"].deadline if "spot" in notices else None,
                                     self._holds.deadline(instance)) if d is not None]
            reason = next((notices[k].reason for k in ("spot", "lifecycle") if k in notices), None)
            rebalance = notices.get("rebalance")
            if reason is None and rebalance is not None and self.drain_on_rebalance:
                reason = rebalance.reason
            current = drain.get(host)
            if current is None and reason is None:
                if rebalance is not None:
                    soft[host] = rebalance.reason
                continue
            if reason is None:
                reason = current.reason
                if hold is not None and hold.timed_by and reason == "Terminating:Wait":
                    reason = f"Terminating:Wait (lifecycle hook {hold.timed_by})"
            ready.pop(host, None)
            drain[host] = Drain(min(deadlines) if deadlines else None, reason)
        self._soft = MappingProxyType(soft)
        return DiscoveredHosts(ready=ready, draining=drain, instances=snapshot.instances, soft=soft)

    # -- queue mode ----------------------------------------------------------------------

    def _read_queue(self, members: list[str], instances: Mapping[str, dict]) -> None:
        """Receive and file what waits in the notice queue.

        The group state is still right when the queue cannot be read, and SQS
        keeps the messages until they are received, so queue trouble costs
        only the notice's lead time: it is logged (WARNING at most once a
        minute) and discovery goes on. Except on the first discovery, where a
        queue that does not exist or may not be read is a misconfiguration
        (FatalDiscoveryError), not something to run a whole job without.
        """
        def file(body: str) -> None:
            self._file(parse_message(body), members, instances)

        if self._receiver is not None:
            for body in self._receiver.take():
                file(body)
            return
        errors = self.sdk["errors"]
        try:
            receive_all(self._client("sqs"), self.notice_queue, file)
        except (errors.BotoCoreError, errors.ClientError) as exc:
            code = exc.response.get("Error", {}).get("Code", "") if isinstance(exc, errors.ClientError) else ""
            if self._first and (code in _NO_QUEUE_CODES or code in _AUTH_CODES):
                raise FatalDiscoveryError(f"{self.label}: notice queue {self.notice_queue}: {one_line(exc)}") from exc
            self._queue_unreadable(exc)

    def _queue_unreadable(self, exc: Exception) -> None:
        now = self._clock()
        level = logging.WARNING if now - self._queue_warned_at >= _QUEUE_WARN_EVERY_S else logging.DEBUG
        if level == logging.WARNING:
            self._queue_warned_at = now
        _log.log(level, "%s: cannot read notice queue %s (group state still used): %s",
                 self.label, self.notice_queue, one_line(exc))

    def _lapse(self, members: list[dict], instances: Mapping[str, dict]) -> None:
        """Drop the notices AWS did not follow up (see NoticeBook.lapse); the instance is used again."""
        ready = [m["InstanceId"] for m in members if classify(
            m.get("LifecycleState", ""), m.get("HealthStatus", ""),
            instances.get(m["InstanceId"], {}).get("State", {}).get("Name")) == READY]
        for notice in self._book.lapse(self._clock(), ready):
            _log.info("%s: the %s for %s lapsed (sent %s, the group still shows it in service)", self.label,
                      notice.reason, notice.instance, _iso(notice.time))

    def wake_on_news(self, wake: Callable[[], None]) -> None:
        """With a notice queue: long-poll it on a receiver thread and call ``wake`` when a member's notice arrives.

        The receiver starts now if a find() has succeeded, else after the first
        one (which reads the queue itself, so a missing queue is still fatal).
        Without a notice queue this does nothing.
        """
        if not self.notice_queue:
            return
        self._wake = wake
        if not self._first and self._receiver is None:
            self._start_receiver()

    def _start_receiver(self) -> None:
        assert self._wake is not None and self.notice_queue
        sqs = self._new_client("sqs", self.timeout_s + self._queue_wait_s)  # its own: it runs on its own thread
        self._receiver = QueueReceiver(sqs, self.notice_queue, wake=self._wake, urgent=self._urgent,
                                       trouble=self._queue_unreadable, wait_s=self._queue_wait_s)
        self._receiver.start()
        _log.debug("%s: long-polling notice queue %s", self.label, self.notice_queue)

    def _urgent(self, body: str) -> bool:
        """Whether ``body`` is a notice for a member of the group (others wait for the next find())."""
        parsed = parse_message(body)
        return isinstance(parsed, Notice) and parsed.instance in self._member_ids and parsed.group in (None, self.group)

    def _file(self, parsed: Notice | Ignored, members: list[str], instances: Mapping[str, dict]) -> None:
        if self._book.take(parsed, members) != "recorded" or not isinstance(parsed, Notice):
            return
        host = instances.get(parsed.instance, {}).get("PrivateIpAddress") or "no address yet"
        deadline = "none" if parsed.deadline is None else _iso(parsed.deadline)
        _log.info("%s: %s for %s (host %s), sent %s, deadline %s", self.label, parsed.reason, parsed.instance,
                  host, _iso(parsed.time), deadline)
        if parsed.kind == "lifecycle" and parsed.hook:
            self._holds.action(parsed.instance, since=parsed.time, hook=parsed.hook, token=parsed.token)

    # -- the write path ------------------------------------------------------------------

    def release(self, host: str, instance: str | None) -> None:
        """Let ``host``'s instance terminate if a lifecycle hook holds it (see :mod:`.aws_hooks`).

        Completes the lifecycle action with ``CONTINUE`` exactly once, now if
        the instance is held, else as soon as a later find() sees it held.
        Errors are logged and retried at the next find(); never raised.
        """
        instance = instance or self._hosts.get(host)
        if not instance:
            _log.debug("%s: release(%s): no instance known for this host", self.label, host)
            return
        self._holds.release(self._client("autoscaling"), self._client_errors(), instance)

    def set_capacity(self, hosts: int, *, source: str | None = None) -> None:
        """``SetDesiredCapacity`` of the group (``--manage-capacity``; see :mod:`.aws_pricing`)."""
        set_desired_capacity(self._client("autoscaling"), self.sdk["errors"], self.group, hosts, self.label)

    def capacity_refused(self, exc: CapacityError) -> bool:
        """Proven refused only where botocore sent ``SetDesiredCapacity`` once and AWS answered it with an HTTP
        4xx (``ResponseMetadata.RetryAttempts`` 0: ValidationError, AccessDenied; Throttling is retried, so only
        with ``max_attempts`` 1). A retried call (its first attempt may have landed, its answer lost to a read
        timeout), a 408, a 5xx, a timeout or a connection error: not proven (the raise stays the job's)."""
        cause = exc.__cause__
        if not isinstance(cause, self.sdk["errors"].ClientError):
            return False
        meta = cause.response.get("ResponseMetadata", {})
        status, retries = meta.get("HTTPStatusCode"), meta.get("RetryAttempts")
        return retries == 0 and isinstance(status, int) and 400 <= status < 500 and status != 408

    def capacity_limits(self) -> tuple[int, int] | tuple[int, int, int] | None:
        """The group's MinSize and MaxSize as the last find() read them (SetDesiredCapacity must stay within),
        and its DesiredCapacity then."""
        return self._limits

    def hourly_prices(self, snapshot: DiscoveredHosts) -> Mapping[str, float]:
        """Spot instances at their latest spot price, on-demand ones at ``on_demand_price`` (see :mod:`.aws_pricing`)."""
        wanted = {h: self._priced[h] for h in (*snapshot.ready, *snapshot.draining) if h in self._priced}
        try:
            return self._spot.prices(self._client("ec2"), wanted, self.on_demand_price)
        except Exception as exc:
            error = self._translate(exc, self.sdk)
            if error is None:
                raise
            raise error from exc

    def _client_errors(self) -> tuple[type[BaseException], ...]:
        errors = self.sdk["errors"]
        return (errors.BotoCoreError, errors.ClientError)

    def _members(self, autoscaling: Any) -> list[dict]:
        pages = autoscaling.get_paginator("describe_auto_scaling_groups").paginate(
            AutoScalingGroupNames=[self.group]
        )
        groups = [g for page in pages for g in page.get("AutoScalingGroups", [])]
        if not groups:
            region = autoscaling.meta.region_name
            raise FatalDiscoveryError(f"{self.label} not found in region {region}")
        low, high, desired = (groups[0].get(k) for k in ("MinSize", "MaxSize", "DesiredCapacity"))
        self._limits = (low, high) if isinstance(low, int) and isinstance(high, int) else None
        if self._limits is not None and isinstance(desired, int):
            self._limits = (low, high, desired)
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
                self._slots.prime(info["InstanceType"], gpu_devices(info.get("GpuInfo", {})))

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
        self._wake = None
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None
        for client in self._clients.values():
            client.close()
        self._clients = {}


def _price(text: str | None) -> float | None:
    if text is None:
        return None
    from cloud_elastic.providers.sources import parse_price

    return parse_price("provider 'aws': option 'on_demand_price'", text)  # what --source's price= takes


def gpu_devices(gpu_info: Mapping[str, Any]) -> int:
    """GPU devices an instance of a type sees (``GpuInfo``): whole GPUs and GPU partitions alike.

    ``LogicalGpuCount`` counts devices; ``Count`` counts physical GPUs, and is
    0 for fractional types (g6f.large: ``Count`` 0, ``LogicalGpuCount`` 1,
    ``GpuPartitionSize`` 0.125). A slot is one device a worker can open, so a
    partition is a slot; where ``LogicalGpuCount`` is absent, ``Count`` is used.
    """
    devices = 0
    for gpu in gpu_info.get("Gpus", []):
        logical = gpu.get("LogicalGpuCount")
        devices += int(logical if logical is not None else gpu.get("Count", 0) or 0)
    return devices


def launch_order(launch_time: Any) -> str:
    """A sort key for ``LaunchTime`` that orders by time, not by how the time was written.

    The snapshot builder compares order keys as strings, so the key is the
    Unix time, zero-padded. An instance without a launch time sorts last.
    """
    if isinstance(launch_time, str):
        try:
            launch_time = datetime.fromisoformat(launch_time.replace("Z", "+00:00"))
        except ValueError:
            launch_time = None
    if not isinstance(launch_time, datetime):
        return "~"
    if launch_time.tzinfo is None:
        launch_time = launch_time.replace(tzinfo=timezone.utc)
    return f"{launch_time.timestamp():020.6f}"


def _iso(when: float) -> str:
    return datetime.fromtimestamp(when, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
