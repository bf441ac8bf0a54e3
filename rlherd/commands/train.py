"""``rlherd.train``: the Python API behind ``rlherd train``."""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import itertools
import multiprocessing
import shutil
import signal
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.agents.groups import for_policies
from rlherd.commands.evaluate import builder_of, run_spec
from rlherd.config import apply_overrides, as_type, check_seed, to_json
from rlherd.envs.bsuite import RESULTS, RUN_OPTIONS, STEP_BOUND, episode_budget
from rlherd.errors import ConfigError, Notice
from rlherd.replay.demonstrations import check_source
from rlherd.run.callbacks import Callbacks, RunInfo, check_callbacks
from rlherd.run.evaluation import Evaluator, Snapshots
from rlherd.run.package import is_package
from rlherd.run.provenance import machine
from rlherd.run.recorder import Recorder
from rlherd.run.rundir import RunDir, RunRecord, check_given, check_parts, fitting, make_folder
from rlherd.run.tracking import trackers
from rlherd.runtime import (
    RUNTIMES,
    GracefulStop,
    RunContext,
    runtimes_for,
    seed_everything,
    torch_threads,
)
from rlherd.runtime import settings as settings_mod


class ObservationNotice(Notice):
    """Part of an environment's observation is left out (it is not an array)."""


class BudgetNotice(Notice):
    """A run's budget ends before its learner's first step."""


def learning_starts_notice(agent: str, config: Any, runtime: str, settings: Any,
                           total_steps: int) -> str | None:  # fmt: skip
    """What to say of a replay agent's run that acts for no more steps than its replay must
    hold before the learner's first step (``min_replay_size``; TD3's 25,000 on a 20,000-step
    Control Suite run, say): it would end as it began, acting only to fill replay, and its
    summary and evaluations would read as a trained policy's. None where the learner steps,
    learns from a dataset (offline), or has demonstrations to start from."""
    start = getattr(config, "min_replay_size", None)
    acting = "acting" in RUNTIMES[runtime].provides
    demonstrations = getattr(settings, "demonstrations", "")
    if BUILDERS[agent].dataflow != "replay" or start is None or not acting or demonstrations:
        return None
    if total_steps > start:
        return None
    return (f"{agent} learns once {start:,} transitions are in replay (min_replay_size), and "
            f"this run acts for {total_steps:,} steps: its learner would never step; raise "
            f"--total-steps above {start:,} or lower it with --set min_replay_size=N")


@dataclass
class Run:
    """A finished (or stopped) run: its directory, its record (agent, env, runtime, seed,
    config and settings) and summary; ``stopped`` when Ctrl-C or SIGTERM ended it early (a
    script running several should stop too)."""

    path: Path
    config: RunRecord
    summary: dict[str, Any]
    stopped: bool = False
    signal: int = 0  # the signal that stopped it (SIGINT, SIGTERM), 0 if none
    finished_before: bool = False  # a resumed run that had already finished: nothing was done

    @property
    def steps(self) -> int:
        """The steps the run has counted, in its runtime's unit (offline: learner steps)."""
        return int(self.summary.get(RUNTIMES[self.config.runtime].counts, 0))


def resolve_config(agent: str, env: str, preset: str | None, overrides: dict[str, Any]):
    """The agent's config (defaults, then the preset, then ``overrides``) and the preset."""
    if agent not in BUILDERS:
        raise ConfigError(f"unknown agent {agent!r}; available: {', '.join(sorted(BUILDERS))}")
    builder = BUILDERS[agent]
    preset = preset or builder.preset_for(env)
    if preset not in builder.presets:
        known = ", ".join(sorted(builder.presets))
        raise ConfigError(f"unknown preset {preset!r} for {agent}; available: {known}")
    config = apply_overrides(builder.config_class(), builder.presets[preset])
    return apply_overrides(config, overrides), preset


