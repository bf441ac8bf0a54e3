"""Agents and runtimes from outside rlherd: a package that declares them as entry points
(``rlherd.agents``, ``rlherd.runtimes``) is trained by the ``rlherd`` command, with no file of
rlherd edited. The package here is written into a temporary folder with its own
``.dist-info`` (what ``pip install`` writes), so Python's entry point machinery finds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from rlherd import registry

ROOT = Path(__file__).resolve().parents[1]

PLUGIN = '''
"""A toy agent and a toy runtime, declared the way any package would declare them."""

from dataclasses import dataclass
from pathlib import Path

from rlherd.agents.impala import ImpalaBuilder
from rlherd.runtime import Runtime
from rlherd.runtime import single
from rlherd.runtime.settings import Single


class ToyBuilder(ImpalaBuilder):
    """IMPALA under another name, with a preset of its own."""

    name = "toyagent"
    presets = {"classic": dict(ImpalaBuilder.presets["toy"], hidden_sizes=(16,))}
    default_total_steps = {"classic": 200}
    runtime_defaults = {}

    @classmethod
    def preset_for(cls, env_id):
        return "classic"


@dataclass
class ToySettings(Single):
    marker: str = ""  # a file the toy runtime writes before it runs

    def check(self):
        super().check()
        if not self.marker:
            from rlherd.errors import ConfigError

            raise ConfigError("the toy runtime needs --marker FILE")


def run(ctx):
    """Say it ran, then run as ``single`` does."""
    Path(ctx.settings.marker).write_text(ctx.builder.name)
    single.run(ctx)


# No actor_network: an agent that needs one (MCTS) is refused here, and no agent says so.
RUNTIME = Runtime("toyrt", __name__, ToySettings,
                  frozenset({"rollout", "replay", "acting", "gym_envs"}))
'''

ENTRY_POINTS = """
[rlherd.agents]
toyagent = toyplugin:ToyBuilder

[rlherd.runtimes]
toyrt = toyplugin:RUNTIME
"""


@pytest.fixture
def plugin(tmp_path: Path) -> dict[str, str]:
    """An environment in which the toy package is installed."""
    site = tmp_path / "site"
    (site / "toyplugin-0.1.dist-info").mkdir(parents=True)
    (site / "toyplugin.py").write_text(textwrap.dedent(PLUGIN))
    info = site / "toyplugin-0.1.dist-info"
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toyplugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path)


def _rlherd(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlherd.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_an_outside_agent_trains_on_an_outside_runtime(plugin, tmp_path):
    marker = tmp_path / "ran"
    out = _rlherd(["train", "toyagent", "--env", "CartPole-v1", "--runtime", "toyrt",
                   "--marker", str(marker), "--total-steps", "200", "--run-dir", "run",
                   "--no-progress"], plugin, tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert marker.read_text() == "toyagent"  # the toy runtime ran the toy agent's builder
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["agent"], config["runtime"]) == ("toyagent", "toyrt")
    assert config["settings"]["marker"] == str(marker)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["actor_steps"] >= 200
    # The run is evaluated and resumed by its names, as any other.
    out = _rlherd(["eval", "run", "--episodes", "1"], plugin, tmp_path)
    assert out.returncode == 0, out.stderr


def test_outside_names_and_settings_reach_the_command_line(plugin, tmp_path):
    out = _rlherd(["train", "--help"], plugin, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "toyagent" in out.stdout and "toyrt" in out.stdout
    assert "--marker TEXT" in out.stdout and "a file the toy runtime writes" in out.stdout
    # Its settings check themselves.
    out = _rlherd(["train", "toyagent", "--env", "CartPole-v1", "--runtime", "toyrt"], plugin,
                  tmp_path)  # fmt: skip
    assert out.returncode != 0 and "the toy runtime needs --marker FILE" in out.stderr


def test_an_outside_runtime_runs_only_the_agents_whose_needs_it_provides(plugin, tmp_path):
    """MCTS needs actors holding their own network; the toy runtime does not say it has them,
    and neither MCTS nor the toy runtime names the other."""
    out = _rlherd(["train", "mcts", "--env", "CartPole-v1", "--runtime", "toyrt", "--marker", "m"],
                  plugin, tmp_path)  # fmt: skip
    assert out.returncode != 0
    assert "mcts does not run on the toyrt runtime" in out.stderr
    assert "it runs on: single, mono, distributed" in out.stderr
    out = _rlherd(["train", "dqn", "--env", "CartPole-v1", "--runtime", "toyrt", "--marker",
                   str(tmp_path / "m"), "--total-steps", "300", "--run-dir", "dqn",
                   "--no-progress"], plugin, tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_a_package_cannot_replace_rlherds_own_names(tmp_path, monkeypatch):
    site = tmp_path / "site"
    info = site / "evil-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[rlherd.agents]\ndqn = evil:Builder\n")
    monkeypatch.syspath_prepend(str(site))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = registry.table(registry.AGENT_GROUP, {"dqn": "rlherd.agents.dqn:DQNBuilder"})
    assert table == {"dqn": "rlherd.agents.dqn:DQNBuilder"}
    assert any("evil:Builder" in str(w.message) for w in caught)


def test_a_broken_package_is_left_out_with_a_warning_and_breaks_nothing(tmp_path):
    site = tmp_path / "site"
    info = site / "broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[rlherd.runtimes]\nmissing = no_such_module:RUNTIME\nwrong = json:dumps\n\n"
        "[rlherd.agents]\nnotabuilder = json:JSONDecoder\n"
    )
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path)
    out = _rlherd(["train", "--help"], env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert "no_such_module:RUNTIME (entry point 'missing') is left out: ModuleNotFoundError" in (
        out.stderr)  # fmt: skip
    assert "json:dumps (entry point 'wrong') is left out: it is a function" in out.stderr
    out = _rlherd(["train", "dqn", "--env", "CartPole-v1", "--total-steps", "100", "--run-dir",
                   "run", "--no-progress"], env, tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "json:JSONDecoder (entry point 'notabuilder') is left out: it is not a subclass" in (
        out.stderr)  # fmt: skip


def test_eval_does_not_import_the_runtime_of_a_run_that_played_gymnasium_environments(tmp_path):
    """A run trained on a Ray cluster is evaluated on a machine without Ray (the distributed
    runtime's module imports it): only a runtime with environments of its own evaluates."""
    import rlherd

    run = rlherd.train("dqn", "CartPole-v1", total_steps=100, run_dir=tmp_path / "run",
                       progress=False)  # fmt: skip
    config = json.loads((run.path / "config.json").read_text())
    config.update(runtime="distributed", settings={})  # as a Ray run records itself
    (run.path / "config.json").write_text(json.dumps(config))
    code = ("import sys; sys.modules['ray'] = None\n"
            "from rlherd.commands.evaluate import evaluate\n"
            f"print(evaluate({str(run.path)!r}, episodes=1)['eval_episodes'])")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=tmp_path, timeout=300)  # fmt: skip
    assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr
