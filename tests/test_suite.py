"""The suite's own arrangement (tests/conftest.py, pyproject's addopts) does what it says."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each test writes the worker that ran it; the sleep keeps a worker busy long enough that one
# handing out tests a few at a time would give the other worker some.
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
    conftest puts every `ray` test in one xdist group. Run whole, with pyproject's own options,
    since the group has been lost silently twice: marked after xdist had read the groups, and
    dropped from the ids by pytest 9.2."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_grouping.py").write_text(TESTS)
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    markers = "\n".join(f"  {marker}" for marker in options["markers"])
    (tmp_path / "pytest.ini").write_text(f"[pytest]\naddopts = {options['addopts']}\n"
                                         f"markers =\n{markers}\n")  # fmt: skip
    log = tmp_path / "ran.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # pyproject's, alone
    env["RAN_LOG"] = str(log)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
                          cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line.split() for line in log.read_text().splitlines()]
    assert len(ran) == 8
    assert {worker for _, worker in ran} == {"gw0", "gw1"}, ran  # two workers, or nothing shown
    assert len({worker for name, worker in ran if name == "ray"}) == 1, ran
