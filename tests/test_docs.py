"""The commands the documentation shows run as shown (with a tiny budget), and the guides say what
they say they say.

Every fenced ``bash`` block of README.md and docs/ is either run here or marked, in the line just
before it, with ``<!-- not run: REASON -->`` (a Ray cluster, a GPU, a server that runs until it
is stopped, hours of training). A block is run by bash, in a temporary directory, with ``rlherd``
and ``pip`` on the path as stand-ins: ``rlherd`` is ``rlherd.cli`` with the budget flags cut
down (:func:`tiny_budget`), run in a fork of a process that imported it once (:mod:`docs_server`),
and ``pip install`` checks that the extras it names exist instead of installing them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import docs_server
import pytest

from rlherd.commands.seeds import parse_seeds

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "your-own-environment.md"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
NOT_RUN = re.compile(r"<!--\s*not run:\s*(?P<reason>.*?)\s*-->")
FENCE = re.compile(r"^```(?P<language>\S*)\s*$")

# The flags that set how much work a command does, and the values the tests give them: each
# value's caller gets the smaller of the two, or this one where the command gave none.
TINY = {
    "train": {"--total-steps": 200, "--num-actors": 2, "--envs-per-actor": 2, "--num-envs": 4,
              "--num-servers": 1, "--eval-every": 100, "--eval-episodes": 1},
    "eval": {"--episodes": 1, "--record-episodes": 1},
    "collect": {"--episodes": 2},
    "check-env": {"--seconds": 0.1, "--num-envs": 2, "--steps": 20},
    "package": {"--episodes": 1},
    "report": {"--reps": 100},
    "plot": {"--reps": 20},
    "tune": {"--trials": 2, "--jobs": 2, "--total-steps": 1000, "--eval-every": 500,
             "--eval-episodes": 1},
    "bsuite": {"--total-episodes": 5, "--jobs": 2},
}  # fmt: skip
# (--eval-episodes is added to a train command that evaluates: with --eval-every, a dataset, or
# as the run it resumes did.)
ADDED = {"train": ["--total-steps", "--eval-episodes"], "check-env": ["--seconds"],
         "package": ["--episodes"], "report": ["--reps"], "plot": ["--reps"],
         "tune": ["--total-steps", "--eval-every", "--eval-episodes"],
         "bsuite": ["--total-episodes"]}  # fmt: skip
TINY_SEEDS = 2  # --seeds 1-5 trains its first two seeds
RESUMED_STEPS = 400  # a resumed tiny run trains on to here, so that it resumes something
OFFLINE_STEPS = 50  # learner steps of a run on a dataset (CQL's take 0.1 s each)


def tiny_budget(args: list[str]) -> list[str]:
    """``rlherd ARGS`` as the documentation gives them, with every budget flag of :data:`TINY`
    cut to its tiny value (and the ones of :data:`ADDED` given where the command has none)."""
    command, *rest = args
    tiny = dict(TINY.get(command, {}))
    if "--dataset" in rest:
        tiny["--total-steps"] = OFFLINE_STEPS
    out, seen = [command], set()
    it = iter(rest)
    for arg in it:
        flag, eq, value = arg.partition("=")
        if flag == "--seeds":
            seeds = parse_seeds(value if eq else next(it))[:TINY_SEEDS]
            out += [flag, ",".join(map(str, seeds))]
        elif flag in tiny:
            value = value if eq else next(it)
            limit = RESUMED_STEPS if flag == "--total-steps" and "--resume" in rest else tiny[flag]
            out += [flag, str(min(type(limit)(value), limit))]
            seen.add(flag)
        else:
            out.append(arg)
    evaluates = any(f in rest for f in ("--eval-every", "--dataset", "--resume"))
    for flag in ADDED.get(command, []):
        if flag == "--eval-episodes" and command == "train" and not evaluates:
            continue  # given alone, it would ask for an evaluation the command does not make
        if flag not in seen:
            limit = RESUMED_STEPS if flag == "--total-steps" and "--resume" in rest else tiny[flag]
            out += [flag, str(limit)]
    if command in ("train", "collect", "bsuite") and "--no-progress" not in out:
        out.append("--no-progress")
    return out


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, from 1
    language: str
    text: str
    not_run: str | None  # the reason given in the marker before it, if any

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path, language: str | None = None) -> list[Block]:
    """The fenced blocks of a page (of one language, if given), with the ``not run`` marker of
    the last non-blank line before each."""
    lines = page.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        match = FENCE.match(lines[i].strip())
        if not match or not match["language"]:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.search(before)
        indent = len(lines[i]) - len(lines[i].lstrip())
        text = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        if language in (None, match["language"]):
            found.append(Block(page, i + 1, match["language"], text, marker and marker["reason"]))
        i = end + 1
    return found


def commands(block: Block) -> list[list[str]]:
    """Each command of a block as words (continued lines joined, comments dropped, ``&&``
    chains split), without leading ``NAME=value`` assignments."""
    out = []
    for line in block.text.replace("\\\n", " ").splitlines():
        part: list[str] = []
        for word in [*shlex.split(line, comments=True), "&&"]:
            if word != "&&":
                part.append(word)
                continue
            while part and re.match(r"^[A-Z_]+=", part[0]):
                part = part[1:]
            if part:
                out.append(part)
            part = []
    return out


BASH = [block for page in PAGES for block in blocks(page, "bash")]
RUN = [block for block in BASH if block.not_run is None]


def _unique(run: list[Block]) -> list[Block]:
    """Blocks whose text an earlier block already showed are run once."""
    seen, out = set(), []
    for block in run:
        if block.text not in seen:
            seen.add(block.text)
            out.append(block)
    return out


def test_every_bash_block_is_run_or_says_why_not():
    """A block that is not run says why; a block that is run holds only ``rlherd`` and ``pip
    install`` commands, the ones the stand-ins know."""
    assert len(BASH) > 20, [block.name for block in BASH]
    for block in BASH:
        if block.not_run is not None:
            assert len(block.not_run) > 10, f"{block.name}: say why it is not run"
            continue
        for words in commands(block):
            assert words[0] == "rlherd" or words[:2] == ["pip", "install"], (
                f"{block.name}: {shlex.join(words)} is not an rlherd or pip install command; "
                "mark the block <!-- not run: REASON -->"
            )


def test_tiny_budget_cuts_every_budget_flag():
    """The stand-in's rewriting, on which the speed of the tests below rests."""
    args = ["train", "dqn", "--env", "CartPole-v1", "--total-steps=150000", "--num-actors", "32",
            "--eval-every", "10000"]  # fmt: skip
    assert tiny_budget(args) == ["train", "dqn", "--env", "CartPole-v1", "--total-steps", "200",
                                 "--num-actors", "2", "--eval-every", "100", "--eval-episodes",
                                 "1", "--no-progress"]  # fmt: skip
    assert tiny_budget(["train", "--resume", "runs/x"])[3:5] == ["--total-steps", "400"]
    assert "--eval-episodes" not in tiny_budget(["train", "ppo", "--runtime", "device"])
    assert tiny_budget(["train", "bc", "--dataset", "d"])[4:6] == ["--total-steps", "50"]
    assert tiny_budget(["eval", "runs/x", "--episodes", "200"]) == ["eval", "runs/x",
                                                                    "--episodes", "1"]  # fmt: skip
    assert tiny_budget(["check-env", "tag-continuous", "--steps", "500"])[2:] == [
        "--steps", "20", "--seconds", "0.1"]  # fmt: skip
    assert tiny_budget(["train", "ppo", "--seeds", "1-5"])[2:4] == ["--seeds", "1,2"]
    assert tiny_budget(["report", "runs/a"]) == ["report", "runs/a", "--reps", "100"]
    assert tiny_budget(["tune", "ppo", "--trials", "20", "--jobs", "4"])[2:] == [
        "--trials", "2", "--jobs", "2", "--total-steps", "1000", "--eval-every", "500",
        "--eval-episodes", "1"]  # fmt: skip


