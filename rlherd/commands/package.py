"""``rlherd package RUN -o DIR``: a run's policy as a folder to share, laid out as a Hugging Face
Hub model repository accepts it (:mod:`rlherd.run.package`); ``huggingface-cli upload USER/REPO
DIR`` uploads it (``hf upload`` since huggingface_hub 1.0, which dropped ``huggingface-cli``).

The folder holds what acting needs and what a reader asks first: the policy's weights
(safetensors), the run's resolved config, and a model card with the agent, the environment, the
command that trains the run, its score and learning curves, beside a video of a greedy episode.
The score is played by the package itself, read back as ``rlherd eval`` reads it, on the seeds
``rlherd eval`` uses: ``rlherd eval DIR --episodes N`` prints the card's mean again.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shlex
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from rlherd import envs as rl_envs
from rlherd.agents import BUILDERS
from rlherd.commands.evaluate import load_run, policy_network, run_policy
from rlherd.commands.plot import plot_runs
from rlherd.commands.seeds import SEED_DIR, seed_dirs
from rlherd.commands.train import resolve_config
from rlherd.config import to_json
from rlherd.core import policy_state
from rlherd.errors import ConfigError, MissingExtra
from rlherd.run.evaluation import (
    EVAL_SEED,
    close_envs,
    episode_policies,
    episode_stats,
    make_eval_envs,
    run_episodes,
)
from rlherd.run.package import (
    CONFIG_FILE,
    PACKAGE_KEY,
    POLICY_FILE,
    SUMMARY_FILE,
    is_package,
    write_policy,
)
from rlherd.run.rundir import RunDir, RunRecord, atomic_write_bytes, atomic_write_json, read_json
from rlherd.run.statistics import aggregate
from rlherd.run.video import check_writable, write_video
from rlherd.runtime import RUNTIMES
from rlherd.runtime import settings as runtime_settings

VIDEO_SECONDS = 20  # a longer episode is cut here: the card shows the policy, not a film
CURVES_FILE = "curves.png"
CARD_FILE = "README.md"
# Every file a package may hold: repackaging into a folder with --overwrite replaces these and
# leaves anything else (a clone's .git, say) alone.
PACKAGE_FILES = (CARD_FILE, CONFIG_FILE, POLICY_FILE, SUMMARY_FILE, CURVES_FILE, "replay.mp4",
                 "replay.gif")  # fmt: skip


def package(
    run_dir: str | Path,
    output: str | Path,
    episodes: int = 10,
    video: bool = True,
    overwrite: bool = False,
    seed: int = EVAL_SEED,
    best: bool = False,
) -> dict[str, Any]:
    """Write the package of the run in ``run_dir`` (its latest policy; ``best``: its best
    evaluation's, kept by ``--save-best``) to ``output``: see the module docstring. The score is
    the greedy policy's over ``episodes`` episodes of seeds ``seed``, ``seed + 1``, .... The
    package is made in a temporary folder beside ``output`` and moved in whole, so a failure
    leaves no half package. Returns the score, the files written and notes on what was left out
    (a video an environment cannot render)."""
    run_dir, output = Path(run_dir), Path(output)
    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    if is_package(run_dir):
        raise ConfigError(f"{run_dir} is a package already; copy the folder to share it again")
    _check_output(run_dir, output, overwrite)
    record, builder, checkpoint, source = load_run(run_dir, best)
    _check_packable(run_dir, record, builder)
    policy_network(record, builder, checkpoint["learner"], source)  # fits: or one line naming it
    summary = RunDir(run_dir).read_summary()
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{output.name}-", dir=output.parent) as tmp:
        folder = Path(tmp)
        write_policy(folder / POLICY_FILE, policy_state(checkpoint["learner"]))
        counters, notes = dict(checkpoint["recorder"]["counters"]), []
        if best:  # the policy's steps are its evaluation's, not the latest checkpoint's
            counts = RUNTIMES[record.runtime].counts
            counters[counts] = read_json(run_dir / "best" / "evaluation.json").get(counts)
            notes.append(f"the policy of the run's best evaluation (at {counters[counts]} "
                         "steps), not its latest")  # fmt: skip
        made = dict(run=run_dir.resolve().name, counters=counters)
        atomic_write_json(folder / CONFIG_FILE, {**dataclasses.asdict(record), PACKAGE_KEY: made})
        video_file, more = _video_file(record) if video else (None, [])
        notes += more
        score, frames, fps = _score(folder, record, episodes, seed, video_file is not None)
        if video_file is not None:
            write_video(folder / video_file, frames[: VIDEO_SECONDS * fps], fps=fps)
        try:
            plot_runs([run_dir], folder / CURVES_FILE, title=f"{record.agent} on {record.env}")
        except FileNotFoundError:
            notes.append("no learning curves: the run logged no training episodes")
        atomic_write_json(folder / SUMMARY_FILE, {**summary, **score})
        files = sorted([CARD_FILE, *(p.name for p in folder.iterdir())])
        card = model_card(record, summary, score, train_command(record), across_seeds(run_dir),
                          files, notes)  # fmt: skip
        atomic_write_bytes(folder / CARD_FILE, card.encode())
        written = sorted(p.name for p in folder.iterdir())
        for name in PACKAGE_FILES:
            if name not in written:
                (output / name).unlink(missing_ok=True)  # a previous package's, now stale
        for name in written:
            os.replace(folder / name, output / name)
    shown = {k: v for k, v in score.items() if k not in ("eval_returns", "eval_seeds")}
    return dict(package=str(output), files=written, **shown, notes=notes)


def _check_output(run_dir: Path, output: Path, overwrite: bool) -> None:
    if output.resolve() == run_dir.resolve() or (output / "checkpoints").exists():
        raise ConfigError(f"{output} is a run directory; write the package to a folder of its "
                          f"own, e.g. -o {run_dir.name}-package")  # fmt: skip
    if output.exists() and not output.is_dir():
        raise ConfigError(f"{output} is a file; name a folder for the package")
    if output.is_dir() and any(output.iterdir()) and not overwrite:
        raise ConfigError(f"{output} is not empty; choose another -o DIR, or give --overwrite "
                          "to replace the package files in it")  # fmt: skip


def _check_packable(run_dir: Path, record: RunRecord, builder: Any) -> None:
    """A package's card scores a policy that acts on its own in Gymnasium environments, by the
    returns of its episodes."""
    runtime = RUNTIMES.get(record.runtime)
    if runtime is None or "gym_envs" not in runtime.provides:
        raise ConfigError(f"{run_dir} is a {record.runtime} run, whose games live in its "
                          "runtime; rlherd package takes runs of the other runtimes (play this "
                          "one with rlherd eval)")  # fmt: skip
    if "actor_network" in builder.needs:
        raise ConfigError(f"{record.agent} acts by searching its environment, which a "
                          "package's policy cannot; share the run directory instead")  # fmt: skip
    if rl_envs.family(record.env) == "openspiel" or rl_envs.turn_based(record.env):
        raise ConfigError(f"{record.env} is a two-player game, scored against an opponent "
                          "(rlherd eval --opponent), not by returns as a package's card is; "
                          "share the run directory instead")  # fmt: skip


def _video_file(record: RunRecord) -> tuple[str | None, list[str]]:
    """The video's name (an MP4, or a GIF without imageio-ffmpeg), or None and why not: checked
    before the episodes, so that a video that cannot be made never costs them, and by
    rendering a frame, since an environment may list a render mode it cannot serve here
    (MuJoCo's without an OpenGL context)."""
    if rl_envs.family(record.env) == "pettingzoo":
        return None, ["no video: rlherd does not record multi-agent games yet"]
    name = "replay.mp4" if importlib.util.find_spec("imageio_ffmpeg") else "replay.gif"
    try:
        check_writable(Path(name))
    except MissingExtra as e:
        return None, [f"no video: {e}"]
    try:
        (env,) = _make(record, render=True)
        try:
            frame = None
            if "rgb_array" in env.metadata.get("render_modes", []):
                env.reset(seed=0)
                frame = env.render()
        finally:
            env.close()
    except Exception as e:  # each renderer fails its own way; the card says how, and goes on
        return None, [f"no video: {record.env} could not render here "
                      f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"]
    if not isinstance(frame, np.ndarray):
        return None, [f"no video: {record.env} renders no rgb_array frames"]
    return name, []


def _make(record: RunRecord, render: bool, agent_index: bool = False, episodes: int = 1) -> list:
    """The environments ``episodes`` episodes are played in (:func:`make_eval_envs`, as
    ``rlherd eval`` makes them), rendering frames if ``render``."""
    kwargs = dict(record.env_kwargs, render_mode="rgb_array") if render else record.env_kwargs
    with warnings.catch_warnings():  # Gymnasium's, for one that cannot render: the card says so
        warnings.filterwarnings("ignore", message=".*render_mode='rgb_array' that is not in")
        return make_eval_envs(record.env, agent_index, episodes, **kwargs)


def _score(
    folder: Path, record: RunRecord, episodes: int, seed: int, render: bool
) -> tuple[dict[str, Any], list[np.ndarray], int]:
    """The greedy policy's score over ``episodes`` episodes of seeds ``seed``, ``seed + 1``,
    ..., played by the package in ``folder`` read back as ``rlherd eval`` reads it (what is
    scored is what is shared); and the first episode's frames if ``render``, with the
    environment's frame rate."""
    policy = run_policy(folder, greedy=True, seed=seed)
    envs = _make(record, render, policy.spec.agent_index, episodes)
    actor = policy.make_actor()
    try:
        returns, lengths, frames = run_episodes(envs, actor, episodes, seed, record=render)
    finally:
        close_envs(envs)
    fps = int(envs[0].metadata.get("render_fps") or 30)
    stats = episode_stats(returns, lengths, episode_policies(envs, actor, episodes))
    score = dict(**stats, eval_episodes=episodes, eval_greedy=True,
                 eval_seeds=list(range(seed, seed + episodes)), eval_returns=returns)  # fmt: skip
    if "eval_return_mean" in stats:  # one policy (several: each one's mean)
        score["eval_return_ci95"] = bootstrap_ci(returns)
    return score, frames, fps


def bootstrap_ci(values: list[float], level: float = 0.95, resamples: int = 10_000,
                 seed: int = 0) -> list[float]:  # fmt: skip
    """A percentile bootstrap confidence interval of the mean of ``values``: a handful of
    episodes is too few to trust a normal approximation, and the bootstrap assumes no shape.
    Seeded, so a package made twice says the same."""
    draws = np.random.default_rng(seed).choice(values, size=(resamples, len(values)))
    low, high = np.quantile(draws.mean(axis=1), [(1 - level) / 2, (1 + level) / 2])
    return [float(low), float(high)]


def train_command(record: RunRecord) -> str:
    """The ``rlherd train`` command that trains this run again: its agent, environment,
    runtime, seed and budget, and each config field and runtime setting where the run differs
    from what that command chooses by itself (its preset's config, the runtime's defaults)."""
    config, preset = resolve_config(record.agent, record.env, record.preset or None, {})
    builder = BUILDERS[record.agent]
    settings = runtime_settings.resolve(record.runtime, builder.runtime_defaults.get(preset, {}),
                                        {})  # fmt: skip
    words = ["rlherd", "train", record.agent, "--env", record.env, "--runtime", record.runtime,
             "--seed", str(record.seed), "--total-steps", str(record.total_steps)]  # fmt: skip
    if record.preset:
        words += ["--preset", record.preset]
    if record.env_kwargs:
        words += ["--env-kwargs", json.dumps(record.env_kwargs)]
    if record.eval_every:
        words += ["--eval-every", str(record.eval_every),
                  "--eval-episodes", str(record.eval_episodes)]  # fmt: skip
    chosen = to_json(config)
    words += [w for key, value in record.config.items() if chosen.get(key) != value
              for w in ("--set", f"{key}={_cli_value(value)}")]  # fmt: skip
    chosen = to_json(settings)
    words += [w for key, value in record.settings.items() if chosen.get(key) != value
              for w in (f"--{key.replace('_', '-')}", _cli_value(value))]  # fmt: skip
    return shlex.join(words)


def _cli_value(value: Any) -> str:
    """A config or setting value as ``--set`` and the setting flags parse it back
    (:func:`rlherd.config.apply_overrides`)."""
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "none"
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def across_seeds(run_dir: Path) -> list[dict[str, Any]]:
    """The summaries of the runs that repeat this one with other seeds, this one's included,
    when it is one of several (``PARENT/seed-*/`` run directories of one agent and
    environment); else none."""
    if not SEED_DIR.fullmatch(run_dir.resolve().name):
        return []
    mine = read_json(run_dir / SUMMARY_FILE)
    runs = [p for p in seed_dirs(run_dir.resolve().parent).values()
            if (p / SUMMARY_FILE).is_file()]  # fmt: skip
    summaries = [dict(read_json(p / SUMMARY_FILE), run=p.name) for p in runs]
    same = [s for s in summaries if (s.get("agent"), s.get("env")) == (mine.get("agent"),
                                                                      mine.get("env"))]  # fmt: skip
    return same if len(same) > 1 else []


def seed_aggregate(values: list[float]) -> str:
    """The score of a run across its seeds, as the card prints it: the IQM and the mean with
    95% stratified-bootstrap CIs, as ``rlherd report`` gives them (rliable, the ``stats``
    extra); without rliable, the mean and standard deviation, saying so."""
    try:
        iqm, mean = (aggregate(values)[name] for name in ("iqm", "mean"))
    except MissingExtra:
        return (f"{np.mean(values):.2f} ± {np.std(values):.2f} (mean ± std) over {len(values)} "
                "seeds; IQM and CIs need rliable: pip install 'rlherd[stats]'")  # fmt: skip
    return (f"IQM {iqm.value:.2f} [{iqm.low:.2f}, {iqm.high:.2f}], mean {mean.value:.2f} "
            f"[{mean.low:.2f}, {mean.high:.2f}] over {len(values)} seeds (95% stratified "
            "bootstrap CIs, rliable)")  # fmt: skip


def model_card(
    record: RunRecord,
    summary: dict[str, Any],
    score: dict[str, Any],
    command: str,
    seeds: list[dict[str, Any]],
    files: list[str],
    notes: list[str],
) -> str:
    """The package's README.md: YAML front matter in the Hub's format (``library_name``,
    ``tags``, a ``model-index`` with the environment and the score, read by the Hub's
    leaderboards), then the score, the training and how to use the policy. Strings in the
    front matter are written as JSON, which YAML reads as they are whatever they hold."""
    policies = {k[len("eval_return_"):]: v for k, v in score.items()
                if k.startswith("eval_return_") and k not in ("eval_return_std",
                                                              "eval_return_ci95")}  # fmt: skip
    if "mean" in policies:
        metrics = [("mean_reward", f"{score['eval_return_mean']:.2f} +/- "
                                   f"{score['eval_return_std']:.2f}")]  # fmt: skip
    else:
        metrics = [(f"mean_reward_{name}", f"{value:.2f}") for name, value in policies.items()]
    q = json.dumps
    lines = ["---", "library_name: rlherd", "tags:"]
    lines += [f"- {q(tag)}" for tag in ("reinforcement-learning", "rlherd", record.agent,
                                         record.env)]  # fmt: skip
    lines += ["model-index:", f"- name: {q(f'{record.agent}-{record.env}')}", "  results:",
              "  - task:", "      type: reinforcement-learning",
              "      name: reinforcement-learning", "    dataset:", f"      name: {q(record.env)}",
              f"      type: {q(record.env)}", "    metrics:"]  # fmt: skip
    for name, value in metrics:
        lines += [f"    - type: {q(name)}", f"      value: {q(value)}", f"      name: {q(name)}",
                  "      verified: false"]  # fmt: skip
    lines += ["---", "", f"# {record.agent} on {record.env}", ""]
    steps = summary.get("actor_steps", record.total_steps)
    lines += [f"A policy trained by rlherd's `{record.agent}` agent on `{record.env}` (the "
              f"`{record.runtime}` runtime, seed {record.seed}, {steps:,} agent steps).", ""]
    lines += _score_section(score)
    if seeds:
        finals = [s["final_return_mean"] for s in seeds if s.get("final_return_mean") is not None]
        lines += ["## Across seeds", "", "This run is one of several that differ only in their "
                  "seed (training returns, the mean of each run's last 20 episodes):", "",
                  "| run | final return | evaluation return |", "|---|---|---|"]  # fmt: skip
        lines += [f"| {s['run']} | {_number(s.get('final_return_mean'))} | "
                  f"{_number(s.get('eval_return_mean'))} |" for s in seeds]  # fmt: skip
        lines += ["", f"Final return: {seed_aggregate(finals)}.", ""] if len(finals) > 1 else [""]
    lines += ["## Training", "", "```bash", command, "```", ""]
    shown = ("actor_steps", "learner_steps", "episodes", "wall_time_s", "sps", "final_return_mean")
    lines += [f"- {key}: {_number(summary[key])}" for key in shown if key in summary]
    machine = record.machine
    if machine:
        lines += [f"- trained with rlherd {machine.get('rlherd')} (commit {machine.get('commit')}),"
                  f" torch {machine.get('packages', {}).get('torch')}, on {machine.get('cpu')}"
                  f" ({machine.get('cores')} cores), GPU: {machine.get('gpu') or 'none'}"]
    lines += ["", "The resolved config (the agent's fields, the runtime's settings) is in "
              "`config.json`.", ""]  # fmt: skip
    if CURVES_FILE in files:
        lines += [f"![learning curves]({CURVES_FILE})", ""]
    video = next((f for f in files if f.startswith("replay.")), None)
    if video:
        lines += ["## A greedy episode", ""]
        lines += ([f'<video src="{video}" controls></video>'] if video.endswith(".mp4")
                  else [f"![a greedy episode]({video})"])  # fmt: skip
        lines += ["", f"(the episode of seed {score['eval_seeds'][0]}, at most "
                  f"{VIDEO_SECONDS} s)", ""]  # fmt: skip
    lines += ["## Use", "", "Download the repository (`hf download USER/REPO --local-dir DIR`; "
              "`huggingface-cli download` before huggingface_hub 1.0), then play the policy "
              "again or act with it from Python:", "",
              "```bash", f"rlherd eval DIR --episodes {score['eval_episodes']}", "```", "",
              "```python", "import rlherd", "", 'policy = rlherd.load_policy("DIR")',
              f'env = rlherd.make("{record.env}")', "obs, _ = env.reset(seed=0)",
              "obs, reward, terminated, truncated, _ = env.step(policy(obs))", "```", "",
              "## Files", ""]  # fmt: skip
    about = {CARD_FILE: "this card", CONFIG_FILE: "the run's resolved record: agent, "
             "environment, runtime, seed, the agent's config, the runtime's settings, the machine",
             POLICY_FILE: "the policy's parameters and buffers (observation statistics among "
             "them): what acting needs", SUMMARY_FILE: "the run's summary and this evaluation, "
             "episode by episode", CURVES_FILE: "the training returns",
             "replay.mp4": "a greedy episode", "replay.gif": "a greedy episode"}  # fmt: skip
    lines += [f"- `{name}`: {about[name]}" for name in files]
    if notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in notes]
    return "\n".join(lines) + "\n"


def _score_section(score: dict[str, Any]) -> list[str]:
    seeds = score["eval_seeds"]
    lines = ["## Score", "", f"The greedy policy over {score['eval_episodes']} episodes, "
             f"environment seeds {seeds[0]} to {seeds[-1]}:", ""]  # fmt: skip
    if "eval_return_mean" not in score:  # several policies: each one's mean return
        lines += ["| policy | mean return |", "|---|---|"]
        lines += [f"| {k[len('eval_return_'):]} | {v:.2f} |" for k, v in score.items()
                  if k.startswith("eval_return_")]  # fmt: skip
        return [*lines, ""]
    low, high = score["eval_return_ci95"]
    lines += ["| mean return | std | 95% CI (bootstrap) | mean length | episodes |",
              "|---|---|---|---|---|",
              f"| {score['eval_return_mean']:.2f} | {score['eval_return_std']:.2f} | "
              f"[{low:.2f}, {high:.2f}] | {score['eval_episode_length_mean']:.1f} | "
              f"{score['eval_episodes']} |", ""]  # fmt: skip
    if len(score["eval_returns"]) == len(seeds):  # one episode per seed (not a game's agents)
        lines += ["| seed | return |", "|---|---|"]
        lines += [f"| {s} | {r:.2f} |" for s, r in zip(seeds, score["eval_returns"], strict=True)]
        lines += [""]
    lines += [f"`rlherd eval DIR --episodes {score['eval_episodes']}` plays these episodes "
              "again (its seeds start at the same one).", ""]  # fmt: skip
    return lines


def _number(value: Any) -> str:
    if value is None:  # a run without it (no episode ended yet; a game's, per policy)
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)
