"""What an AWS group's instances cost, and setting its desired capacity (``--manage-capacity``).

Prices (dollars per instance-hour): a spot instance (``InstanceLifecycle`` ``spot``)
costs the latest ``DescribeSpotPriceHistory`` price of its type in its
availability zone (Linux/UNIX); an on-demand one costs the ``on_demand_price``
the user gave (AWS's price list is not read: the Pricing API lives in two regions
and needs its own permission). Spot prices are cached for ``refresh_s`` per
(type, zone), so a group of any size costs one call per pair and refresh; so is
a pair the history gave no usable price (none, or no number), with one WARNING per pair.

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
        # (type, zone) -> (price, read at); None: the history had no usable price then (not read again before the
        # refresh: a zone without history was read at every discovery).
        self._cache: dict[tuple[str, str], tuple[float | None, float]] = {}
        self._warned: set[tuple[str, str]] = set()  # pairs already said to have no usable price

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
            elif (price := self._cache.get((p.instance_type, p.zone), (None, 0.0))[0]) is not None:
                out[host] = price
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
            odd: dict[str, object] = {}  # type -> a price given that is no number
            for page in pages:
                for item in page.get("SpotPriceHistory", []):
                    itype, stamp = item.get("InstanceType"), item.get("Timestamp")
                    try:
                        price = float(item.get("SpotPrice"))
                    except (TypeError, ValueError):
                        odd.setdefault(itype, item.get("SpotPrice"))
                        continue
                    if itype in types and (itype not in latest or (stamp or 0) > (latest[itype][0] or 0)):
                        latest[itype] = (stamp, price)
            for itype in types:
                self._cache[(itype, zone)] = (latest[itype][1] if itype in latest else None, now)
            for itype in sorted(types - set(latest) - {t for t, z in self._warned if z == zone}):
                self._warned.add((itype, zone))
                given = f"a price that is no number ({odd[itype]!r})" if itype in odd else "no price"
                _log.warning("DescribeSpotPriceHistory gave %s for %s in %s: its spot instances are left out of the "
                             "cost, as of unknown price (read again every %gs); to give the price by hand: "
                             "--source NAME:price=D (dollars per slot-hour)", given, itype, zone, self._refresh_s)


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
