"""NCCL's collectives finish on the GPU, after their waits return: where that matters, and the abort that ends them.

Gloo's futures complete when the collective has; NCCL's as soon as it is queued
(torch's ``get_future`` on CUDA), so a wait on the training thread returns at
once, and the step's update and commit are queued behind allreduces that may
never finish when a peer is lost. What follows from that, for a round's NCCL
group with peers (a group of one has none to lose; Gloo is unchanged):

* the heartbeat thread aborts the communicator as soon as the driver aborts the
  round (:meth:`OnDeviceMixin.abort_lost_round`): a training thread blocked in the
  GPU (a ``.item()``, a synchronization) behind a kernel waiting on a lost peer is
  released then, where before only NCCL's own timeout (minutes) released it;
* values an abort may have cut short are never acted on: a collective whose result
  is read on the host next is waited for on the host until the GPU has finished it
  (:meth:`OnDeviceMixin._await_on_device`, through ``wait(host=True)``), and before
  an update in place or a commit the GPU's work is confirmed
  (:meth:`OnDeviceMixin.confirm_on_device`); after an abort both fail with
  ``CollectiveError``, and the worker rolls back to the last commit.

The abort sets the group's ``abandoned`` before it aborts, so a wait that returned
with the group not abandoned (nor in error: NCCL's own watchdog aborts without us)
saw its kernels finish whole. Every launch on the group counts itself (it reads the
context's ``pg``), and such a wait records how many it saw finish: a confirmation
after an abort still passes when nothing was launched since (a commit right after
a confirmed update in place, which wrote over the last commit).
"""

from __future__ import annotations

from typing import Any

import torch

from cloud_elastic.worker.exceptions import CollectiveError

__all__ = ["OnDeviceMixin"]


class OnDeviceMixin:
    """The worker context's waits for what NCCL queued on the GPU (see module docstring)."""

    _group: Any  # the current round's ``groups.RoundGroup``, or None
    info: Any

    def _nccl_group(self) -> Any:
        """The current round's group when it is NCCL's with peers (their loss can leave its kernels waiting)."""
        group = self._group
        if group is None or group.backend != "nccl" or self.info is None or self.info.size < 2:
            return None
        return group

    def _await_on_device(self, work: Any, what: str, round_: int, slot: int, group: Any) -> None:
        """Wait on the host until the GPU has finished ``work``. A collective whose peer was lost never finishes:
        the heartbeat thread's abort (:meth:`abort_lost_round`) ends it, and a result the abort may have cut short
        fails here, never reaching the caller."""
        try:
            work.wait()
        except RuntimeError as exc:
            self._failed(exc, what, slot)
        if not self._device_finished(group, what):
            self.flight.completed(slot, ok=False)
            self._abandon_round()
            raise CollectiveError(f"{what} abandoned: the driver aborted round {round_} (a peer was lost)")

    def confirm_on_device(self, what: str) -> None:
        """Before something that cannot be undone (an update in place, a commit): on NCCL, wait until the GPU has
        finished what was queued on it, and fail with CollectiveError when an abort may have cut some of it short.

        The gradients' waits return as NCCL queues them, so a step's update and its commit are queued behind
        allreduces that may never finish; an abort ends them, and the values they leave are not the average.
        What comes here after an abort is therefore rolled back, never committed nor applied in place, unless no
        collective was launched since a wait that saw all of them finish (a commit right after a confirmed
        update in place: refusing it would leave nothing to restore, the update having written over the last
        commit). An abort the driver sent that the group has not met yet cut nothing short either: what
        finished is whole, and the round's next collective fails. A wait for the device costs as long as the
        device's queue takes; a no-op on Gloo and for a group of one.
        """
        group, info = self._nccl_group(), self.info
        if group is None or info is None:
            return
        if not self._device_finished(group, what):
            self._abandon_round()
            raise CollectiveError(f"{what} not confirmed: the driver aborted round {info.round} (a peer was lost) "
                                  "before the GPU finished its collectives")

    def _device_finished(self, group: Any, what: str) -> bool:
        """Wait on the host for the device; whether every collective launched so far finished whole.

        The abort marks the group abandoned before it aborts it, so a wait that returns with the group neither
        abandoned nor in error (NCCL's own watchdog aborts without us) saw its kernels finish whole. An error of the
        device while the group is sound (a device-side assert of the script) is the script's, raised as it is.
        """
        launched = group.queued
        try:
            with self.progress.waiting():
                _synchronize(group.device)  # every stream: NCCL's too, so every collective launched so far
        except RuntimeError:
            if not (group.abandoned or _in_error(group)):
                raise
        if group.abandoned or _in_error(group):
            return group.whole >= launched  # nothing launched since a wait that saw everything finish
        group.whole = launched
        return True

    def abort_lost_round(self) -> None:
        """Heartbeat thread: the driver has aborted the current round, whose group is NCCL's: abort it now.

        The training thread may be blocked in the GPU (a ``.item()``, a synchronization) behind a collective
        whose peer is gone, where no wait of ours can see the abort; only the communicator's abort ends it
        (else NCCL's own timeout, minutes). On a thread of its own, so heartbeats go on; joined by the training
        thread before it waits for the device, and at exit (it runs in torch's C++: see ``exiting``).
        """
        group = self.__dict__.get("_group")
        if group is None or group.backend != "nccl" or group.abandoned or group.round is None or (group.size or 2) < 2:
            return  # a group of one has no peer to wait on: the training thread's next collective abandons it
        if self._aborted(group.round):
            group.abort_in_background()


def _in_error(group: Any) -> bool:
    """Whether NCCL itself reports the group (or its cross-host group) broken: its watchdog aborted it; False where
    torch cannot say."""
    for one in (group, group.cross):
        try:
            error = one.pg._get_backend(one.device).get_error()
        except Exception:  # noqa: BLE001 (no cross group, older torch, a stand-in, a group gone: nothing to go by)
            continue
        if getattr(error, "name", "SUCCESS") != "SUCCESS":
            return True
    return False


def _synchronize(device: torch.device | None) -> None:
    """Wait on the host until ``device`` has finished everything queued on it, on every stream (nothing off a GPU)."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
