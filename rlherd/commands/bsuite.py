"""``rlherd bsuite`` and ``rlherd bsuite-report``: an agent swept over the Behaviour Suite, and the
sweeps scored by bsuite's own analysis code.

A sweep trains one run per bsuite id (``rlherd train AGENT --env bsuite/<experiment>/<n>``, each
for bsuite's episode budget: :mod:`rlherd.envs.bsuite`) in ``OUT/<experiment>-<n>/``, as
parallel processes that fit the cores (those of ``rlherd train --seeds``). Each run's training
environment writes bsuite's CSV in the run's ``bsuite/`` folder, and ``OUT/csv/`` links them all
(``bsuite.logging.csv_load.load_bsuite("OUT/csv")`` reads a sweep unchanged). ``bsuite/<e>/<n>``
runs with its own seed (:func:`id_seed`): bsuite's replicates of one setting differ by their
seed alone. Sweeping
again into the same ``OUT`` keeps finished ids, continues stopped ones from their checkpoints
and starts the rest; ``OUT/sweep.json`` holds the agent, seed and settings the folder was swept
with, and a sweep with others is refused (its finished ids would stay as they were).

The whole suite is 468 ids, days of CPU for an agent. :data:`SUBSET_SIZE` ids of each experiment,
spread evenly across its settings (its sizes, lengths or noise scales, from easiest to hardest;
:func:`subset`), make the ``--ids subset`` sweep. A score over a subset is not the full suite's
(deep sea's is the share of its sizes solved): compare agents on the same ids only.

``--until-solved`` stops each deep sea id (:data:`SOLVABLE`) once bsuite's own analysis counts
it solved (:class:`UntilSolved`): its score is then what the whole budget would give.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import logging
import pickle
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.commands.seeds import SeedProcess, SeedRuns, run_group, train_argv
from rlherd.commands.train import check_pairing, default_runtime, resolve_config, split_overrides
from rlherd.config import check_seed, run_file, to_json
from rlherd.envs import bsuite as bs
from rlherd.errors import ConfigError, MissingExtra, Notice
from rlherd.run.callbacks import STOP, Answer, Callback, RunInfo
from rlherd.run.rundir import (
    RunDir,
    atomic_write_bytes,
    check_folder,
    check_given,
    make_folder,
    read_json,
)
from rlherd.runtime import settings as settings_mod

SUBSET_SIZE = 5  # ids per experiment in the documented subset
CSV_DIR = "csv"  # a sweep's folder of links to its runs' CSVs
SWEEP_FILE = "sweep.json"  # what a sweep's folder was swept with: agent, seed, settings
PARTS = ".parts"  # ids being copied into a folder (copy_finished), out of the runs' globs
EXPERIMENTS = "bsuite's experiments"  # a category table's count column (no agent's name)
# rlherd.train's own arguments that a sweep passes on to every id, beside fields and settings.
TRAIN_ARGUMENTS = ("runtime", "total_steps", "eval_every", "eval_episodes", "env_kwargs")
# The experiments whose score a solution fixes (bsuite's ``find_solution`` counts a size solved
# at the first logged episode below its regret threshold, and a solved run as finished), with
# the first episode their analysis reads.
SOLVABLE = {"deep_sea": 1, "deep_sea_stochastic": 100}


class UntilSolved(Callback):
    """Stop a run of a :data:`SOLVABLE` bsuite id once bsuite's own analysis of its CSV counts
    it solved (``rlherd train --until-solved``, ``rlherd bsuite --until-solved``).

    Why: deep sea's score is the share of its sizes solved, and bsuite's ``find_solution``
    takes the first logged episode whose share of bad episodes is below its threshold, and
    counts a solved run finished. The episodes after it change neither, but cost the most: an
    agent that solves size 50 at episode 500 would play 9,500 more episodes of 50 steps. Sizes
    not solved still play the whole budget. bsuite's plots draw a stopped id as unfinished (they
    count its episodes); its score is bsuite's.

    Example::

        import rlherd
        from rlherd.commands.bsuite import UntilSolved

        run = rlherd.train("dqfd", "bsuite/deep_sea/0", callbacks=[UntilSolved()])
        print(run.summary["stopped_by"])  # UntilSolved: bsuite counts it solved at episode ...
    """

    def on_start(self, run: RunInfo) -> Answer:
        env = str(run.record["env"])
        experiment = env.split("/")[1] if env.startswith(bs.PREFIX) else None  # as _argv reads it
        if experiment not in SOLVABLE:
            raise ConfigError(f"--until-solved stops runs of bsuite/{{{','.join(SOLVABLE)}}}/N, "
                              f"whose score a solution fixes; {env} is not one: drop it")
        self.results, self.first_episode = run.path / bs.RESULTS, SOLVABLE[experiment]
        analysis = importlib.import_module(f"bsuite.experiments.{experiment}.analysis")
        self.find_solution = analysis.find_solution
        return None

    def on_log(self, metrics: dict[str, Any]) -> Answer:
        from bsuite.logging import csv_load

        if not any(self.results.glob("*.csv")):  # before the first logged episode
            return None
        data = csv_load.load_one_result_set(str(self.results))
        if data.episode.max() < self.first_episode:
            return None
        with pandas_1():
            solution = self.find_solution(data)
        if not solution.solved.any():
            return None
        self.reason = f"bsuite counts it solved at episode {int(solution.episode.min())}"
        return STOP


def stopped_solved(summary: dict[str, Any]) -> bool:
    """Whether a run's summary says :class:`UntilSolved` stopped it."""
    return str(summary.get("stopped_by", "")).startswith(f"{UntilSolved.__name__}:")


