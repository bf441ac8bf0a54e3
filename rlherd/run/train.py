"""``rlherd.train``: the Python API behind ``rlherd train``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.run.config import ConfigError, apply_overrides, to_json
from rlherd.run.evaluate import Evaluator
from rlherd.run.recorder import Recorder
from rlherd.run.rundir import RunDir
from rlherd.runtime import RUNTIMES, GracefulStop, seed_everything


@dataclass
class Run:
    """A finished (or stopped) run: its directory, resolved config and summary."""

    path: Path
    config: dict[str, Any]
    summary: dict[str, Any]


def resolve_config(agent: str, env: str, preset: str | None, overrides: dict[str, Any]):
    if agent not in BUILDERS:
        raise ConfigError(f"unknown agent {agent!r}; available: {', '.join(sorted(BUILDERS))}")
    builder = BUILDERS[agent]
    preset = preset or builder.preset_for(env)
    if preset not in builder.presets:
        known = ", ".join(sorted(builder.presets))
        raise ConfigError(f"unknown preset {preset!r} for {agent}; available: {known}")
    config = apply_overrides(builder.config_class(), builder.presets[preset])
    return apply_overrides(config, overrides), preset


def default_run_dir(agent: str, env: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{agent}-{env.replace('/', '_')}-{stamp}"


def train(
    agent: str = "impala",
    env: str = "CartPole-v1",
    *,
    runtime: str = "single",
    total_steps: int | None = None,
    seed: int = 0,
    run_dir: str | Path | None = None,
    resume: str | Path | None = None,
    preset: str | None = None,
    env_kwargs: dict[str, Any] | None = None,
    eval_every: int = 0,
    eval_episodes: int = 10,
    progress: bool = True,
    **overrides: Any,
) -> Run:
    """Train ``agent`` on ``env`` and return the :class:`Run`.

    Keyword ``overrides`` set config fields (strings are parsed like ``--set``). With ``resume``,
    the run directory's own config is used and the run continues from its latest checkpoint;
    ``total_steps`` may be raised to extend it. ``eval_every > 0`` runs the greedy policy for
    ``eval_episodes`` episodes every ``eval_every`` agent steps (metrics/evaluator.csv).
    """
    if resume is not None:
        rundir = RunDir(resume)
        meta = rundir.read_config()
        if overrides or preset or env_kwargs:
            raise ConfigError("--resume continues a run with its own config; drop --set/--preset")
        agent, env, runtime, seed = meta["agent"], meta["env"], meta["runtime"], meta["seed"]
        eval_every, eval_episodes = meta["eval_every"], meta["eval_episodes"]
        config = apply_overrides(BUILDERS[agent].config_class(), meta["config"])
        env_kwargs = meta["env_kwargs"]
        total_steps = total_steps or meta["total_steps"]
        checkpoint = rundir.load_checkpoint()
    else:
        config, preset = resolve_config(agent, env, preset, overrides)
        env_kwargs = env_kwargs or {}
        total_steps = total_steps or BUILDERS[agent].default_total_steps[preset]
        checkpoint = None
    if runtime not in RUNTIMES:
        raise ConfigError(f"unknown runtime {runtime!r}; available: {', '.join(RUNTIMES)}")
    if runtime not in BUILDERS[agent].runtimes:
        runs_on = ", ".join(BUILDERS[agent].runtimes)
        raise ConfigError(
            f"{agent} runs on the {runs_on} runtime(s), not {runtime}. Use --runtime "
            f"{BUILDERS[agent].runtimes[0]}"
        )
    if total_steps <= 0:
        raise ConfigError(f"total_steps must be positive, got {total_steps}")

    if runtime == "device":
        from rlherd.envs.device import make_device

        make_device(env, 1, "cpu", **env_kwargs)  # fails fast on a bad id or option
        spec = None  # the device runtime takes its specs from the device environment
        if eval_every:
            raise ConfigError(
                "--eval-every is not supported on the device runtime; use rlherd eval"
            )
    else:
        spec = rl_envs.spec_for(env, **env_kwargs)  # fails fast on a bad id, before any directory
    builder = BUILDERS[agent](config, env, env_kwargs)

    if resume is None:
        rundir = RunDir(run_dir or default_run_dir(agent, env), create=True)
        meta = dict(
            agent=agent,
            env=env,
            runtime=runtime,
            seed=seed,
            total_steps=total_steps,
            preset=preset,
            env_kwargs=env_kwargs,
            eval_every=eval_every,
            eval_episodes=eval_episodes,
            config=to_json(config),
        )
    meta["total_steps"] = total_steps
    rundir.write_config(meta)

    recorder = Recorder(
        rundir,
        dict(agent=agent, env=env, runtime=runtime),
        total_steps,
        progress=progress,
        log_interval_s=config.log_interval_s,
        checkpoint_interval_s=config.checkpoint_interval_s,
    )
    if checkpoint is not None:
        recorder.load_state_dict(checkpoint["recorder"])
        rundir.truncate_metrics(int(recorder.counters["actor_steps"]))
    else:
        seed_everything(seed)

    def save(state: dict[str, Any]) -> None:
        rundir.save_checkpoint(state, int(recorder.counters["learner_steps"]))

    evaluator = None
    if eval_every > 0:
        evaluator = Evaluator(builder, spec, recorder, eval_every, eval_episodes, seed)

    torch.set_num_threads(config.torch_threads)
    with GracefulStop() as stop:
        try:
            if runtime == "single":
                from rlherd.runtime.single import run_single

                run_single(builder, spec, recorder, seed, checkpoint, save, stop, evaluator)
            elif runtime == "device":
                from rlherd.runtime.device import run_device

                run_device(builder, spec, recorder, seed, checkpoint, save, stop, evaluator)
            elif runtime == "mono":
                from rlherd.runtime.mono import run_mono

                run_mono(builder, spec, recorder, seed, checkpoint, save, stop, evaluator)
            else:
                from rlherd.runtime.poly import run_poly

                run_poly(builder, spec, recorder, seed, checkpoint, save, stop, evaluator)
        finally:
            if evaluator is not None:
                evaluator.close()
            summary = recorder.close()
    return Run(rundir.path, meta, summary)


__all__ = ["Run", "train", "resolve_config"]