def check_runtime(agent: str, runtime: str) -> None:
    """An agent runs on every runtime that provides the capabilities its builder needs (its
    dataflow, and more where it says why); anything else fails here."""
    if runtime not in RUNTIMES:
        raise ConfigError(f"unknown runtime {runtime!r}; available: {', '.join(RUNTIMES)}")
    builder, declared = BUILDERS[agent], RUNTIMES[runtime]
    allowed = runtimes_for(builder.needs)
    if builder.dataflow not in declared.provides:
        why = declared.why_not
        raise ConfigError(
            f"{agent} is a {builder.dataflow} agent and the {runtime} runtime runs "
            f"{' and '.join(declared.dataflows)} agents only"
            f"{f' ({why})' if why else ''}. {agent} runs on: {', '.join(allowed)}"
        )
    if runtime not in allowed:
        raise ConfigError(
            f"{agent} does not run on the {runtime} runtime ({builder.why_not}); it runs on: "
            f"{', '.join(allowed)}"
        )


def environment_needs(env_id: str) -> frozenset[str]:
    """What a runtime must provide to train on ``env_id``, beyond what the agent needs: a
    PettingZoo game needs one that steps multi-agent games, a turn-based one self-play too."""
    if rl_envs.turn_based(env_id):
        return frozenset({"gym_envs", "multi_agent", "self_play"})
    if rl_envs.family(env_id) == "pettingzoo":
        return frozenset({"gym_envs", "multi_agent"})
    return frozenset({"gym_envs"})


def check_environment(agent: str, env_id: str, runtime: str) -> None:
    """Refuse a multi-agent game on a runtime that does not step them (a turn-based one where
    actors cannot play their past selves), naming those that do."""
    missing = environment_needs(env_id) - RUNTIMES[runtime].provides
    if missing & {"multi_agent", "self_play"}:
        able = runtimes_for(BUILDERS[agent].needs | environment_needs(env_id))
        where = f"{agent} trains it on: {', '.join(able)}" if able else "no runtime trains it"
        kind = "a turn-based game played by self-play" if "self_play" in missing else (
            "a multi-agent game")  # fmt: skip
        raise ConfigError(f"{env_id} is {kind}, which the {runtime} runtime does not step; "
                          f"{where}")  # fmt: skip