def subset(env_ids: list[str]) -> list[str]:
    """:data:`SUBSET_SIZE` ids of each experiment among ``env_ids`` (bsuite's sweep order, which
    runs from the easiest setting to the hardest), evenly spaced, the first and last included."""
    by_experiment: dict[str, list[str]] = {}
    for env_id in env_ids:
        by_experiment.setdefault(env_id.split("/")[1], []).append(env_id)
    chosen = []
    for members in by_experiment.values():
        picks = np.linspace(0, len(members) - 1, min(SUBSET_SIZE, len(members)))
        chosen += [members[i] for i in sorted(set(np.round(picks).astype(int).tolist()))]
    return chosen


def select(experiments: list[str] | None, ids: list[str] | None) -> list[str]:
    """The sweep's ids: ``ids`` (``deep_sea/0``; a number, that id of each experiment; or
    ``subset``) within ``experiments`` (all of bsuite's if none)."""
    pool = bs.ids(experiments)
    if not ids:
        return pool
    if ids == ["subset"]:
        return subset(pool)
    chosen = list(dict.fromkeys(_full_ids(experiments, ids)))
    for env_id in chosen:
        bs.bsuite_id(env_id)  # an unknown id: one line with the close ones
    outside = [i for i in chosen if i not in pool]
    if outside:
        raise ConfigError(f"{outside[0]} is not among --experiments {' '.join(experiments or [])}")
    return chosen


def _full_ids(experiments: list[str] | None, ids: list[str]) -> Iterator[str]:
    """``--ids`` as bsuite ids: ``deep_sea/0`` (or ``bsuite/deep_sea/0``) as it is, and a bare
    number ``N`` as each of ``experiments``' ``N``, the way one reads ``--experiments catch
    deep_sea --ids 0``."""
    for i in ids:
        if i == "subset":
            raise ConfigError("--ids subset stands alone (it picks each experiment's ids); "
                              "narrow it with --experiments")  # fmt: skip
        if "/" not in i and not i.isdigit():  # -1, 0.5, catch: not bsuite/-1, an unknown id
            own = (f"an experiment: --experiments {i} sweeps its ids; or"
                   if i in bs.experiment_names() else "give")  # fmt: skip
            raise ConfigError(f"--ids {i}: {own} EXPERIMENT/N (deep_sea/0), a number N >= 0 "
                              "(each of --experiments' N), or subset")  # fmt: skip
        if not i.isdigit():
            yield i if i.startswith(bs.PREFIX) else bs.PREFIX + i
        elif experiments:
            yield from (f"{bs.PREFIX}{experiment}/{i}" for experiment in experiments)
        else:
            raise ConfigError(f"--ids {i}: a bare number needs --experiments (or name the "
                              f"experiment: --ids deep_sea/{i})")  # fmt: skip


def id_seed(seed: int, env_id: str) -> int:
    """``bsuite/<experiment>/<n>``'s seed in a sweep of ``seed``: ``1000 * seed + n``. bsuite's
    replicates of one setting differ by their seed alone (catch's 20), so each id has its own,
    and no two sweeps' seeds meet (an experiment has at most 23 ids)."""
    return 1000 * seed + int(env_id.rsplit("/", 1)[1])


def run_path(out: Path, env_id: str) -> Path:
    """``OUT/deep_sea-0`` for ``bsuite/deep_sea/0``."""
    return out / env_id[len(bs.PREFIX):].replace("/", "-")


def _finished(path: Path) -> bool:
    """Whether the run in ``path`` played its whole episode budget, or was stopped solved."""
    try:
        summary = read_json(path / "summary.json")
    except (OSError, ValueError):
        return False
    return 0 < summary.get("total_episodes", 0) <= summary.get("episodes", 0) or (
        stopped_solved(summary))


def _check_out(out: Path, request: dict[str, Any], env_id: str) -> None:
    """Refuse, before anything is made, an ``--out`` folder that cannot be one (a file in its
    way), or a sweep ``request`` (agent, seed, resolved config and settings) that differs from
    what the folder's runs were swept with (``OUT/sweep.json``): its finished ids would be
    kept, and its stopped ones continued, with the old ones. A folder
    none of whose runs finished or got as far as a checkpoint (a sweep whose every id failed) is
    free. Finished runs count without their checkpoints, which a user may delete or a copy of
    the results leave out. A record written before an
    upgrade counts with the fields it lacks at their defaults (:func:`upgraded`)."""
    _check_sweep_folder(out, "--out")
    path = out / SWEEP_FILE
    started = [c.parent for c in out.glob("*/config.json")
               if _finished(c.parent) or RunDir(c.parent).latest_checkpoint() is not None]
    if started and not path.exists():
        raise ConfigError(f"{out} holds runs (e.g. {started[0].name}) without the {SWEEP_FILE} "
                          "that says how they were swept; sweep into another --out")  # fmt: skip
    before = upgraded(read_json(path), env_id) if started else request
    _refuse_another(out, before, request, "--out")


