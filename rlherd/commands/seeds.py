"""``rlherd train --seeds 1-5``: one experiment trained with several seeds, as parallel processes.

Each seed is an ordinary ``rlherd train`` process with ``--seed K --run-dir PARENT/seed-K``,
so each writes a normal run directory (``eval``, ``plot``, ``--resume`` and ``report`` read it
as any other) and a crash, a divergence or a Ctrl-C of one seed is that seed's alone. Processes
rather than threads or one process: a run's torch threads, signal handling, RNGs and run-directory
lock are per process, and a seed run alone must be the same run as the seed run in a group.

At most as many seeds run at once as the cores hold (each seed gets ``--torch-threads`` of
them, 1 unless given), or ``--jobs``. The group shows one progress bar; Ctrl-C or SIGTERM goes to
every running seed, which stops at its next safe point with a checkpoint, as a single run does.
A seed that fails is reported with the last line it printed, its whole output is kept beside it
(``PARENT/seed-K.log``), and the command exits non-zero.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlherd.config import check_seed
from rlherd.errors import ConfigError, exit_status

SEED_DIR = re.compile(r"seed-(-?\d+)")
POLL_S = 1.0  # how often the group reads its seeds' summaries and exits


def parse_seeds(text: str) -> list[int]:
    """``"1-5"`` -> ``[1, 2, 3, 4, 5]``; ``"1,2,7"`` and mixed ``"1-3,10"`` too. Each seed once."""
    seeds: list[int] = []
    for part in text.replace(" ", "").split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not match or (match[2] is not None and int(match[2]) < int(match[1])):
            raise ConfigError(f"--seeds {text!r}: give seeds as 1-5, 1,2,3 or 1-3,10 (each range "
                              "low-high, seeds >= 0)")  # fmt: skip
        first, last = int(match[1]), int(match[2] or match[1])
        check_seed(last, f"--seeds {text!r}: each seed")
        seeds += range(first, last + 1)
    repeated = sorted(s for s, n in collections.Counter(seeds).items() if n > 1)
    if repeated:
        raise ConfigError(f"--seeds {text!r} names seed {repeated[0]} twice; give each seed once")
    return seeds


@dataclass
class SeedProcess:
    """One seed's ``rlherd train`` process and where it writes."""

    seed: int
    path: Path  # its run directory
    argv: list[str]  # the arguments of its ``rlherd train``
    process: subprocess.Popen | None = None
    log_file: Any = None  # open while it runs
    returncode: int | None = None  # None while it has not ended (or never started)

    @property
    def log(self) -> Path:
        """Its stdout and stderr, kept when it fails."""
        return self.path.with_name(f"{self.path.name}.log")

    def last_line(self) -> str:
        """What a failed process said last, or, killed by a signal before it could say anything,
        which signal (SIGKILL, unasked, is most often the kernel's out-of-memory killer)."""
        lines = [line for line in self.log.read_text(errors="replace").splitlines() if line]
        return lines[-1] if lines else f"no output; {exit_status(self.returncode)}"


@dataclass
class SeedRuns:
    """The seeds of one experiment, trained in ``path``: the :class:`~rlherd.commands.train.Run`
    of each seed that finished (or was stopped with a checkpoint), what the failed ones printed
    last, and the seeds that never started (stopped before their turn)."""

    path: Path
    runs: list[Any] = field(default_factory=list)  # rlherd.commands.train.Run, by seed
    failed: dict[int, str] = field(default_factory=dict)  # seed -> its output's last line
    not_started: list[int] = field(default_factory=list)
    signal: int = 0  # SIGINT or SIGTERM that stopped the group, 0 if none

    @property
    def stopped(self) -> bool:
        return self.signal != 0