def check_pairing(agent: str, env: str, runtime: str, config: Any, preset: str,
                  given: dict[str, Any], env_kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """A new run's checks before its environment is made (``rlherd check-env`` makes the same
    ones, so it cannot promise what ``train`` refuses): the runtime runs the agent and steps
    the environment, a two-player OpenSpiel game is played by MCTS's self-play, a bsuite id on
    the single runtime; and the runtime's settings (its defaults, the agent's preset's
    ``suggested`` ones, the ``given`` ones), which it returns."""
    check_runtime(agent, runtime)
    check_environment(agent, env, runtime)
    if rl_envs.family(env) == "openspiel" and not getattr(config, "two_player", False):
        rl_envs.check_id(env)  # a game OpenSpiel does not have is named as such first
        raise ConfigError(
            f"{env} is a two-player game, played by self-play with values negated between "
            "players; train it with mcts (its openspiel preset sets two_player=True)"
        )
    suggested = BUILDERS[agent].runtime_defaults.get(preset, {})
    if rl_envs.family(env) == "bsuite":
        given = _bsuite_settings(env, runtime, given, env_kwargs)
    return settings_mod.resolve(runtime, suggested, given, BUILDERS[agent].dataflow)


def checked_builder(agent: str, config: Any, spec: Any, runtime: str, settings: Any,
                    env: str, env_kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """The run's builder (one per policy of a game), once its networks are built for the
    environment's ``spec``, the runtime has accepted it with ``settings`` and the
    demonstrations a replay agent mixes in can be had: the checks a run makes once its spec is
    known, before its directory is made (``rlherd check-env`` makes them too)."""
    demonstrations = getattr(settings, "demonstrations", "")
    builder = for_policies(BUILDERS[agent](config), spec, settings.policy_overrides,
                           demonstrations)  # fmt: skip
    if spec is not None:  # None: the device runtime's own game, whose networks it builds
        builder.make_networks(spec)  # spaces its networks cannot read
    RUNTIMES[runtime].check(builder, settings)
    if demonstrations and builder.dataflow == "replay":
        check_source(demonstrations, env, env_kwargs)
    return builder


def default_runtime(agent: str, env: str, given: dict[str, Any]) -> str:
    """``single`` (the registry's first runtime), unless the runtime settings ``given`` belong
    to one runtime only among those that run ``agent`` on ``env``: ``--dataset ID`` alone trains
    offline, ``--ray-address`` alone on ``distributed``. Settings that several have
    (``--num-actors``) choose none."""
    able = runtimes_for(BUILDERS[agent].needs | environment_needs(env))
    takes = [name for name in able if set(given) <= settings_mod.names(RUNTIMES[name].settings)]
    return takes[0] if given and len(takes) == 1 else next(iter(RUNTIMES))


def _bsuite_settings(env: str, runtime: str, given: dict[str, Any],
                     env_kwargs: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """A bsuite id's run as bsuite counts it: one environment, whose episodes bsuite's CSV
    logger counts (:mod:`rlherd.envs.bsuite`), on the single runtime, for bsuite's episode
    budget unless ``total_episodes`` is given."""
    why = "bsuite counts each id's episodes, and writes its CSV, in one environment"
    if runtime != "single":
        raise ConfigError(f"{env}: {why}; train it on the single runtime (drop --runtime)")
    if given.get("num_envs", 1) != 1:
        raise ConfigError(f"{env}: {why}; drop --num-envs")
    if given.get("env_workers", 0):  # its snapshot, which carries the CSV's logger, is not saved
        raise ConfigError(f"{env}: {why}, in this process, for its checkpoints to keep the "
                          "logger; drop --env-workers")  # fmt: skip
    if RUN_OPTIONS & set(env_kwargs):
        raise ConfigError(f"{env}: the run writes bsuite's CSV in its own {RESULTS}/ folder; "
                          "drop results_dir and overwrite from --env-kwargs")  # fmt: skip
    return {"num_envs": 1, "total_episodes": episode_budget(env), **given}


def default_run_dir(agent: str, env: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    name = env.split(":")[-1].replace("/", "_")  # an id, without the module that registers it
    return Path("runs") / f"{agent}-{name}-{stamp}"


def fresh_run_dir(agent: str, env: str) -> Path:
    """A new ``runs/<agent>-<env>-<time>/`` folder that no other run has taken, even one
    started in the same second (``mkdir`` decides atomically; ``-2``, ``-3``, ... after)."""
    base = default_run_dir(agent, env)
    for i in itertools.count(1):
        path = base if i == 1 else base.with_name(f"{base.name}-{i}")
        with contextlib.suppress(FileExistsError):
            path.mkdir(parents=True)
            return path
    raise AssertionError("unreachable")  # itertools.count never ends


def _new_run_dir(run_dir: str | Path | None, agent: str, env: str, overwrite: bool) -> RunDir:
    """The directory of a new run: the one given (refused if it holds a run, unless
    ``overwrite``), or a new one under ``runs/`` that no other run has taken, even one started
    in the same second (``mkdir`` decides atomically)."""
    if run_dir is None:
        return RunDir(fresh_run_dir(agent, env), create=True)
    path = Path(run_dir)
    if (path / "config.json").exists() and not overwrite and _never_checkpointed(path):
        warnings.warn(f"replacing the run in {path}, which stopped before its first checkpoint",
                      Notice, stacklevel=3)  # fmt: skip
        overwrite = True
    if (path / "config.json").exists():
        if not overwrite:
            raise ConfigError(
                f"{path} already holds a run; continue it with --resume {path}, or replace it "
                "with --overwrite"
            )
        shutil.rmtree(path)
    elif path.is_dir() and any(path.iterdir()):
        raise ConfigError(f"{path} is not empty and holds no run; choose a new or empty --run-dir")
    return RunDir(make_folder(path, "--run-dir"), create=True)


def _counted(checkpoint: dict[str, Any], runtime: str) -> int:
    """The steps a checkpointed run had counted, in its runtime's unit."""
    return int(checkpoint["recorder"]["counters"].get(RUNTIMES[runtime].counts, 0))


def _never_checkpointed(path: Path) -> bool:
    """Whether the run in ``path`` ended (no process holds it) before its first checkpoint: a
    start that crashed, which holds nothing to keep."""
    rundir = RunDir(path)
    rundir.lock()  # in use: refused here, with the reason
    rundir.unlock()
    return not any(rundir.checkpoint_dir.glob("ckpt-*.pt"))


def split_overrides(agent: str, overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(agent fields, runtime settings)`` of ``rlherd.train``'s keyword overrides; a key that
    is neither fails here, with the closest names of both kinds."""
    if agent not in BUILDERS:
        raise ConfigError(f"unknown agent {agent!r}; available: {', '.join(sorted(BUILDERS))}")
    runtime_names = set(settings_mod.all_fields())
    agent_names = {f.name for f in dataclasses.fields(BUILDERS[agent].config_class)}
    for key in sorted(set(overrides) - runtime_names - agent_names):
        close = difflib.get_close_matches(key, sorted(runtime_names | agent_names), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise ConfigError(
            f"{key!r} is neither a field of {agent}'s config nor a runtime setting{hint} "
            f"(see rlherd train --help and rlherd/agents/{agent}/config.py)"
        )
    runtime = {k: v for k, v in overrides.items() if k in runtime_names}
    return {k: v for k, v in overrides.items() if k not in runtime_names}, runtime


def train(
    agent: str | None = None,
    env: str | Callable[..., Any] | None = None,
    *,
    runtime: str | None = None,
    total_steps: int | None = None,
    seed: int | None = None,
    run_dir: str | Path | None = None,
    resume: str | Path | None = None,
    preset: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
    eval_every: int | None = None,
    eval_episodes: int | None = None,
    progress: bool = True,
    overwrite: bool = False,
    callbacks: Iterable[Any] = (),
    track: str = "",
    track_project: str = "rlherd",
    track_uri: str | None = None,
    **overrides: Any,
) -> Run:
    """Train ``agent`` on ``env`` with ``runtime`` and return the :class:`Run`.

    Left out, they are IMPALA, CartPole-v1, ``single`` and seed 0. ``env`` is any id
    :func:`rlherd.envs.make` takes, or an environment factory (a module-level function returning
    a ``gymnasium.Env``), which the run records by its import path so that every process (and a
    later ``eval`` or ``--resume``) can make it. Keyword ``overrides`` set
    agent config fields or runtime settings (:mod:`rlherd.runtime.settings`; strings are parsed
    like ``--set``). A ``dataset`` (a Minari dataset id) trains offline: the ``offline`` runtime,
    where ``total_steps`` counts learner steps and the policy is evaluated every ``eval_every``
    of them (a tenth of the run unless set). ``eval_every > 0`` runs the greedy policy for
    ``eval_episodes`` (10) episodes every ``eval_every`` agent steps, and at the end of a run
    whose budget is no multiple of it, so that the last is the final policy's
    (metrics/evaluator.csv);
    ``eval_episodes`` alone evaluates once, at the end of the run. A
    ``run_dir`` that already holds a run is refused unless ``overwrite`` (which deletes that run
    first).

    With ``resume``, the run continues from its latest checkpoint with its own agent, env,
    runtime, seed, config and settings: giving a different one is an error (a silently ignored
    flag would train something other than what the command says). ``total_steps`` may raise
    the run's length, and ``eval_every`` / ``eval_episodes`` change its evaluations, which
    never touch training's random streams.

    ``callbacks`` (:mod:`rlherd.run.callbacks`) hear the run's start, logs, evaluations,
    checkpoints and end, and may stop it; ``track`` names experiment trackers to log to
    (``"wandb"``, ``"mlflow"`` or both, comma-separated; :mod:`rlherd.run.tracking`), with
    ``track_project`` as the W&B project or MLflow experiment and ``track_uri`` as MLflow's
    tracking URI. Neither is part of the run's record: a resumed run takes them anew.
    """
    _refuse_while_a_child_imports_the_script()
    check_given(run_dir, "--run-dir")
    callbacks = [*callbacks, *trackers(track, track_project, track_uri)]  # checked below
    rundir, checkpoint = None, None
    if resume is not None:
        given = dict(preset=preset, env_kwargs=env_kwargs, overwrite=overwrite, agent=agent,
                     env=env, runtime=runtime, seed=seed, run_dir=run_dir)  # fmt: skip
        rundir, record, config, settings = _resumed(resume, overrides, given, total_steps,
                                                    eval_every, eval_episodes)  # fmt: skip
        checkpoint = rundir.load_checkpoint()
        check_parts(checkpoint, rundir.loaded)
    else:
        record, config, settings = _new_record(agent, env, runtime, seed, preset, env_kwargs,
                                               total_steps, eval_every, eval_episodes,
                                               overrides)  # fmt: skip
    agent, runtime = record.agent, record.runtime
    record = dataclasses.replace(record, **{name: as_type(name, getattr(record, name), int)
                                            for name in ("total_steps", "eval_every",
                                                         "eval_episodes")})  # fmt: skip
    if record.total_steps <= 0:
        raise ConfigError(f"total_steps must be positive, got {record.total_steps}")
    settings_mod.at_least_zero(record, "eval_every")
    settings_mod.at_least_one(record, "eval_episodes")
    check_callbacks(callbacks, record.eval_every, record.total_steps)
    if checkpoint is not None and _counted(checkpoint, runtime) >= record.total_steps:
        rundir.unlock()
        return Run(rundir.path, record, rundir.read_summary(), finished_before=True)
    # Fail fast on a bad id, option or pairing, before any directory is made.
    spec = _spec(record)
    notice = rl_envs.dropped_notice(spec) if spec is not None and resume is None else None
    if notice:
        warnings.warn(notice, ObservationNotice, stacklevel=2)
    builder = checked_builder(agent, config, spec, runtime, settings, record.env,
                              record.env_kwargs)  # fmt: skip
    budget = learning_starts_notice(agent, config, runtime, settings, record.total_steps)
    if budget:  # of a run that can start: not before a refusal that would stop it
        warnings.warn(budget, BudgetNotice, stacklevel=2)
    if rundir is None:
        rundir = _new_run_dir(run_dir, agent, record.env, overwrite)
        rundir.lock()
    rundir.write_config(record)
    try:
        return _run(record, builder, settings, spec, rundir, checkpoint, progress, callbacks)
    except ConfigError:
        # Found by the runtime before anything was trained: leave no half-made run behind,
        # which would refuse the corrected command's --run-dir.
        if resume is None and rundir.latest_checkpoint() is None:
            shutil.rmtree(rundir.path, ignore_errors=True)
        raise
    finally:
        rundir.unlock()


def _resumed(resume: str | Path, overrides: dict[str, Any], given: dict[str, Any],
             total_steps: int | None, eval_every: int | None,
             eval_episodes: int | None) -> tuple[RunDir, RunRecord, Any, Any]:  # fmt: skip
    """The run in ``resume`` (locked), its record with the changes ``--resume`` may make (the
    run's length, its evaluations, the machine's own settings), its config and its settings.
    ``given``: the other flags of the command, each refused unless the run's own."""
    if is_package(resume):
        raise ConfigError(f"{resume} is a package (rlherd package): a policy to share, not a "
                          f"run to continue; train it again with --config "
                          f"{Path(resume) / 'config.json'}")  # fmt: skip
    rundir = RunDir(resume)
    rundir.refuse_copy()  # before its lock is taken: nothing is written in a copy
    record = rundir.read_config()
    _check_resume_flags(record, overrides, **given, resume=rundir.path.resolve())
    config = builder_of(record, rundir.path).config
    if record.runtime not in RUNTIMES:
        raise ConfigError(f"{rundir.path / 'config.json'} names runtime {record.runtime!r}, "
                          f"which this rlherd does not have ({', '.join(RUNTIMES)})")  # fmt: skip
    here = {k: v for k, v in overrides.items() if k in settings_mod.MACHINE_SETTINGS}
    settings = settings_mod.resolve(record.runtime, {}, {**record.settings, **here})
    total_steps = record.total_steps if total_steps is None else total_steps
    if eval_every is not None:  # 0 offline: a tenth of the run, as for a new one
        eval_every = eval_every or _default_eval_every(record.runtime, total_steps, False)
    else:
        eval_every = _resumed_eval_every(record, total_steps, eval_episodes is not None)
    record = dataclasses.replace(
        record, total_steps=total_steps,
        settings={**record.settings, **{k: getattr(settings, k) for k in here}},
        eval_every=eval_every,
        eval_episodes=record.eval_episodes if eval_episodes is None else eval_episodes)
    rundir.lock()
    rundir.read_summary()  # damaged: one line now, not after training
    return rundir, record, config, settings


def _new_record(agent: str | None, env: str | Callable[..., Any] | None, runtime: str | None,
                seed: int | None, preset: str | None, env_kwargs: dict[str, Any] | None,
                total_steps: int | None, eval_every: int | None, eval_episodes: int | None,
                overrides: dict[str, Any]) -> tuple[RunRecord, Any, Any]:  # fmt: skip
    """A new run's record, config and settings: what was given, the rest from the defaults
    (IMPALA, CartPole-v1, the agent's runtime and preset for the environment, seed 0), checked
    before any directory is made."""
    agent, env = agent or "impala", rl_envs.resolve(env or "CartPole-v1")
    seed = 0 if seed is None else check_seed(seed)
    if env_kwargs is not None and not isinstance(env_kwargs, dict):
        raise ConfigError(f"env_kwargs must be a dict of the environment's options, got "
                          f"{env_kwargs!r}")  # fmt: skip
    eval_episodes_given = eval_episodes is not None
    eval_episodes = 10 if eval_episodes is None else eval_episodes
    agent_overrides, given = split_overrides(agent, overrides)
    runtime = runtime or default_runtime(agent, env, given)
    config, preset = resolve_config(agent, env, preset, agent_overrides)
    settings = check_pairing(agent, env, runtime, config, preset, given, env_kwargs or {})
    bsuite = rl_envs.family(env) == "bsuite"
    if total_steps is None:
        total_steps = STEP_BOUND if bsuite else BUILDERS[agent].default_total_steps[preset]
    eval_every = eval_every or _default_eval_every(runtime, total_steps, eval_episodes_given)
    record = RunRecord(agent=agent, env=env, runtime=runtime, seed=seed,
                       total_steps=total_steps, preset=preset, env_kwargs=env_kwargs or {},
                       eval_every=eval_every, eval_episodes=eval_episodes,
                       config=to_json(config), settings=to_json(settings),
                       machine=machine())  # fmt: skip
    return record, config, settings


def _refuse_while_a_child_imports_the_script() -> None:
    """A process that ``mono`` or ``env_workers`` starts imports the user's script first (as
    ``__mp_main__``), so a script with no ``if __name__ == '__main__':`` guard calls ``train``
    again in every child: each ran the script's earlier runs in full before its own failure was
    seen. ``_inheriting`` is the flag multiprocessing itself reads to refuse a process started
    while it is set."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ConfigError(
            "rlherd.train was called while a child process imported the script: guard the "
            "script's calls with `if __name__ == '__main__':` (each actor or environment "
            "worker process imports it)"
        )


def train_to(agent: str, env: str, run_dir: str | Path, total_steps: int, seed: int = 0,
             progress: bool = True, runtime: str = "single", eval_every: int | None = None,
             eval_episodes: int | None = None, settings: dict[str, Any] | None = None,
             env_kwargs: dict[str, Any] | None = None) -> Run:  # fmt: skip
    """The run of ``agent`` on ``env`` (made with ``env_kwargs``) with its default preset (and
    the runtime ``settings`` given), ``total_steps`` long, on ``runtime``, in ``run_dir``: a
    finished one there (as long or longer) is left as it is, one stopped on its way there
    (Ctrl-C, SIGTERM) continues from its latest checkpoint, and anything else (no checkpoint,
    another length, runtime, seed, config, setting or environment option, say an older
    preset's) is trained again from the start. A run of hours can so go in pieces: stop it and
    call again. The benchmarks train this way."""
    path, env, settings = Path(run_dir), rl_envs.resolve(env), settings or {}
    env_kwargs = env_kwargs or {}
    config, _ = resolve_config(agent, env, None, {})
    if (path / "config.json").exists() and RunDir(path).latest_checkpoint() is not None:
        record = RunDir(path).read_config()
        same = (record.agent, record.env, record.runtime, record.seed, record.env_kwargs) == (
            agent, env, runtime, seed, env_kwargs) and _same_config(record, config) and all(
            record.settings.get(k) == v for k, v in settings.items())  # fmt: skip
        summary = RunDir(path).read_summary()
        done = summary.get(RUNTIMES[record.runtime].counts, 0)
        if same and done >= total_steps:
            return Run(path, record, summary)
        if same and record.total_steps == total_steps:
            return train(resume=path, progress=progress)
    return train(agent, env, runtime=runtime, total_steps=total_steps, seed=seed, run_dir=path,
                 overwrite=True, progress=progress, eval_every=eval_every,
                 eval_episodes=eval_episodes, env_kwargs=env_kwargs, **settings)  # fmt: skip


def _same_config(record: RunRecord, config: Any) -> bool:
    """Whether a run's recorded config is ``config``; an older run's lacks the fields added
    since, which count as their defaults."""
    try:
        recorded = apply_overrides(type(config)(), record.config)
    except ConfigError:  # a field since removed or renamed
        return False
    return to_json(recorded) == to_json(config)


def _default_eval_every(runtime: str, total_steps: int, eval_episodes_given: bool) -> int:
    """Where the learner learns from no acting of the run's own (offline), evaluations are all
    a run says of itself: a tenth of the run unless set. Elsewhere none unless set, but a run
    given a number of evaluation episodes alone evaluates once, at its end (asked for episodes,
    a silent run without any would answer nothing)."""
    if "acting" not in RUNTIMES[runtime].provides:
        return max(1, total_steps // 10)
    return total_steps if eval_episodes_given else 0


def _resumed_eval_every(record: RunRecord, total_steps: int, eval_episodes_given: bool) -> int:
    """A resumed run's evaluation period where ``--eval-every`` is not given: the run's own,
    except that ``--eval-episodes`` given alone to a run that never evaluates evaluates once,
    at its end, as it does for a new run (the run's own period of 0 would ignore the flag)."""
    if record.eval_every == 0 and eval_episodes_given:
        return _default_eval_every(record.runtime, total_steps, True)
    return record.eval_every


def _check_resume_flags(record: RunRecord, overrides: dict[str, Any], **given: Any) -> None:
    """Refuse what ``--resume`` cannot honour: config and settings changes (but for the
    machine's own: ``MACHINE_SETTINGS``), another run directory, and an agent, env, runtime or
    seed other than the run's own (left out, they are the run's)."""
    def flag(name: str) -> str:
        return f"--{name.replace('_', '-')}"

    settings = settings_mod.all_fields()
    changed = [flag(k) for k in ("preset", "env_kwargs", "overwrite") if given[k]]
    changed += sorted(flag(k) if k in settings else f"--set {k}" for k in overrides
                      if k not in settings_mod.MACHINE_SETTINGS)  # fmt: skip
    if given["run_dir"] is not None and Path(given["run_dir"]).resolve() != given["resume"]:
        changed.append("--run-dir (--resume names the run directory)")
    if changed:
        raise ConfigError(
            f"--resume continues a run with its own config and settings; drop {', '.join(changed)}"
            " (or start a new run with them)"
        )
    for name in ("agent", "env", "runtime", "seed"):
        recorded = getattr(record, name)
        if name == "env" and isinstance(given[name], str) and recorded.endswith(f":{given[name]}"):
            continue  # the id as given, recorded with the module that registers it
        if given[name] is not None and given[name] != recorded:
            raise ConfigError(
                f"--resume continues the run as it was started ({name} {recorded!r}); drop "
                f"{'the agent' if name == 'agent' else flag(name)} {given[name]!r}, or start a "
                "new run with it"
            )


def _spec(record: RunRecord):
    """The environment's spec, made from its id; a runtime that makes no Gymnasium
    environments (``device``) checks the id itself (:func:`own_game`), and its runs have no
    spec here."""
    if "gym_envs" in RUNTIMES[record.runtime].provides:
        return run_spec(record)
    return own_game(record.runtime, record.env, record.env_kwargs, record.eval_every)


def own_game(runtime: str, env: str, env_kwargs: dict[str, Any], eval_every: int = 0) -> Any:
    """Refuse ``env`` (with its options) on a ``runtime`` that makes no Gymnasium
    environments unless it is one of the runtime's own games: its ``spec(record)`` says (and
    returns the spec a run has before it starts: the device's, None)."""
    declared = RUNTIMES[runtime]
    check = declared.hook("spec")
    if check is None:
        raise ConfigError(f"the {runtime} runtime makes no Gymnasium environments, and "
                          f"{declared.module} has no spec(record) to check the run's")  # fmt: skip
    return check(RunRecord(agent="", env=env, runtime=runtime, seed=0, total_steps=0,
                           env_kwargs=env_kwargs, eval_every=eval_every, eval_episodes=0,
                           config={}, settings={}))  # fmt: skip


def _run(record: RunRecord, builder, settings, spec, rundir, checkpoint, progress,
         callbacks: list[Any]) -> Run:  # fmt: skip
    torch_threads(settings.torch_threads)  # before the summary's machine reads the count
    recorder = Recorder(
        rundir,
        # machine: where this session runs (config.json has where the run started)
        dict(agent=record.agent, env=record.env, runtime=record.runtime, machine=machine()),
        record.total_steps,
        progress=progress,
        log_interval_s=settings.log_interval_s,
        checkpoint_interval_s=settings.checkpoint_interval_s,
        counts=RUNTIMES[record.runtime].counts,
        total_episodes=settings.total_episodes,
    )
    if spec is not None and spec.policies:  # (the device runtime, without a spec, opens its own)
        recorder.open_windows(spec.policies)
    if checkpoint is not None:
        with fitting(rundir.loaded):
            recorder.load_state_dict(checkpoint["recorder"])
        rundir.truncate_metrics(int(recorder.counters[recorder.counts]), recorder.counts)
    else:
        seed_everything(record.seed)

    def save(state: dict[str, Any]) -> Path:
        return rundir.save_checkpoint(state, int(recorder.counters["learner_steps"]))

    evaluator = None
    if record.eval_every > 0:
        evaluator = Evaluator(builder, spec, record.env, record.env_kwargs, recorder,
                              record.eval_every, record.eval_episodes)  # fmt: skip
    snapshots = None
    if rl_envs.turn_based(record.env):
        snapshots = Snapshots(recorder, settings.opponent_every)
    graceful = GracefulStop()
    with graceful as stop:
        hooks = recorder.callbacks = Callbacks(callbacks, stop)
        ctx = RunContext(builder, record.env, record.env_kwargs, spec, settings, recorder,
                         record.seed, checkpoint, save, stop, evaluator, snapshots,
                         rundir.loaded)  # fmt: skip
        try:
            hooks.on_start(RunInfo(rundir.path, dataclasses.asdict(record),
                                   resumed=checkpoint is not None, counts=recorder.counts))
            RUNTIMES[record.runtime].run(ctx)
        except BaseException as e:
            recorder.meta["error"] = f"{type(e).__name__}: {e}"[:500]
            raise
        finally:
            if evaluator is not None:
                evaluator.close()
            stopped_by = hooks.stopped_by or (
                signal.Signals(graceful.signum).name if graceful.signum else None)
            if stopped_by is not None:
                recorder.meta["stopped_by"] = stopped_by
            summary = recorder.close()
            _last_words(hooks, summary, recorder)
    return Run(rundir.path, record, summary, stopped=graceful.signum != 0, signal=graceful.signum)


def _last_words(hooks: Callbacks, summary: dict[str, Any], recorder: Recorder) -> None:
    """The callbacks' last ``on_log`` (the final learner row and summary; not after a failure,
    which may be theirs) and their ``on_end``, which they hear whatever happens."""
    try:
        if "error" not in recorder.meta:
            hooks.on_log({**summary, **recorder.last_metrics})
    finally:
        hooks.on_end(summary)


__all__ = ["Run", "train", "train_to", "resolve_config"]