def _check_sweep_folder(folder: Path, flag: str) -> None:
    """Refuse a ``flag`` folder that cannot hold a sweep: a file in its way, or a run directory
    (one id's, say ``OUT/catch-0``), into which the sweep would write its runs, ``csv/`` and
    ``sweep.json`` beside the run's own files."""
    check_folder(folder, flag)
    if (folder / "config.json").exists():
        raise ConfigError(f"{flag} {folder} is a run directory (it holds a config.json), not a "
                          f"sweep's folder; give {flag} a folder of its own")  # fmt: skip


def _refuse_another(folder: Path, before: dict[str, Any], request: dict[str, Any],
                    flag: str) -> None:  # fmt: skip
    """Refuse to put ids swept with ``request`` in ``folder`` (given by ``flag``), whose ids were
    swept with ``before``: scores of two settings would pass for one sweep's."""
    if before != request:
        changed = sorted(k for k in {**before, **request} if before.get(k) != request.get(k))
        raise ConfigError(
            f"{folder} holds a sweep of {before.get('agent')} with another {', '.join(changed)}; "
            f"give another {flag}, or the same agent, seed and settings to continue it"
        )


def _check_kept(kept: Path, request: dict[str, Any], env_id: str) -> None:
    """Refuse, before anything is made, copied or run, a ``--kept`` folder that cannot be one (a
    file in its way), that was swept with other settings than ``request``, or whose runs have no
    record of how they were swept (they could be any sweep's)."""
    _check_sweep_folder(kept, "--kept")
    if (kept / SWEEP_FILE).exists():
        _refuse_another(kept, upgraded(read_json(kept / SWEEP_FILE), env_id), request, "--kept")
    elif any(kept.glob("*/config.json")):
        raise ConfigError(f"{kept} holds runs without the {SWEEP_FILE} that says how they were "
                          "swept; give another --kept folder")  # fmt: skip


def check_not_sweep(path: str | Path) -> None:
    """Refuse ``rlherd train --resume`` of a sweep's folder, which holds one run per id: name
    the command that continues the sweep, and how to continue one of its runs."""
    path = Path(path)
    swept = path / SWEEP_FILE
    if swept.exists() and not (path / "config.json").exists():
        run = next((c.parent for c in sorted(path.glob("*/config.json"))), path / "EXPERIMENT-N")
        raise ConfigError(f"{path} is a bsuite sweep's folder, not a run: `rlherd bsuite "
                          f"{read_json(swept)['agent']} --out {path}` with the sweep's "
                          f"--experiments or --ids continues it, and `--resume {run}` one of "
                          "its runs")  # fmt: skip


def upgraded(record: dict[str, Any], env_id: str) -> dict[str, Any]:
    """A folder's sweep record with the config fields and runtime settings that rlherd gained
    since it was written, at their defaults (for its preset and ``env_id``, nothing set). A new
    field's default keeps the behaviour from before it, so the folder was swept with those: a
    sweep of days goes on after an upgrade, and setting a new field otherwise is another sweep."""
    defaults = _request(record["agent"], env_id, record["seed"], {"preset": record["preset"]})
    return {**record, **{k: {**defaults[k], **record[k]} for k in ("config", "settings")}}


def _request(agent: str, env_id: str, seed: int, settings: dict[str, Any],
             probe: bool = False) -> dict[str, Any]:  # fmt: skip
    """What a sweep of ``agent`` with ``settings`` trains each id with, resolved as ``rlherd
    train`` resolves it (so ``1e-3`` and ``0.001``, or a preset named and the same one picked,
    are the same sweep); refuses, once and before any process starts, an agent, preset, field
    or setting that every id's run would refuse, and with ``probe`` an agent whose networks
    cannot act in bsuite's spaces (every bsuite id's actions are Discrete: ``sac`` failed in
    each id's process), built for ``env_id``'s environment unless that is MNIST's download."""
    given = {k: v for k, v in settings.items() if k not in TRAIN_ARGUMENTS}
    preset = given.pop("preset", None)
    fields, runtime_settings = split_overrides(agent, given)
    config, preset = resolve_config(agent, env_id, preset, fields)
    # What a bsuite run refuses whatever its id (options, another runtime, --num-envs,
    # --env-workers): refused here once, not by each of hundreds of processes.
    if settings.get("env_kwargs"):
        raise ConfigError("bsuite ids take no options (bsuite fixes each id's settings); drop "
                          "env_kwargs")  # fmt: skip
    runtime = settings.get("runtime") or default_runtime(agent, env_id, runtime_settings)
    check_pairing(agent, env_id, runtime, config, preset, runtime_settings, {})
    builder = BUILDERS[agent]
    if probe and not env_id.split("/")[1].startswith("mnist"):
        builder(config).make_networks(rl_envs.spec_for(env_id))
    resolved = settings_mod.resolve("single", builder.runtime_defaults.get(preset, {}),
                                    {"num_envs": 1, **runtime_settings}, builder.dataflow)
    train = {k: v for k, v in settings.items() if k in TRAIN_ARGUMENTS}
    return json.loads(json.dumps(dict(agent=agent, seed=seed, preset=preset, config=to_json(config),
                                      settings=to_json(resolved), train=train)))  # fmt: skip


