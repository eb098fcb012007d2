"""``--checkpoint-interval``/``--checkpoint-keep`` need ``--checkpoint-dir``, and a forgotten ``--checkpoint-dir``
value is warned of (review s63 rvU finding 4; the refusals themselves: test_cli_validation's real CLI cases).

Given alone they were accepted in silence: the job ran with no durable checkpoint while the user believed it
protected. ``--checkpoint-dir python train.py`` took ``python`` as the directory.
"""

from __future__ import annotations

import os

import pytest

from cloud_elastic.cli import forgotten_value, parse_command_line

pytestmark = pytest.mark.timeout(10)

RUN = ["run", "-np", "1", "-H", "localhost"]


def config(*flags: str):
    return parse_command_line([*RUN, *flags, "python", "train.py"])[1]["config"]


def test_the_defaults_hold_when_the_flags_are_not_given_and_the_values_when_they_are() -> None:
    assert (config().checkpoint_interval_s, config().checkpoint_keep, config().checkpoint_dir) == (300.0, 2, None)
    given = config("--checkpoint-dir", "ck", "--checkpoint-interval", "5", "--checkpoint-keep", "3")
    assert (given.checkpoint_interval_s, given.checkpoint_keep, given.checkpoint_dir) == (5.0, 3, "ck")


def test_a_value_that_is_a_program_before_a_script_is_warned_of() -> None:
    line = forgotten_value("--checkpoint-dir", "sh", ("train.py", "--lr", "0.1"))
    assert line == ("--checkpoint-dir 'sh' names a program, and the command left starts with the script 'train.py', "
                    "which is no program: was --checkpoint-dir's value forgotten? (--checkpoint-dir DIR sh "
                    "train.py ...)")


@pytest.mark.parametrize(("value", "command"), [
    ("ckpt", ("python", "train.py")),  # the usual command line
    ("sh", ("torchrun", "train.py")),  # the command is a program
    ("sh", ("{here}/run.sh",)),  # an executable script
    ("/tmp/ck", ("train.py",)),  # a path
    (None, ("train.py",)),
])
def test_real_command_lines_are_not_warned_of(value, command, tmp_path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    assert forgotten_value("--checkpoint-dir", value, tuple(c.format(here=tmp_path) for c in command)) is None


def test_a_directory_of_that_name_here_is_not_warned_of(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    os.mkdir("sh")
    assert forgotten_value("--checkpoint-dir", "sh", ("train.py",)) is None
