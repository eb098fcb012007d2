"""``probe.py`` with the worker library's INFO lines shown (a sync's heal from peers says what moved)."""

from __future__ import annotations

import logging
import runpy
from pathlib import Path

logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
runpy.run_path(str(Path(__file__).with_name("probe.py")), run_name="__main__")
