"""The ``rlherd`` command starts fast: building its parsers (what ``--help`` does) imports none
of the heavy stacks (torch, Ray, the environment families), yet lists exactly the agents and
runtimes that exist and one flag per runtime setting."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("torch", "ray", "gymnasium", "ale_py", "minari", "grpc")


def _imported_by(code: str) -> list[str]:
    """The heavy modules a fresh interpreter holds after running ``code``."""
    report = f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    probe = f"{code}\nimport json, sys\n{report}"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=ROOT)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_building_the_parsers_imports_no_heavy_stack():
    assert _imported_by("import rlherd.cli; rlherd.cli._parser()") == []


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"]])
def test_help_imports_no_heavy_stack(argv):
    """``--help`` exits from inside argparse, after the whole parser (with every runtime
    setting's flag) was built."""
    code = (
        "import contextlib, io, rlherd.cli\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    rlherd.cli.main({argv!r})"
    )
    assert _imported_by(code) == []


def test_the_torch_free_names_are_the_registries():
    """The CLI's lists of agents and runtimes come from tables that import nothing heavy; they
    must name exactly the builders and runtimes that exist."""
    from rlherd import cli
    from rlherd.agents import AGENTS, BUILDERS
    from rlherd.runtime import RUNTIMES, settings

    assert list(AGENTS) == list(BUILDERS)
    for name, builder_class in BUILDERS.items():
        assert builder_class(builder_class.config_class()).name == name
    for runtime in RUNTIMES.values():  # each declares settings of the common kind
        assert dataclasses.is_dataclass(runtime.settings), runtime.name
        assert issubclass(runtime.settings, settings.Common), runtime.name
    train = cli._parser()._subparsers._group_actions[0].choices["train"]
    choices = {a.dest: a.choices for a in train._actions if a.choices is not None}
    assert list(choices["agent"]) == sorted(BUILDERS)
    assert list(choices["runtime"]) == list(RUNTIMES)


def test_train_help_lists_agents_runtimes_and_setting_flags(capsys):
    from rlherd import cli
    from rlherd.agents import BUILDERS
    from rlherd.runtime import settings

    with pytest.raises(SystemExit) as exit_:
        cli.main(["train", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    first, last = sorted(BUILDERS)[0], sorted(BUILDERS)[-1]
    assert f"{{{first}," in text and f"{last}}}" in text
    assert "{single,mono,poly,distributed,device,offline}" in text
    for name in settings.all_fields():
        assert f"--{name.replace('_', '-')}" in text


@pytest.mark.parametrize(("argv", "said"), [
    (["train", "--agent", "ppo", "--env", "CartPole-v1"], "the agent is train's first argument"),
    (["train", "ppo", "--env", "CartPole-v1", "--total-step", "5"], "--total-step"),
    (["serve-env", "--env", "CartPole-v1"], "--env"),
])  # fmt: skip
def test_flags_are_never_abbreviated(argv, said, capsys):
    """argparse reads a prefix of a flag as the flag: ``train --agent ppo`` set --agent-index
    (and then asked for an agent), ``serve-env --env`` was 'ambiguous'. Each is refused by name."""
    from rlherd import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "unrecognized arguments" in err and said in err, err


@pytest.mark.parametrize(("given", "said"), [
    ("seed=5", "use --seed 5"),  # reached train as the text '5': "got '5'"
    ("total_steps=64", "use --total-steps 64"),  # "total_steps='64': expected int"
    ("num_envs=2", "use --num-envs 2"),
])  # fmt: skip
def test_set_of_a_setting_or_trains_own_option_names_its_flag(given, said, tmp_path, capsys):
    """``--set`` takes agent fields; a runtime setting or one of train's own options given by
    it is one line naming its flag, which parses the value."""
    from rlherd import cli

    code = cli.main(["train", "ppo", "--env", "CartPole-v1", "--set", given, "--run-dir",
                     str(tmp_path / "run")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and said in err, err
    assert not (tmp_path / "run").exists()


def test_ctrl_c_before_a_run_takes_its_signals_is_one_line(monkeypatch, capsys):
    """Ctrl-C in a command's first seconds (while torch imports, before a run's own handler)
    printed a KeyboardInterrupt traceback, and a --seeds group counted the run as failed (its
    status was the signal's, not 130)."""
    from rlherd import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "plot", interrupted)
    try:
        code = cli.main(["plot", "runs/a", "-o", "plot.png"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped rlherd's main as a traceback")
    assert code == 130
    assert capsys.readouterr().err == "rlherd: interrupted\n"
