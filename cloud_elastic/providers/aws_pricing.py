"""What an AWS group's instances cost, and setting its desired capacity (``--manage-capacity``).

Prices (dollars per instance-hour): a spot instance (``InstanceLifecycle`` ``spot``)
costs the latest ``DescribeSpotPriceHistory`` price of its type in its
availability zone (Linux/UNIX); an on-demand one costs the ``on_demand_price``
the user gave (AWS's price list is not read: the Pricing API lives in two regions
and needs its own permission). Spot prices are cached for ``refresh_s`` per
(type, zone), so a group of any size costs one call per pair and refresh.

The capacity is set with ``SetDesiredCapacity`` (``HonorCooldown=false``: the
driver asks only when the job needs the hosts now, or when it is done with them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from cloud_elastic.errors import CapacityDeniedError, CapacityError

__all__ = ["InstancePrice", "SpotPrices", "set_desired_capacity", "DENIED_CODES"]

_log = logging.getLogger(__name__)

#: Error codes that mean the credentials may not do what was asked.
DENIED_CODES = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "AuthFailure"}


@dataclass(frozen=True)
class InstancePrice:
    """What decides an instance's price: its type, zone and whether it is a spot instance."""

    instance_type: str
    zone: str
    spot: bool

    @classmethod
    def of(cls, instance: Mapping[str, Any]) -> "InstancePrice":
        """From one ``DescribeInstances`` instance."""
        zone = instance.get("Placement", {}).get("AvailabilityZone", "")
        return cls(str(instance.get("InstanceType", "")), str(zone), instance.get("InstanceLifecycle") == "spot")


class SpotPrices:
    """Latest spot prices per (type, zone), cached for ``refresh_s`` (see module docstring)."""

    def __init__(self, clock: Callable[[], float], refresh_s: float = 300.0) -> None:
        self._clock = clock
        self._refresh_s = refresh_s
        self._cache: dict[tuple[str, str], tuple[float, float]] = {}  # (type, zone) -> (price, read at)

    def prices(self, ec2: Any, hosts: Mapping[str, InstancePrice], on_demand: float | None) -> dict[str, float]:
        """Host -> dollars per instance-hour, for the hosts that can be priced."""
        now = self._clock()
        stale = {(p.instance_type, p.zone) for p in hosts.values() if p.spot and p.instance_type and p.zone}
        stale = {k for k in stale if k not in self._cache or now - self._cache[k][1] >= self._refresh_s}
        if stale:
            self._read(ec2, stale, now)
        out: dict[str, float] = {}
        for host, p in hosts.items():
            if not p.spot:
                if on_demand is not None:
                    out[host] = on_demand
            elif (p.instance_type, p.zone) in self._cache:
                out[host] = self._cache[(p.instance_type, p.zone)][0]
        return out

    def _read(self, ec2: Any, wanted: Iterable[tuple[str, str]], now: float) -> None:
        by_zone: dict[str, set[str]] = {}
        for itype, zone in wanted:
            by_zone.setdefault(zone, set()).add(itype)
        for zone, types in sorted(by_zone.items()):
            pages = ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=sorted(types), AvailabilityZone=zone, ProductDescriptions=["Linux/UNIX"],
                StartTime=now_utc(),
            )
            latest: dict[str, tuple[Any, float]] = {}
            for page in pages:
                for item in page.get("SpotPriceHistory", []):
                    itype, stamp = item.get("InstanceType"), item.get("Timestamp")
                    try:
                        price = float(item.get("SpotPrice"))
                    except (TypeError, ValueError):
                        continue
                    if itype in types and (itype not in latest or (stamp or 0) > (latest[itype][0] or 0)):
                        latest[itype] = (stamp, price)
            for itype, (_, price) in latest.items():
                self._cache[(itype, zone)] = (price, now)
            for itype in types - set(latest):
                _log.debug("no spot price for %s in %s", itype, zone)


def now_utc() -> Any:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def set_desired_capacity(autoscaling: Any, errors: Any, group: str, hosts: int, label: str) -> None:
    """``SetDesiredCapacity`` for ``group``; CapacityDeniedError on AccessDenied, CapacityError otherwise.

    A desired capacity outside the group's MinSize..MaxSize is refused by AWS
    (``ValidationError``): a CapacityError that names the bounds to change.
    """
    try:
        autoscaling.set_desired_capacity(AutoScalingGroupName=group, DesiredCapacity=hosts, HonorCooldown=False)
    except errors.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        message = exc.response.get("Error", {}).get("Message", "") or str(exc)
        if code in DENIED_CODES:
            raise CapacityDeniedError(f"{label}: SetDesiredCapacity: {code}: {message}") from exc
        raise CapacityError(f"{label}: SetDesiredCapacity {hosts}: {code}: {message}") from exc
    except errors.BotoCoreError as exc:
        raise CapacityError(f"{label}: SetDesiredCapacity {hosts}: {exc}") from exc
