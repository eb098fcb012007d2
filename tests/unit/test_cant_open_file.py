"""A script's name mistyped: the job's last line says what the interpreter said (review s63 rvU finding 5).

``python ddp_portd.py`` ended the job with "exited with code 2" and no more: Python's own ``can't open file``
line was not read as an error line (driver.job.exit_status's LastErrors), while every ``SomeError:`` line was.
"""

from __future__ import annotations

import pytest

from cloud_elastic.driver.job.exit_status import ExitStatus, LastErrors

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("line", [
    "python: can't open file '/home/u/ddp_portd.py': [Errno 2] No such file or directory",
    "/opt/venv/bin/python3.11: can't open file 'train.py': [Errno 13] Permission denied",
    "train.py: error: argument --lr: invalid float value: 'x'",  # argparse: an option of the script mistyped
    "train.py: error: the following arguments are required: --data",
])
def test_the_interpreters_cant_open_file_line_names_the_exit(line: str) -> None:
    last = LastErrors(lambda: 100.0)
    last.offer("w", line)
    assert last.attach("w", ExitStatus(2))[0].describe == f"exited with code 2 after printing: {line}"


def test_a_line_that_only_mentions_opening_a_file_is_no_error() -> None:
    last = LastErrors(lambda: 100.0)
    last.offer("w", "epoch 3: I can't open file x yet, retrying")
    last.offer("w", "epoch 3: error: 0.25 (validation)")  # a colon-separated word before ': error:' is no program
    assert last.attach("w", ExitStatus(2))[0].describe == "exited with code 2"