def _argv(agent: str, env_id: str, path: Path, seed: int, settings: dict[str, Any],
          until_solved: bool) -> list[str]:  # fmt: skip
    """The ``rlherd train`` arguments of one id: a new run, or the stopped one continued."""
    solvable = until_solved and env_id.split("/")[1] in SOLVABLE
    watch = ["--until-solved"] if solvable else []
    if (path / "config.json").exists() and RunDir(path).latest_checkpoint() is not None:
        return ["--resume", str(path), *watch]
    return [*train_argv(agent, env_id, settings), "--seed", str(seed), "--run-dir", str(path),
            "--overwrite", *watch]  # fmt: skip


def sweep(agent: str, env_ids: list[str], out: str | Path, jobs: int | None = None,
          progress: bool = True, seed: int = 0, until_solved: bool = False,
          kept: str | Path | None = None, **settings: Any) -> tuple[SeedRuns, list[str]]:
    """Train ``agent`` on each of ``env_ids`` not yet finished in ``out``, in parallel processes
    (at most ``jobs`` at once), each id with its own seed (:func:`id_seed`). ``settings`` are
    :func:`rlherd.train`'s (``preset``, ``total_episodes``, agent fields, runtime settings),
    the same for every id and every sweep into ``out``. ``until_solved``: the :data:`SOLVABLE`
    ids stop once solved (:class:`UntilSolved`); it is not part of what a folder is swept with,
    as it changes no score. ``kept``: a folder of finished ids (:func:`copy_finished`) that the
    sweep starts from, and to which it adds the ids it finishes, whether or not the sweep is
    stopped, so that sweeps on several machines, or fresh clones, add up there. Returns the
    group's outcome and the ids it found finished (and left as they were)."""
    check_given(out, "--out")
    check_given(kept, "--kept")
    out = Path(out)
    if not env_ids:
        raise ConfigError("the sweep names no bsuite id")
    episodes = settings.get("total_episodes")
    try:  # train's 0 (no limit) would run past the budget; what is not a count, train names
        too_few = episodes is not None and int(episodes) < 1
    except (TypeError, ValueError):
        too_few = False
    if too_few:
        raise ConfigError(f"--total-episodes must be >= 1 (each id's episodes; leave it out "
                          f"for bsuite's budget), got {episodes}")  # fmt: skip
    for env_id in env_ids:
        check_seed(id_seed(seed, env_id), f"{env_id}'s seed, 1000 * --seed + its number,")
    request = _request(agent, env_ids[0], seed, settings, probe=True)
    kept = None if kept is None else Path(kept)
    if kept is not None:  # both folders checked before either is made
        _check_kept(kept, request, env_ids[0])
    _check_out(out, request, env_ids[0])
    if kept is not None:
        make_folder(kept, "--kept")
    make_folder(out, "--out")
    (out / SWEEP_FILE).write_text(json.dumps(request, indent=1, sort_keys=True))
    if kept is not None and (kept / SWEEP_FILE).exists():
        copy_finished(kept, out, env_ids[0])
    paths = {i: run_path(out, i) for i in env_ids}
    done = [i for i in env_ids if _finished(paths[i])]
    for env_id in done:  # finished in a sweep before this one dropped replays
        drop_replay(paths[env_id])
    for name in without_csv(out):
        warnings.warn(f"{out / name} finished, but its bsuite CSV is gone, so bsuite-report "
                      "leaves it out; delete the run to sweep it again", Notice, stacklevel=2)
    group = [SeedProcess(k, paths[i], _argv(agent, i, paths[i], id_seed(seed, i), settings,
                                            until_solved))
             for k, i in enumerate(env_ids) if i not in done]  # fmt: skip
    threads = int(settings.get("torch_threads", 1))
    result = SeedRuns(out)
    try:
        if group:
            result = run_group(out, group, threads, jobs, progress, f"{agent} bsuite",
                               unit="ids", on_end=lambda run: drop_replay(run.path))  # fmt: skip
        link_csvs(out)
    finally:  # whatever stopped the sweep, its finished ids are kept
        if kept is not None:
            copy_finished(out, kept, env_ids[0])
    return result, done


