"""``rlherd eval``: run a trained policy for a number of episodes, optionally recording a video."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.run.config import apply_overrides
from rlherd.run.rundir import RunDir, atomic_write_json, read_json


def _load_run(run_dir: str | Path):
    """A run's config, its builder and its latest checkpoint."""
    rundir = RunDir(run_dir)
    meta = rundir.read_config()
    builder_class = BUILDERS[meta["agent"]]
    config = apply_overrides(builder_class.config_class(), meta["config"])
    builder = builder_class(config, meta["env"], meta["env_kwargs"])
    return run_dir, meta, builder, rundir.load_checkpoint()


def load_policy_net(run_dir: str | Path):
    """The builder, env spec and network of a run, with the latest checkpoint's parameters."""
    _, meta, builder, checkpoint = _load_run(run_dir)
    spec = rl_envs.spec_for(meta["env"], **meta["env_kwargs"])
    net = builder.make_networks(spec, device="cpu")
    net.load_state_dict(checkpoint["learner"]["net"])
    net.eval()
    return meta, builder, net


def write_video(path: Path, frames: list[np.ndarray], fps: int = 30) -> None:
    try:
        import imageio.v3 as iio
    except ImportError as e:
        raise ImportError("videos need imageio: pip install 'rlherd[video]'") from e
    if path.suffix.lower() == ".gif":
        iio.imwrite(path, np.stack(frames), duration=1000 / fps, loop=0)
    else:
        try:
            iio.imwrite(path, np.stack(frames), fps=fps)
        except (ImportError, OSError, ValueError) as e:
            raise RuntimeError(
                f"could not write {path}: {e}. MP4 needs imageio-ffmpeg (pip install "
                "'rlherd[video]'); a .gif works with the base install"
            ) from e


def run_episodes(env, policy, episodes: int, seed: int, record: bool = False):
    """Returns and lengths of ``episodes`` episodes of ``policy(obs, first) -> action`` (frames
    of the first one if ``record``)."""
    returns, lengths, frames = [], [], []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        first, done, ret, length = True, False, 0.0, 0
        while not done:
            if record and episode == 0:
                frames.append(env.render())
            obs, reward, terminated, truncated, _ = env.step(policy(obs, first))
            first, done = False, terminated or truncated
            ret, length = ret + float(reward), length + 1
        returns.append(ret)
        lengths.append(length)
    return returns, lengths, frames


class Evaluator:
    """Runs the evaluation policy (greedy) for ``episodes`` episodes every ``every_steps`` actor
    steps, on its own environment and its own copy of the network, and logs
    ``metrics/evaluator.csv`` and ``eval_return_mean``. It has no adder: it never writes to
    replay, and it never changes the training actors' RNG streams."""

    def __init__(self, builder, spec, recorder, every_steps: int, episodes: int, seed: int):
        self.recorder, self.every_steps, self.episodes = recorder, every_steps, episodes
        self.seed = seed + 10_000_000
        with torch.random.fork_rng():  # building a network must not shift training's RNG
            self.net = builder.make_networks(spec, device="cpu")
        self.net.eval()
        self.policy = builder.make_policy(self.net, evaluation=True)
        self.env = rl_envs.make(builder.env_id, **builder.env_kwargs)
        steps = int(recorder.counters["actor_steps"])
        self.next_at = (steps // every_steps + 1) * every_steps

    def maybe_run(self, parameters) -> None:
        """Evaluate if due; ``parameters()`` gives the learner's current state dict."""
        steps = int(self.recorder.counters["actor_steps"])
        if steps < self.next_at:
            return
        self.next_at = (steps // self.every_steps + 1) * self.every_steps
        self.net.load_state_dict(parameters())
        returns, lengths, _ = run_episodes(self.env, self.policy, self.episodes, self.seed)
        row = dict(
            actor_steps=steps,
            eval_return_mean=float(np.mean(returns)),
            eval_return_std=float(np.std(returns)),
            eval_episode_length_mean=float(np.mean(lengths)),
        )
        self.recorder.rundir.log("evaluator", row, step=steps)
        self.recorder.extra["eval_return_mean"] = row["eval_return_mean"]

    def close(self) -> None:
        self.env.close()


def evaluate(
    run_dir: str | Path,
    episodes: int = 10,
    video: str | Path | None = None,
    greedy: bool = True,
    seed: int = 1_000_000,
) -> dict[str, Any]:
    """Mean return of the run's latest policy over ``episodes`` episodes; the first episode is
    recorded to ``video`` (.gif or .mp4) if given. The result is added to summary.json as
    ``eval_return_mean``."""
    if episodes < 1:
        raise ValueError(f"episodes must be >= 1, got {episodes}")
    if RunDir(run_dir).read_config()["runtime"] == "device":
        from rlherd.runtime.device import evaluate_device

        result = evaluate_device(*_load_run(run_dir), episodes, video, greedy, seed)
        _add_to_summary(run_dir, result)
        return result
    meta, builder, net = load_policy_net(run_dir)
    env = rl_envs.make(
        meta["env"], render_mode="rgb_array" if video else None, **meta["env_kwargs"]
    )
    policy = builder.make_policy(net, evaluation=greedy)
    returns, lengths, frames = run_episodes(env, policy, episodes, seed, record=bool(video))
    env.close()
    if video:
        write_video(Path(video), frames)
    result = dict(
        eval_return_mean=float(np.mean(returns)),
        eval_return_std=float(np.std(returns)),
        eval_episode_length_mean=float(np.mean(lengths)),
        eval_episodes=episodes,
        eval_greedy=greedy,
    )
    _add_to_summary(run_dir, result)
    return result


def _add_to_summary(run_dir: str | Path, result: dict[str, Any]) -> None:
    summary_path = Path(run_dir) / "summary.json"
    summary = read_json(summary_path) if summary_path.exists() else {}
    atomic_write_json(summary_path, {**summary, **result})