def train_seeds(
    agent: str | None = None,
    env: Any = None,
    *,
    seeds: Iterable[int] | str,
    run_dir: str | Path | None = None,
    jobs: int | None = None,
    progress: bool = True,
    **train_kwargs: Any,
) -> SeedRuns:
    """Train ``agent`` on ``env`` once per seed, in parallel processes, each run in
    ``run_dir/seed-K`` (``run_dir`` defaults to ``runs/<agent>-<env>-<time>/``).

    ``train_kwargs`` are :func:`rlherd.train`'s (``runtime``, ``total_steps``, ``preset``,
    ``eval_every``, ``env_kwargs``, ``overwrite``, agent fields and runtime settings), given to
    every seed alike. ``seeds`` is a list or a text such as ``"1-5"``. A seed that fails does
    not stop the others; :attr:`SeedRuns.failed` says what each failed one printed last.
    """
    from rlherd import envs as rl_envs

    for name in ("seed", "resume"):
        if name in train_kwargs:
            raise ConfigError(f"train_seeds takes seeds=[...], one run per seed, and starts new "
                              f"runs; drop {name}=")  # fmt: skip
    if train_kwargs.get("callbacks"):
        raise ConfigError("each seed trains in a process of its own, where objects of this one "
                          "cannot go: drop callbacks= (track= works), or call rlherd.train per "
                          "seed")  # fmt: skip
    # A list is checked as its text would be: each seed once, each one numpy can take.
    seeds = parse_seeds(seeds if isinstance(seeds, str) else ",".join(map(str, seeds)))
    agent, env = agent or "impala", rl_envs.resolve(env or "CartPole-v1")
    return run_seeds(agent, env, train_argv(agent, env, train_kwargs), seeds, run_dir, jobs,
                     progress)  # fmt: skip


def train_argv(agent: str, env: str, kwargs: dict[str, Any]) -> list[str]:
    """The ``rlherd train`` arguments that :func:`rlherd.train` ``(agent, env, **kwargs)`` is:
    named arguments and runtime settings as their flags, agent fields as ``--set``."""
    from rlherd.runtime import settings

    def text(value: Any) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, dict):
            return json.dumps(value)
        if isinstance(value, list | tuple):
            return ",".join(map(str, value))
        return str(value)

    flags = {"runtime", "total_steps", "preset", "eval_every", "eval_episodes", "track",
             "track_project", "track_uri", *settings.all_fields()}  # fmt: skip
    argv = [agent, "--env", env]
    for key, value in kwargs.items():
        if value is None or key == "callbacks":
            continue
        if key == "overwrite":
            argv += ["--overwrite"] if value else []
        elif key == "env_kwargs":
            argv += ["--env-kwargs", json.dumps(value)]
        elif key in flags:
            argv += [f"--{key.replace('_', '-')}", text(value)]
        else:
            argv += ["--set", f"{key}={text(value)}"]
    return argv


def run_seeds(
    agent: str,
    env: str,
    argv: list[str],
    seeds: list[int],
    run_dir: str | Path | None,
    jobs: int | None,
    progress: bool,
) -> SeedRuns:
    """Run ``rlherd train ARGV --seed K --run-dir PARENT/seed-K`` for each of ``seeds``
    (``argv`` trains ``agent`` on ``env``; they name the default parent)."""
    if not seeds:
        raise ConfigError("--seeds names no seed; give e.g. --seeds 1-5")
    parent = _new_parent(run_dir, agent, env)
    held = [k for k in seeds if (parent / f"seed-{k}" / "config.json").exists()]
    if held and "--overwrite" not in argv:  # each would fail alone, the group reading 100%
        raise ConfigError(f"{parent} already holds the runs of {_which(held)}: continue them "
                          f"with `rlherd train --resume {parent}`, or add --overwrite to train "
                          "them again")  # fmt: skip
    group = [SeedProcess(k, parent / f"seed-{k}", [*argv, "--seed", str(k), "--run-dir",
                                                   str(parent / f"seed-{k}")])
             for k in seeds]  # fmt: skip
    return run_group(parent, group, _threads(argv), jobs, progress, f"{agent} {env}")


def resume_seeds(parent: str | Path, argv: list[str], jobs: int | None, progress: bool) -> SeedRuns:
    """Continue every seed run in ``parent`` (``rlherd train --resume PARENT``), each with
    ``rlherd train --resume PARENT/seed-K ARGV`` (``argv``: the flags a resumed run takes, such
    as ``--total-steps``)."""
    from rlherd.run.rundir import read_json

    parent = Path(parent)
    paths = seed_dirs(parent)
    group = [SeedProcess(k, path, ["--resume", str(path), *argv]) for k, path in paths.items()]
    threads = max(int(read_json(path / "config.json").get("settings", {}).get("torch_threads", 1))
                  for path in paths.values())  # fmt: skip
    return run_group(parent, group, threads, jobs, progress, f"resume {parent}")