def drop_replay(path: Path) -> None:
    """Rewrite a finished id's latest checkpoint without its replay tables (as a run with
    ``checkpoint_replay`` off writes them) and delete the older one; an id not finished keeps
    its replay, to continue exactly. Why: a finished id is never continued (its budget is
    bsuite's), and its replay is most of its checkpoint, up to gigabytes (R2D2's stochastic
    sea of size 50: 7.5 GB a checkpoint, two kept), so a subset sweep kept tens of GB for
    nothing. The policy stays, for ``rlherd eval``. The checkpoint is read memory-mapped: the
    replay's bytes are never read. A run another process holds (its lock) is left as it is."""
    if not (_finished(path) and (path / "checkpoints").is_dir()):  # kept ids have none
        return
    run = RunDir(path)
    try:
        run.lock()
    except ConfigError:
        return
    try:
        latest = run.latest_checkpoint()
        if latest is None or not latest.exists():
            return
        try:
            state = torch.load(run_file(latest), mmap=True, weights_only=True,
                               map_location="cpu")  # fmt: skip
        except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as e:  # not rlherd's
            warnings.warn(f"{latest} is unreadable ({e}); its replay, if any, is left in it",
                          Notice, stacklevel=2)  # fmt: skip
            return
        if isinstance(state, dict) and state.get("tables") is not None:
            state["tables"] = None
            run.save_checkpoint(state, int(latest.stem.split("-")[1]))  # replaces it, atomically
        for old in run.checkpoint_dir.glob("ckpt-*.pt"):
            if old != latest:
                old.unlink()
    finally:
        run.unlock()


def finished_csvs(out: Path) -> list[Path]:
    """The bsuite CSV of each finished run in the sweep folder ``out``."""
    return [c for c in sorted(out.glob(f"*/{bs.RESULTS}/*.csv")) if _finished(c.parent.parent)]


def without_csv(out: Path) -> list[str]:
    """The finished runs of the sweep folder ``out`` whose bsuite CSV is gone (deleted by hand):
    the sweep keeps them finished, and bsuite's scores cannot count them, so both say so."""
    return [c.parent.name for c in sorted(out.glob("*/config.json"))
            if _finished(c.parent) and not any((c.parent / bs.RESULTS).glob("*.csv"))]


def copy_finished(sweep: Path, to: Path, env_id: str) -> int:
    """Copy each finished id of the sweep folder ``sweep`` into ``to``, as bsuite's report reads
    it (its config, summary and bsuite CSV: a few kilobytes, no checkpoints), unless ``to`` has
    finished it too (an unfinished run of the id there is replaced); returns how many ids went.
    Why: a folder of these adds up a sweep of days across machines and fresh clones.

    The two folders' records must say the same settings (``env_id``, one of the sweep's ids,
    gives the defaults of fields added since a record was written: :func:`upgraded`). ``to``'s
    record is written first, so a copy cut short leaves a folder that says how its ids were
    swept; each id is copied under ``to/.parts`` (which no glob of runs reaches), then renamed
    whole into place."""
    record, theirs = (sweep / SWEEP_FILE).read_bytes(), to / SWEEP_FILE
    if theirs.exists():
        ours = upgraded(json.loads(record), env_id)
        _refuse_another(to, upgraded(read_json(theirs), env_id), ours, "--kept")
    else:
        to.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(theirs, record)
    runs = sorted({csv.parent.parent for csv in finished_csvs(sweep)})
    runs = [run for run in runs if not _finished(to / run.name)]
    for run in runs:
        part = to / PARTS / run.name
        shutil.rmtree(part, ignore_errors=True)  # a copy cut short before
        (part / bs.RESULTS).mkdir(parents=True)
        for name in ("config.json", "summary.json"):
            shutil.copy2(run / name, part / name)
        for csv in (run / bs.RESULTS).glob("*.csv"):
            shutil.copy2(csv, part / bs.RESULTS / csv.name)
        shutil.rmtree(to / run.name, ignore_errors=True)
        part.rename(to / run.name)
    with contextlib.suppress(OSError):
        (to / PARTS).rmdir()
    return len(runs)


def link_csvs(out: Path) -> None:
    """``OUT/csv/``: a link to each finished run's bsuite CSV, the folder bsuite's loader reads,
    and no other link: one left to a run since deleted (an id to be redone, or dropped) would
    fail bsuite's loader on a missing file."""
    folder = out / CSV_DIR
    folder.mkdir(parents=True, exist_ok=True)
    csvs = finished_csvs(out)
    names = {csv.name for csv in csvs}
    for link in folder.iterdir():
        if link.is_symlink() and link.name not in names:
            link.unlink()
    for csv in csvs:
        link = folder / csv.name
        link.unlink(missing_ok=True)
        link.symlink_to(Path("..") / csv.relative_to(out))


# ------------------------------------------------------------------------------------- report
@contextlib.contextmanager
def pandas_1() -> Iterator[None]:
    """pandas 1's behaviour, which bsuite's analysis code (0.3.6, its last release) was written
    for, while that code runs: ``Series.append`` and ``Series.iteritems`` (removed in pandas 2)
    and a groupby mean that skips the columns of text (pandas 2 fails on them). Only pandas'
    API changes; bsuite's scoring is its own. Newer pandas' and matplotlib's deprecation
    warnings about that code, which a user can do nothing about, are silenced meanwhile."""
    import pandas as pd
    from pandas.core.groupby import DataFrameGroupBy

    mean = DataFrameGroupBy.mean
    patches = {
        (pd.Series, "append"): lambda self, other, **_: pd.concat([self, other]),
        (pd.Series, "iteritems"): pd.Series.items,
        (DataFrameGroupBy, "mean"): lambda self, numeric_only=True, **kw: mean(
            self, numeric_only=numeric_only, **kw),
    }  # fmt: skip
    saved = {key: key[0].__dict__.get(key[1]) for key in patches}
    for (cls, name), value in patches.items():
        setattr(cls, name, value)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"bsuite\.")
            warnings.filterwarnings("ignore", category=UserWarning, module=r"bsuite\.")
            # bsuite's bars fade the experiments with an id stopped once solved (unfinished)
            warnings.filterwarnings("ignore", message="Using alpha for a discrete variable")
            yield
    finally:
        for (cls, name), value in saved.items():
            if value is None:
                delattr(cls, name)
            else:
                setattr(cls, name, value)