PIP = f"""#!{sys.executable}
import re, sys, tomllib
with open({str(ROOT / "pyproject.toml")!r}, "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
assert sys.argv[1] == "install", sys.argv
for arg in sys.argv[2:]:
    named = re.search(r"\\[(.*)\\]", arg)
    for name in named[1].split(",") if named else []:
        if name not in extras:
            sys.exit(f"pip: rlherd has no extra {{name!r}} (it has {{sorted(extras)}})")
"""


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> Iterator[Path]:
    """A folder holding the ``rlherd`` and ``pip`` stand-ins, to put first on ``PATH``; the
    ``rlherd`` one is a client of a fork server (:mod:`docs_server`) that has imported torch and
    rlherd once for all the commands."""
    folder = tmp_path_factory.mktemp("bin")
    path = folder / "server.sock"
    rlherd = docs_server.CLIENT.format(python=sys.executable, path=str(path))
    for name, text in (("rlherd", rlherd), ("pip", PIP)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    with open(folder / "server.log", "w") as log:
        server = subprocess.Popen([sys.executable, str(ROOT / "tests" / "docs_server.py"),
                                   str(path)], stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + 120
            while not path.exists() and server.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert path.exists(), (folder / "server.log").read_text()
            yield folder
        finally:
            with contextlib.suppress(ProcessLookupError):  # the server and any command left
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()


SLOW = re.compile(r"--runtime (mono|poly|device|distributed)\b")


def _param(block: Block):
    """Blocks that start processes, servers or a Ray, or run more than two commands (tens of
    seconds each, on two cores), are ``slow``; those that start a Ray run with the other Ray
    tests, one at a time."""
    slow = SLOW.search(block.text) or len(commands(block)) > 2
    marks = [pytest.mark.slow] if slow else []
    if "--runtime distributed" in block.text:
        marks.append(pytest.mark.ray)
    return pytest.param(block, id=block.name, marks=marks)


@pytest.mark.parametrize("block", [_param(block) for block in _unique(RUN)])
def test_the_documented_commands_run(block, stand_ins, tmp_path):
    """Each block runs to exit 0 in a fresh directory, its commands in order (a run directory
    one command writes is there for the next), with tiny budgets."""
    env = {**os.environ, "PATH": f"{stand_ins}{os.pathsep}{os.environ['PATH']}",
           "MINARI_DATASETS_PATH": str(tmp_path / "datasets")}  # fmt: skip
    script = "set -euxo pipefail\n" + block.text
    out = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, text=True,
                         capture_output=True, timeout=600)  # fmt: skip
    assert out.returncode == 0, f"{block.name}\n{out.stderr[-4000:]}"


def test_the_rlherd_stand_in_exits_as_the_command_does(stand_ins, tmp_path):
    """The blocks are judged by the stand-in's exit status and stderr: a fork server that
    answered 0 whatever the command did would pass every block."""
    env = {**os.environ, "PATH": f"{stand_ins}{os.pathsep}{os.environ['PATH']}"}

    def rlherd(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["rlherd", *args], cwd=tmp_path, env=env, text=True,
                              capture_output=True, timeout=300)  # fmt: skip

    bad_env = rlherd("train", "dqn", "--env", "NoSuchEnv-v0")
    assert bad_env.returncode == 2 and "unknown environment id 'NoSuchEnv-v0'" in bad_env.stderr
    bad_flag = rlherd("train", "--no-such-flag")
    assert bad_flag.returncode == 2 and "unrecognized arguments" in bad_flag.stderr
    ok = rlherd("train", "dqn", "--env", "CartPole-v1", "--run-dir", "run")
    assert ok.returncode == 0, ok.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["actor_steps"] >= 200
    # The client's environment is the command's: PYTHONPATH=. finds a factory beside it.
    (tmp_path / "beside.py").write_text("import gymnasium as gym\nimport rlherd\n\n\n"
                                        "@rlherd.env_factory\ndef make_env():\n"
                                        "    return gym.make('CartPole-v1')\n")  # fmt: skip
    env["PYTHONPATH"] = "."
    beside = rlherd("train", "ppo", "--env", "beside:make_env", "--run-dir", "run-beside")
    assert beside.returncode == 0, beside.stderr


def test_the_pip_stand_in_refuses_an_extra_that_does_not_exist(stand_ins, tmp_path):
    """So the install commands the documentation shows are checked, not waved through."""
    ok = subprocess.run([stand_ins / "pip", "install", "-e", ".[atari,tb]"], capture_output=True)
    bad = subprocess.run([stand_ins / "pip", "install", "-e", ".[atarii]"], capture_output=True)
    assert ok.returncode == 0 and bad.returncode != 0, bad.stderr


def test_ci_runs_the_readmes_test_command():
    """The README's second Quick start command is the one .ci/run installs and tests with."""
    quick = [b for b in blocks(ROOT / "README.md", "bash") if "pytest" in b.text]
    assert len(quick) == 1 and quick[0].not_run, "the README shows one test command, not run here"
    install, test = quick[0].text.strip().split(" && ")
    ci = (ROOT / ".ci" / "run").read_text()
    assert install.removeprefix("pip install ") in ci.replace("pip install --quiet ", "")
    assert re.search(rf"^{re.escape(test)}\b", ci, flags=re.M), f"{test!r} is not in .ci/run"


def test_every_page_is_in_the_sites_navigation():
    """mkdocs builds a page left out of ``nav`` without a word; the site would hide it."""
    nav = set(re.findall(r"([\w./-]+\.md)", (ROOT / "mkdocs.yml").read_text()))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == nav


def test_docs_extra_builds_the_site():
    """``pip install -e ".[docs]"`` brings what ``mkdocs build`` needs, and ``all`` includes it
    (the README's test command installs ``all``, and .ci/run builds the site)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert any(r.startswith("mkdocs-material") for r in extras["docs"])
    assert any(r.startswith("mkdocstrings[python]") for r in extras["docs"])
    assert "docs" in extras["all"][0]
    assert "mkdocs build --strict" in (ROOT / ".ci" / "run").read_text()


def _rlherd(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """``rlherd ARGS`` as the console script runs it: the working directory not on the import
    path unless ``PYTHONPATH`` says so."""
    code = "import sys; from rlherd.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, text=True,
                          capture_output=True, timeout=300, env={**os.environ, **env})  # fmt: skip


def test_the_guides_console_sessions_say_what_they_show(tmp_path):
    """Each ``$ rlherd ...`` line of a console block prints the lines shown after it (up to
    ``...``, which stands for what varies)."""
    for block in blocks(GUIDE, "console"):
        command, *shown = block.text.strip().splitlines()
        args = shlex.split(command.removeprefix("$ "))[1:]
        if args[0] == "check-env":
            args += ["--seconds", "0.1"]
        out = _rlherd(args, tmp_path)
        printed = out.stdout + out.stderr
        for line in shown:
            for part in line.split("..."):
                assert part.strip() in printed, (command, part)


def test_the_guides_factory_runs_from_python_and_the_command_line(tmp_path):
    """``my_envs.py`` and the script that trains with it, as the guide writes them, then the
    command line the guide gives for the same factory."""
    python = [block.text for block in blocks(GUIDE, "python")]
    factory = next(b for b in python if b.startswith("# my_envs.py"))
    script = next(b for b in python if "rlherd.train" in b)
    (tmp_path / "my_envs.py").write_text(factory)
    short = 'env_kwargs={"size": 4}, total_steps=200, progress=False)'
    (tmp_path / "script.py").write_text(script.replace('env_kwargs={"size": 4})', short))
    out = subprocess.run([sys.executable, "script.py"], cwd=tmp_path, text=True,
                         capture_output=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr
    command = "PYTHONPATH=. rlherd train ppo --env my_envs:make_env"
    assert command in GUIDE.read_text()
    args = shlex.split(command)[2:] + ["--total-steps", "200", "--no-progress"]
    out = _rlherd(args, tmp_path, PYTHONPATH=".")
    assert out.returncode == 0, out.stderr