def seed_dirs(parent: Path) -> dict[int, Path]:
    """The seed runs of ``parent`` (``seed-K/`` holding a run), by seed; none if it has none."""
    found = {}
    for path in parent.glob("seed-*"):
        match = SEED_DIR.fullmatch(path.name)
        if match and (path / "config.json").exists():
            found[int(match[1])] = path
    return dict(sorted(found.items()))


def is_seed_parent(path: str | Path | None) -> bool:
    """Whether ``path`` holds seed runs (and is not itself a run)."""
    return path is not None and not (Path(path) / "config.json").exists() and bool(
        seed_dirs(Path(path)))  # fmt: skip


def _new_parent(run_dir: str | Path | None, agent: str, env: str) -> Path:
    """The folder of the seed runs: ``run_dir``, or a new ``runs/<agent>-<env>-<time>/`` that no
    other run has taken (``mkdir`` decides atomically, as for a single run)."""
    from rlherd.commands.train import fresh_run_dir
    from rlherd.run.rundir import check_given, make_folder

    check_given(run_dir, "--run-dir")
    if run_dir is not None:
        path = Path(run_dir)
        if (path / "config.json").exists():
            raise ConfigError(f"{path} holds a single run; give --seeds a new --run-dir, which "
                              "will hold one run per seed")  # fmt: skip
        return make_folder(path, "--run-dir")
    return fresh_run_dir(agent, env)


def _threads(argv: list[str]) -> int:
    """The torch threads each seed is given (``--torch-threads``, else the setting's 1)."""
    value = 1
    for i, arg in enumerate(argv):
        if arg == "--torch-threads" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--torch-threads="):
            value = arg.partition("=")[2]
    try:
        return max(1, int(value))
    except ValueError:
        raise ConfigError(f"--torch-threads {value!r}: give a whole number") from None