def _shortened(sweep_dir: Path) -> list[str]:
    """The ids of a sweep that were given fewer episodes than bsuite's budget."""
    short = []
    for summary in sorted(sweep_dir.glob("*/summary.json")):
        run = read_json(summary)
        if run.get("total_episodes", 0) < bs.episode_budget(run["env"]):
            short.append(run["env"])
    return short


def _finished_ids(sweep_dir: Path) -> set[str]:
    """The ids a report scores of ``sweep_dir``: its finished runs with their bsuite CSV."""
    return {csv.parent.parent.name for csv in finished_csvs(sweep_dir)}


def _agent_names(dirs: list[Path]) -> list[str]:
    """Each sweep's label: its agent, or where two share one, its folder (with its parent's
    name where those are alike too)."""
    agents = []
    for d in dirs:
        swept = d / SWEEP_FILE
        configs = sorted(d.glob("*/config.json"))
        if not swept.exists() and not configs:
            raise ConfigError(f"{d} holds no bsuite run (rlherd bsuite AGENT --out {d} makes one)")
        agents.append(read_json(swept if swept.exists() else configs[0])["agent"])
    for names in (agents, [d.name for d in dirs], [f"{d.parent.name}-{d.name}" for d in dirs]):
        if len(set(names)) == len(names):
            return names
    return [f"sweep{k}" for k in range(len(dirs))]


def notes(dirs: list[str | Path]) -> list[str]:
    """What a reader of a report of ``dirs`` must know: sweeps cut short of bsuite's budget, ids
    stopped once solved, and sweeps that finished different ids (bsuite's scores compare only
    on the same ones)."""
    dirs = [Path(d) for d in dirs]
    out = []
    for d in dirs:
        short = _shortened(d)
        if short:
            out.append(f"{d}: {len(short)} ids ran fewer episodes than bsuite's budget "
                       f"({short[0]}, ...); their scores are not bsuite's")  # fmt: skip
        gone = without_csv(d)
        if gone:
            out.append(f"{d}: {len(gone)} finished ids have no bsuite CSV ({', '.join(gone[:3])}"
                       f"{', ...' if len(gone) > 3 else ''}), so their scores are left out; "
                       "delete their runs and sweep again to redo them")  # fmt: skip
        solved = [s for s in sorted(d.glob("*/summary.json")) if stopped_solved(read_json(s))]
        if solved:
            out.append(f"{d}: {len(solved)} ids stopped once solved (--until-solved): scored as "
                       "their whole budget would be, drawn faded in bsuite's plots (unfinished)")
    finished = [_finished_ids(d) for d in dirs]
    if any(f != finished[0] for f in finished):
        out.append("the sweeps finished different ids (" + ", ".join(
            f"{d}: {len(f)}" for d, f in zip(dirs, finished, strict=True)) + "); compare "
            "agents on the same ids")  # fmt: skip
    return out


class Scores(NamedTuple):
    """A report's scores, agents as columns: ``experiments`` (one row per bsuite experiment) and
    ``categories`` (:func:`category_table`)."""

    experiments: Any
    categories: Any


