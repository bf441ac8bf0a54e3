"""The suite's own arrangement (tests/conftest.py, pyproject's addopts) does what it says."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Each test writes the worker that ran it; the sleep keeps both workers busy at once, so that a
# scheduler that ignored the group would hand Ray tests to both.
TESTS = '''
import os, time
import pytest

def _ran(name):
    time.sleep(0.3)
    with open(os.environ["RAN_LOG"], "a") as log:
        log.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.ray
@pytest.mark.parametrize("i", range(4))
def test_on_ray(i):
    _ran("ray")

@pytest.mark.parametrize("i", range(4))
def test_plain(i):
    _ran("plain")
'''


def test_the_ray_tests_run_on_one_worker(tmp_path):
    """Two embedded Ray clusters at once would share the two cores and Ray's ports: the suite's
    conftest puts every `ray` test in one xdist group, run with pyproject's own options."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_grouping.py").write_text(TESTS)
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = "\n".join(f"  {marker}" for marker in options["markers"])
    (tmp_path / "pytest.ini").write_text(f"[pytest]\naddopts = {options['addopts']}\n"
                                         f"markers =\n{markers}\n")  # fmt: skip
    log = tmp_path / "ran.log"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path, env={**os.environ, "RAN_LOG": str(log)},
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line.split() for line in log.read_text().splitlines()]
    assert len(ran) == 8
    assert len({worker for name, worker in ran if name == "ray"}) == 1, ran
