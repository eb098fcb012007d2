"""A worker's end line names the error it printed only when that line says why it ended (driver.job.exit_status's
LastErrors, the one record that driver/runtime/processes.py keeps of each worker's last line).

Review rv6 d8: a handled error logged at step 3 ("ValueError: sample 1234 is corrupt; skipped") was attached to an
outside SIGKILL at step 30 ("killed by signal 9 after printing: ValueError: ..."). d10: a worker that never reached
the driver was named "killed by signal 6 after printing: ValueError: bad value in config.yaml, using the default:
cannot reach the driver at ...", two records joined. Now a line counts only when printed in the last
LAST_ERROR_WINDOW_S before the exit, only for a crash signal or a non-zero exit with no report, and cloud-elastic's
own final line wins over any other.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.exit_status import (ERROR_SCAN_CHARS, LAST_ERROR_WINDOW_S, MAX_LAST_ERROR, ExitStatus,
                                                  LastErrors, reported_error_line)
from cloud_elastic.protocol_reports import MAX_ERROR_LINE
from tests.unit.test_job import Sim
from tests.unit.test_unreachable_driver import LINE, launched

pytestmark = pytest.mark.timeout(30)

HANDLED = "ValueError: sample 1234 is corrupt; skipped"


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_printed_long_before_the_exit_is_not_attached() -> None:
    clock = _Clock()
    last = LastErrors(clock)
    last.offer("w", HANDLED)
    clock.now += LAST_ERROR_WINDOW_S + 20  # trained on past it
    assert last.attach("w", ExitStatus(-6))[0].describe == "killed by signal 6"


@pytest.mark.parametrize("code", [-9, -15])
def test_a_kill_from_outside_is_never_named_with_a_line(code: int) -> None:
    """rv6 d8: the OOM killer's SIGKILL is not the script's error, whatever it printed."""
    last = LastErrors(_Clock())
    last.offer("w", HANDLED)
    assert last.attach("w", ExitStatus(code))[0].describe == f"killed by signal {-code}"


@pytest.mark.parametrize("code", [-6, -11, -7, -8, -4])
def test_a_crash_is_named_with_the_error_line_printed_just_before(code: int) -> None:
    clock = _Clock()
    last = LastErrors(clock)
    last.offer("w", "terminate called after throwing an instance of 'gloo::EnforceNotMet'")
    clock.now += 1
    status, said = last.attach("w", ExitStatus(code))
    assert status.describe == f"killed by signal {-code} after printing: terminate called after throwing an " \
                              "instance of 'gloo::EnforceNotMet'" and said == ""


@pytest.mark.parametrize("code", [128 + 9, 128 + 15])
def test_a_kill_from_outside_under_a_shell_wrapper_is_never_named_with_a_line(code: int) -> None:
    """rvA s4: ``bash run.sh`` whose python was SIGKILLed 0.1 s after a handled error exits 137; it was named
    "exited with code 137 after printing: ValueError: ...", the error a bare script's -9 never is."""
    last = LastErrors(_Clock())
    last.offer("w", HANDLED)
    assert last.attach("w", ExitStatus(code))[0].describe == f"exited with code {code}"


@pytest.mark.parametrize("code", [128 + 6, 128 + 11])
def test_a_crash_under_a_shell_wrapper_is_named_like_a_crash(code: int) -> None:
    """A wrapper's 128 + SIGABRT is the crash a bare -6 is: named with its line even if the worker reported."""
    last = LastErrors(_Clock())
    last.offer("w", "terminate called after throwing an instance of 'gloo::EnforceNotMet'")
    assert last.attach("w", ExitStatus(code), reported=True)[0].last_error.startswith("terminate called")


def test_the_line_and_the_repeat_count_read_a_death_signal_by_one_rule() -> None:
    """exit_status.LastErrors and repeats.own_failure agree on every code: a line is attached to an unreported
    exit exactly when it counts as the script's own failure."""
    from cloud_elastic.driver.job.repeats import own_failure

    for code in [*range(-16, 0), *range(1, 256)]:
        last = LastErrors(_Clock())
        last.offer("w", HANDLED)
        attached = bool(last.attach("w", ExitStatus(code))[0].last_error)
        assert attached == own_failure("", code, False), code


def test_a_non_zero_exit_is_named_with_the_line_only_when_the_worker_reported_no_error() -> None:
    last = LastErrors(_Clock())
    last.offer("w", "RuntimeError: CUDA driver initialization failed")
    assert last.attach("w", ExitStatus(3))[0].describe == \
        "exited with code 3 after printing: RuntimeError: CUDA driver initialization failed"
    last.offer("w", "RuntimeError: CUDA driver initialization failed")
    assert last.attach("w", ExitStatus(1), reported=True)[0].describe == "exited with code 1"  # its report names it
    last.offer("w", "RuntimeError: x")
    assert last.attach("w", ExitStatus(0))[0].describe == "exited with code 0"


def _taken(line: str) -> str:
    last = LastErrors(_Clock())
    last.offer("w", line)
    return last.attach("w", ExitStatus(-6))[0].last_error