def report(dirs: list[str | Path], out: str | Path) -> Scores:
    """Score each sweep in ``dirs`` with bsuite's analysis (``bsuite.experiments.
    summary_analysis``): writes ``OUT/scores.csv`` (per experiment and agent),
    ``OUT/categories.csv`` (per capability: :func:`category_table`), ``OUT/radar.png`` (the
    capability radar of Osband et al.'s Figure 1 and the Acme paper's Figure 10),
    ``OUT/bars.png`` (scores per experiment), ``OUT/scores.md`` (both tables) and
    ``OUT/runs.md`` (where and how long the ids ran: :func:`runs_markdown`)."""
    try:
        from bsuite.experiments import summary_analysis
        from bsuite.logging import csv_load
    except ImportError as e:
        raise MissingExtra(f"bsuite-report needs the bsuite package: {bs.INSTALL}") from e
    dirs = [Path(d) for d in dirs]
    for k, d in enumerate(dirs):
        if not d.is_dir():
            raise ConfigError(f"{d} is not a directory; give the --out of rlherd bsuite sweeps")
        if (d / "config.json").exists():  # one id's run, not the sweep that holds it
            raise ConfigError(f"{d} is a run directory; give the sweep's folder, the --out of "
                              f"rlherd bsuite (that holds it: {d.parent})")  # fmt: skip
        if d.resolve() in (e.resolve() for e in dirs[:k]):  # it would be scored as two agents
            raise ConfigError(f"{d} is given twice; give each sweep once")
    check_given(out, "--output")
    out = Path(out)
    check_folder(out, "--output")  # made once the sweeps are scored: a refusal leaves nothing
    names = _agent_names(dirs)
    csvs = {d: finished_csvs(d) for d in dirs}
    for d, found in csvs.items():
        if not found:
            raise ConfigError(f"{d} has no finished bsuite run; sweep it first")
    # bsuite's plots ask for serif fonts a bare machine lacks: one warning per text, not news.
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp, pandas_1():
        folders = {}
        for name, d in zip(names, dirs, strict=True):
            folders[name] = Path(tmp) / name
            folders[name].mkdir()
            for csv in csvs[d]:
                (folders[name] / csv.name).symlink_to(csv.resolve())
        data, sweep_vars = csv_load.load_bsuite({k: str(v) for k, v in folders.items()})
        try:
            scores = summary_analysis.bsuite_score(data, sweep_vars)
        except (ValueError, KeyError) as e:
            if not any(_shortened(d) for d in dirs):
                raise  # not bsuite's budget cut short: a fault to see whole
            raise ConfigError(
                f"bsuite's analysis cannot score these runs ({type(e).__name__}: {e}); they ran "
                "fewer episodes than bsuite's budget (--total-episodes), too few for some of its "
                "experiments (deep_sea_stochastic's starts at episode 100)"
            ) from e
        summary = summary_analysis.ave_score_by_tag(scores, sweep_vars)
        make_folder(out, "--output")
        radar = summary_analysis.bsuite_radar_plot(summary, sweep_vars)
        radar.savefig(out / "radar.png", bbox_inches="tight", dpi=120)
        bars = summary_analysis.bsuite_bar_plot_compare(scores, sweep_vars)
        bars.save(out / "bars.png", verbose=False, width=10, height=6, dpi=120)
    table = scores.pivot_table(index="bsuite_env", columns="agent_name", values="score")
    table.to_csv(out / "scores.csv")
    categories = category_table(summary, table, summary_analysis.BSUITE_INFO)
    categories.to_csv(out / "categories.csv")
    (out / "scores.md").write_text(markdown(table) + "\n" + category_markdown(categories))
    (out / "runs.md").write_text(runs_markdown(dirs, list(folders)))
    return Scores(table, categories)


def category_table(summary: Any, table: Any, info: dict[str, Any]) -> Any:
    """bsuite's score of each capability (its ``ave_score_by_tag``: the mean over the category's
    experiments that were scored) for each agent, beside how many of the category's experiments
    each agent has (``<agent> measured``) and how many bsuite has (:data:`EXPERIMENTS`, from
    ``info``: its ``BSUITE_INFO``). A category of a partial sweep scores its experiments
    measured alone: deep sea by itself is not bsuite's exploration."""
    import pandas as pd

    scores = summary.pivot_table(index="tag", columns="agent_name", values="score", dropna=False)
    rows = []
    for tag in sorted(scores.index):
        experiments = [name for name, e in info.items() if tag in e.tags]
        row = {"category": tag, EXPERIMENTS: len(experiments)}
        for agent in table.columns:
            row[agent] = scores.loc[tag, agent]
            row[f"{agent} measured"] = int(table[agent].reindex(experiments).notna().sum())
        rows.append(row)
    return pd.DataFrame(rows).set_index("category")


def _category_agents(categories: Any) -> list[str]:
    """The agents' columns of a :func:`category_table` (beside :data:`EXPERIMENTS` and each
    agent's ``<agent> measured``)."""
    return [c for c in categories.columns if c != EXPERIMENTS and not c.endswith(" measured")]