def _cores() -> int:
    """The cores this process may run on (a container's or taskset's share, not the machine's)."""
    with contextlib.suppress(AttributeError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def run_group(parent: Path, group: list[SeedProcess], threads: int, jobs: int | None,
              progress: bool, label: str, unit: str = "seeds",
              on_end: Callable[[SeedProcess], None] | None = None) -> SeedRuns:  # fmt: skip
    """Start the runs of ``group`` (seeds, or a bsuite sweep's ids: ``unit``), at most
    ``jobs`` at once (default: as many as fit the cores at ``threads`` torch threads each), wait
    for them and gather their runs. ``on_end`` is called with each run as its process ends, while
    the others go on (a sweep frees what a finished id no longer needs as it goes)."""
    if jobs is not None and jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {jobs}")
    jobs = min(len(group), jobs or max(1, _cores() // threads))
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", str(threads))  # numpy's BLAS too keeps to its share
    waiting, running = list(group), []
    with _Signals() as signals, _GroupProgress(label, group, progress, unit) as bar:
        try:
            while running or (waiting and not signals.received):
                while waiting and len(running) < jobs and not signals.received:
                    running.append(_start(waiting.pop(0), env))
                signals.forward([seed.process for seed in running])
                for seed in [s for s in running if s.process.poll() is not None]:
                    seed.returncode = seed.process.returncode
                    seed.log_file.close()
                    running.remove(seed)
                    if on_end is not None:
                        on_end(seed)
                bar.update()
                if running:
                    wait_for_an_end([seed.process for seed in running], POLL_S)
        finally:
            _end([seed.process for seed in running])  # only after an error of the group's own
    return _gathered(parent, group, signals.received[0] if signals.received else 0)


def wait_for_an_end(processes: list[subprocess.Popen], timeout: float) -> bool:
    """Wait until one of ``processes`` ends (True) or ``timeout`` passes (False). The group then
    starts the next seed, or returns, as soon as one ends rather than at its next look: a bsuite
    sweep runs hundreds of short ids. Where Linux gives no pidfds (before 5.3) it waits out
    ``timeout``."""
    fds: list[int] = []
    try:
        for process in processes:
            fds.append(os.pidfd_open(process.pid))
    except (AttributeError, OSError):  # no pidfds here, or a process already reaped
        time.sleep(timeout)
        return False
    else:
        return bool(select.select(fds, [], [], timeout)[0])
    finally:
        for fd in fds:
            os.close(fd)


def _start(seed: SeedProcess, env: dict[str, str]) -> SeedProcess:
    """Start one seed's ``python -m rlherd.cli train``, in a process group of its own: a Ctrl-C
    at the terminal reaches the group alone, which forwards it once (a second one, typed by the
    user, is forwarded too: each seed then stops at once, as a single run does). It stays in
    the group's session: Linux's autogroup scheduler shares the CPU between sessions first, so a
    seed in a session of its own would take a whole session's share, whatever its niceness."""
    seed.path.parent.mkdir(parents=True, exist_ok=True)
    seed.log_file = open(seed.log, "w")
    # -P: the working directory is not on the seed's import path, as for the rlherd command.
    seed.process = subprocess.Popen(
        [sys.executable, "-P", "-m", "rlherd.cli", "train", *seed.argv, "--no-progress"],
        stdout=seed.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env={**env, GROUP_VARIABLE: str(os.getpid())}, process_group=0,
    )  # fmt: skip
    return seed


GROUP_VARIABLE = "RLHERD_SEED_GROUP"  # in a seed's environment: the group process's id


def stop_with_group() -> None:
    """In a seed's process (``$RLHERD_SEED_GROUP`` set): be sent SIGTERM when the group that
    started it dies, however it dies (Linux's ``PR_SET_PDEATHSIG``; a SIGKILL or an OOM kill of
    the group runs none of its own handlers), so that no seed trains on unseen."""
    group = int(os.environ.pop(GROUP_VARIABLE))
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the group's own handlers are all there is
        return
    if os.getppid() != group:  # the group died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


class _Signals:
    """While the group runs, SIGINT, SIGTERM and SIGHUP are noted (not raised) for the group's
    loop to forward to every running seed, each signal once: the handler only notes, so a
    signal that lands while a seed is being started still reaches it."""

    def __init__(self) -> None:
        self.received: list[int] = []  # every signal, in order
        self._forwarded = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _note(self, signum: int, frame: Any) -> None:
        # A closed terminal's SIGHUP would kill a seed outright: the seeds hear SIGTERM, on which
        # each writes a final checkpoint.
        self.received.append(signal.SIGTERM if signum == signal.SIGHUP else signum)

    def forward(self, processes: list[subprocess.Popen]) -> None:
        """Send the signals received since the last call to ``processes``."""
        for signum in self.received[self._forwarded:]:
            for process in processes:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)
        self._forwarded = len(self.received)


def _end(processes: list[subprocess.Popen]) -> None:
    """Stop ``processes`` (SIGTERM: each writes a final checkpoint), then kill any that have not
    ended within 30 s: no seed outlives the group."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class _GroupProgress:
    """One progress bar for the group: the share of all seeds' steps done (from each seed's
    summary.json, rewritten as it runs), how many seeds are done, and their mean return."""

    def __init__(self, label: str, group: list[SeedProcess], show: bool, unit: str = "seeds"):
        self.group, self.progress = group, None
        if show:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                     TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                                     TextColumn("{task.fields[info]}"))  # fmt: skip
            self.task = self.progress.add_task(f"{label}, {len(group)} {unit}", total=len(group),
                                               info="")  # fmt: skip

    def __enter__(self) -> _GroupProgress:
        if self.progress is not None:
            self.progress.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.progress is not None:
            self.update()
            self.progress.stop()

    def update(self) -> None:
        if self.progress is None:
            return
        from rlherd.runtime import RUNTIMES

        done, returns = 0.0, []
        for seed in self.group:
            summary = _summary(seed.path)
            if summary.get("total_episodes"):  # episodes end the run (a bsuite id's)
                done += min(1.0, summary.get("episodes", 0) / summary["total_episodes"])
            elif summary.get("runtime") in RUNTIMES and summary.get("total_steps"):
                counted = summary.get(RUNTIMES[summary["runtime"]].counts, 0)
                done += min(1.0, counted / summary["total_steps"])
            if summary.get("final_return_mean") is not None:
                returns.append(summary["final_return_mean"])
        ended = [s for s in self.group if s.returncode is not None]
        failed = sum(s.returncode not in (0, 130, 143) for s in ended)
        info = f"{len(ended)}/{len(self.group)} ended"
        info += f", {failed} failed" if failed else ""
        info += f"  return {sum(returns) / len(returns):.1f} (mean of seeds)" if returns else ""
        self.progress.update(self.task, completed=done, info=info)


def _summary(path: Path) -> dict[str, Any]:
    """A seed's summary.json as it is now (none yet, or unreadable: empty)."""
    from rlherd.run.rundir import read_json

    try:
        return read_json(path / "summary.json")
    except (OSError, ValueError):
        return {}


def _gathered(parent: Path, group: list[SeedProcess], signum: int) -> SeedRuns:
    """The group's outcome: each seed's run (finished, or stopped with a checkpoint), what each
    failed one printed last (its log kept; a log of a seed that did not fail is removed: its run
    directory holds all it said), and the seeds that never started."""
    from rlherd.commands.train import Run
    from rlherd.run.rundir import RunDir

    result = SeedRuns(parent, signal=signum)
    for seed in group:
        made = (seed.path / "config.json").exists()
        if seed.process is None or (signum and not made):  # stopped before it made anything
            result.not_started.append(seed.seed)
        elif seed.returncode == 0 or (signum and seed.returncode in (130, 143)):
            rundir = RunDir(seed.path)
            result.runs.append(Run(seed.path, rundir.read_config(), rundir.read_summary(),
                                   stopped=seed.returncode != 0))  # fmt: skip
        else:
            result.failed[seed.seed] = seed.last_line()
            continue
        seed.log.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        parent.rmdir()  # empty: every seed failed before making anything
    return result


def command(args: Any, words: list[str], given: dict[str, Any]) -> int:
    """``rlherd train --seeds ...`` or ``rlherd train --resume PARENT``: ``args`` as the CLI
    parsed them, ``words`` the words after ``train``, ``given`` what they (and a ``--config``
    file) ask ``train`` for. Prints each seed's summary (JSON
    lines), then one line per outcome on stderr; the exit status is 0 only if every seed
    finished."""
    if args.seeds is not None and (args.seed is not None or args.resume is not None):
        flag = "--seed" if args.seed is not None else "--resume"
        raise ConfigError(f"--seeds starts one new run per seed; drop {flag} (continue seed runs "
                          "with --resume PARENT alone)")  # fmt: skip
    progress = not args.no_progress
    if args.seeds is None:
        argv = _without(words, {"--resume", "--jobs"}, {"--no-progress"})
        result = resume_seeds(args.resume, argv, args.jobs, progress)
    else:
        seeds = parse_seeds(args.seeds)
        argv = _without(words, {"--seeds", "--jobs", "--run-dir"}, {"--no-progress"})
        result = run_seeds(given["agent"], given["env"], argv, seeds, args.run_dir, args.jobs,
                           progress)  # fmt: skip
    for run in result.runs:
        print(json.dumps({"seed": run.config.seed, "run_dir": str(run.path), **run.summary}))
    return _say(result, argv if args.seeds is not None else None)


def _say(result: SeedRuns, argv: list[str] | None) -> int:
    """One line on stderr per outcome (seeds that failed alike share one); the exit status."""
    by_line: dict[str, list[int]] = {}
    for seed, line in result.failed.items():
        by_line.setdefault(line, []).append(seed)
    for line, seeds in by_line.items():
        logs = result.path / (f"seed-{seeds[0]}.log" if len(seeds) == 1 else "seed-*.log")
        line = line.removeprefix("rlherd: error: ")
        print(f"rlherd: error: {_which(seeds)} failed: {line} (output: {logs})",
              file=sys.stderr)  # fmt: skip
    if result.stopped:
        print(f"rlherd: interrupted; resume the seeds with `rlherd train --resume "
              f"{result.path}`", file=sys.stderr)  # fmt: skip
        if result.not_started and argv is not None:
            again = shlex.join(["rlherd", "train", *argv, "--seeds", _listed(result.not_started),
                                "--run-dir", str(result.path)])  # fmt: skip
            print(f"rlherd: {_which(result.not_started)} had not started; start "
                  f"{'it' if len(result.not_started) == 1 else 'them'} with `{again}`",
                  file=sys.stderr)  # fmt: skip
        return 128 + result.signal
    if result.failed:
        return 1
    print(f"run directories: {result.path}/seed-*; compare them with `rlherd report "
          f"{result.path}`", file=sys.stderr)  # fmt: skip
    return 0


def _listed(seeds: list[int]) -> str:
    return ",".join(map(str, seeds))


def _which(seeds: list[int]) -> str:
    return f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {_listed(seeds)}"


def _without(argv: list[str], valued: set[str], bare: set[str]) -> list[str]:
    """``argv`` without the flags ``valued`` (with their values, ``--flag V`` or ``--flag=V``)
    and ``bare``: what the group sets for each seed itself."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in valued:
            skip = True
        elif arg not in bare and arg.partition("=")[0] not in valued:
            out.append(arg)
    return out