def test_only_a_lines_first_characters_are_read_for_an_error() -> None:
    """rvA s3: the pattern, run on every output line, backtracked quadratically on a long line of ``Error.``
    tokens without a colon (64 KB: 1.5 s with the driver's GIL held). Now it reads a bounded head only: what
    makes a line an error must lie within ERROR_SCAN_CHARS, however long the line."""
    assert _taken("ValueError: x" + "y" * 100_000) == ("ValueError: x" + "y" * 100_000)[:300]
    dotted = "a." * 90 + "ValueError" + " (detail)" * 10 + ": x"  # a long qualified name, a colon further on
    assert _taken(dotted) == dotted[:300]
    assert _taken("Error." * 11_000) == ""  # the review's hostile line
    assert _taken("Error." * (ERROR_SCAN_CHARS // 6 + 1) + ": x") == ""  # its colon past the head: not read
    assert _taken(" " * ERROR_SCAN_CHARS + "ValueError: x") == ""
    assert _taken(" " * (ERROR_SCAN_CHARS - 20) + "ValueError: x") == "ValueError: x"


def _end_line(code: int) -> str:
    """rv6 d10: a handled error, then the worker's own unreachable line, then the exit ``code``: the job's end."""
    sim = Sim(1)
    sim.discover({"a": 1})
    procs, launcher = launched(sim)
    (wid, proc), = launcher.procs.items()
    proc.say("ValueError: bad value in config.yaml, using the default")
    proc.say(f"cloud-elastic: worker {wid}: {LINE}")
    proc.say("RuntimeError: printed by another thread as the worker exits")
    proc.code = code
    procs.reap()
    sim._collect()
    assert sim.outcome is not None
    return sim.outcome.reason


@pytest.mark.parametrize("code", [1, -6, -9])
def test_the_workers_own_unreachable_line_wins_over_other_lines(code: int) -> None:
    reason = _end_line(code)
    described = f"exited with code {code}" if code > 0 else f"killed by signal {-code}"
    assert reason.endswith(f"(not yet ranked) {described}: {LINE}"), reason
    assert "ValueError" not in reason and "RuntimeError" not in reason


#: torch 2.13's line for ``init_process_group()`` (``env://``) without torchrun's variables.
TORCH_ENV_LINE = ("ValueError: Error initializing torch.distributed using env:// rendezvous: environment variable RANK "
                  "expected, but not set")
HINT = " (a torchrun script? cloud-elastic sets no RANK or WORLD_SIZE: port it to cloud_elastic.torch, docs/torchrun.md)"


@pytest.mark.parametrize("line", [TORCH_ENV_LINE, "KeyError: 'LOCAL_RANK'", "KeyError: 'WORLD_SIZE'"])
def test_a_torchrun_scripts_last_line_says_what_to_change(line: str) -> None:
    """Review s63 rvU finding 6: an unported torchrun script ended the job with torch's line alone (``RANK expected,
    but not set``), which names the symptom, not the change: it now names the port and its page, within the bound."""
    last = LastErrors(_Clock())
    last.offer("w", "  " + line)
    described = last.attach("w", ExitStatus(1))[0].describe
    assert described == f"exited with code 1 after printing: {line}{HINT}"
    assert len(line + HINT) <= MAX_LAST_ERROR


@pytest.mark.parametrize("line", ["KeyError: 'RANKING'", "KeyError: 'lr'", "ValueError: RANK expected"])
def test_other_errors_get_no_torchrun_hint(line: str) -> None:
    last = LastErrors(_Clock())
    last.offer("w", line)
    assert last.attach("w", ExitStatus(1))[0].last_error == line


def test_a_half_ported_scripts_reported_error_gets_the_hint_within_the_bound() -> None:
    """fixL: a script that reached the driver (``hvd.init()``) reports what it raised in its exit report, which the
    end line shows instead of its output's last line: the hint goes there too, within the report's bound."""
    assert reported_error_line(f"{TORCH_ENV_LINE}\nmore") == TORCH_ENV_LINE + HINT
    assert reported_error_line("KeyError: 'LOCAL_RANK'") == "KeyError: 'LOCAL_RANK'" + HINT
    long = reported_error_line(TORCH_ENV_LINE + " and so on" * 100)
    assert len(long) <= MAX_ERROR_LINE and long.endswith("…" + HINT) and long.startswith(TORCH_ENV_LINE)
    assert reported_error_line("KeyError: 'lr'") == "KeyError: 'lr'"


#: torch's line for a call on the default group (``dist.all_reduce``, ``dist.get_rank()``, DDP) that none formed.
DEFAULT_GROUP_LINE = ("ValueError: Default process group has not been initialized, please make sure to call "
                      "init_process_group.")
DEFAULT_GROUP_HINT = (" (a torch.distributed script? a job has no default process group: use hvd.allreduce, "
                      "hvd.DistributedOptimizer and hvd.rank() instead of dist.*, DDP or DistributedSampler, "
                      "docs/torchrun.md)")


@pytest.mark.parametrize("line", [DEFAULT_GROUP_LINE,
                                  "RuntimeError: Default process group has not been initialized, please make sure to "
                                  "call init_process_group."])
def test_a_script_using_the_default_group_says_what_to_change_in_its_output_and_in_its_report(line: str) -> None:
    """fixL left alone: a script that calls ``dist.all_reduce`` (or wraps DDP) without a default group ended the job
    with torch's line alone; its printed line (an unported script) and its exit report (one that called
    ``hvd.init()``) now carry the pointer to docs/torchrun.md, within their bounds."""
    last = LastErrors(_Clock())
    last.offer("w", line)
    assert last.attach("w", ExitStatus(1))[0].last_error == line + DEFAULT_GROUP_HINT
    assert len(line + DEFAULT_GROUP_HINT) <= MAX_LAST_ERROR
    assert reported_error_line(line) == line + DEFAULT_GROUP_HINT
    assert reported_error_line("ValueError: Default process group is fine") == "ValueError: Default process group is fine"