def category_markdown(categories: Any) -> str:
    """The categories table as Markdown: each score with how many of its experiments it has."""
    agents = _category_agents(categories)
    lines = ["| category (experiments) | " + " | ".join(agents) + " |",
             "|---|" + "---:|" * len(agents)]  # fmt: skip
    for tag, row in categories.iterrows():
        cells = [("-" if np.isnan(row[a]) else f"{row[a]:.3f}") + f" ({row[f'{a} measured']:.0f})"
                 for a in agents]  # fmt: skip
        lines.append(f"| {tag} ({row[EXPERIMENTS]:.0f}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def radar_gaps(categories: Any) -> list[str]:
    """A note naming the agents bsuite's radar cannot draw whole: a category without a score
    breaks an agent's outline there, so a partial sweep's agents are drawn in part, or not at
    all."""
    agents = _category_agents(categories)
    left_out = []
    for agent in agents:
        scored = [tag for tag in categories.index if not np.isnan(categories.loc[tag, agent])]
        if len(scored) < len(categories.index):
            left_out.append(f"{agent} ({', '.join(scored) or 'none'})")
    if not left_out:
        return []
    return [f"radar.png draws an agent whole only with a score in each of bsuite's "
            f"{len(categories.index)} categories; in part or not at all: {'; '.join(left_out)} "
            "(scores.md gives each category's score over the experiments measured)"]


def runs_markdown(dirs: list[Path], names: list[str]) -> str:
    """How each sweep's finished ids ran, as Markdown: an agent a row (its ids' wall time in all,
    their median and the longest), then an agent's experiment a row with the machines and the
    commits (a resumed id's first and last) they ran at. Why: bsuite's scores say nothing of
    cost, and a sweep of days goes in pieces on several machines; each id's own record says
    where, and from which commit, to redo it."""
    agents = ["| agent | ids | minutes in all | median per id | longest (minutes) |",
              "|---|---:|---:|---:|---|"]  # fmt: skip
    experiments = ["| agent | experiment | ids | minutes in all | machines | commits |",
                   "|---|---|---:|---:|---|---|"]  # fmt: skip
    for name, d in zip(names, dirs, strict=True):
        runs = [(read_json(c.parent.parent / "summary.json"),
                 read_json(c.parent.parent / "config.json")) for c in finished_csvs(d)]  # fmt: skip
        minutes = [summary["wall_time_s"] / 60 for summary, _ in runs]
        longest = max(range(len(runs)), key=minutes.__getitem__)
        agents.append(f"| {name} | {len(runs)} | {sum(minutes):,.1f} | {np.median(minutes):.1f} "
                      f"| {minutes[longest]:.1f} (`{runs[longest][0]['env']}`) |")  # fmt: skip
        by_experiment: dict[str, list[int]] = {}
        for k, (summary, _) in enumerate(runs):
            by_experiment.setdefault(summary["env"].split("/")[1], []).append(k)
        for experiment, ks in sorted(by_experiment.items()):
            machines = sorted({runs[k][0]["machine"]["cpu"] for k in ks})
            commits = sorted({_short(r["machine"]["commit"]) for k in ks for r in runs[k]})
            experiments.append(f"| {name} | {experiment} | {len(ks)} | "
                               f"{sum(minutes[k] for k in ks):.1f} | {', '.join(machines)} | "
                               f"{', '.join(commits)} |")  # fmt: skip
    return "\n".join(agents) + "\n\n" + "\n".join(experiments) + "\n"


def _short(commit: str | None) -> str:
    """``8724b21`` for a 40-digit commit, ``8724b21-dirty`` for one with edits under way; a run
    of an installed rlherd (not a git checkout) records none."""
    return "none (not a git checkout)" if commit is None else commit[:7] + commit[40:]


def markdown(table: Any) -> str:
    """A scores table (experiments by agents) as Markdown."""
    lines = ["| experiment | " + " | ".join(table.columns) + " |",
             "|---|" + "---:|" * len(table.columns)]  # fmt: skip
    for name, row in table.iterrows():
        lines.append(f"| {name} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------- CLI
def command(args: Any, overrides: dict[str, Any]) -> int:
    """``rlherd bsuite``: sweep, print each id's outcome, and say how to score the sweep."""
    env_ids = select(args.experiments, args.ids)
    own = inspect.signature(sweep).parameters
    for key in overrides:  # sweep's own arguments, which its flags give (--seed, --jobs, ...)
        if key in own and own[key].kind != inspect.Parameter.VAR_KEYWORD:
            raise ConfigError(f"--set {key}: not an agent field or runtime setting but the "
                              "sweep's own option; give its flag instead (rlherd bsuite --help)")
    kwargs = dict(overrides)
    if args.total_episodes is not None:
        kwargs["total_episodes"] = args.total_episodes
    if args.preset is not None:
        kwargs["preset"] = args.preset
    result, done = sweep(args.agent, env_ids, args.out, args.jobs, not args.no_progress,
                         args.seed, args.until_solved, args.kept, **kwargs)  # fmt: skip
    names = dict(enumerate(env_ids))  # the group's runs are numbered by their place here
    for run in result.runs:
        print(json.dumps({"env": run.config.env, "run_dir": str(run.path), **run.summary}))
    for k, line in result.failed.items():
        print(f"rlherd: error: {names[k]} failed: {line} (output: "
              f"{run_path(Path(args.out), names[k])}.log)", file=sys.stderr)  # fmt: skip
    if done:
        print(f"{len(done)} of {len(env_ids)} ids were finished already and kept", file=sys.stderr)
    if result.stopped:
        print(f"rlherd: interrupted; the same command continues the sweep in {args.out}",
              file=sys.stderr)  # fmt: skip
        return 128 + result.signal
    if result.failed:
        return 1
    print(f"bsuite CSVs: {Path(args.out) / CSV_DIR}; score the sweep with `rlherd bsuite-report "
          f"{args.out} -o report`", file=sys.stderr)  # fmt: skip
    return 0


def report_command(args: Any) -> int:
    scored = report(args.dirs, args.output)
    for note in notes(args.dirs) + radar_gaps(scored.categories):
        print(f"rlherd: note: {note}", file=sys.stderr)
    print(markdown(scored.experiments), end="")
    print(f"written: {Path(args.output) / 'radar.png'}, bars.png, scores.csv, categories.csv, "
          "scores.md, runs.md", file=sys.stderr)  # fmt: skip
    return 0
