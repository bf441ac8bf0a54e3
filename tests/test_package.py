"""``rlherd package``: a run's policy as a folder to share, a Hugging Face Hub model repository.

A package round-trips: ``rlherd eval`` and ``rlherd.load_policy`` read it as they read the run,
to the same returns and actions (observation statistics and recurrent policies included); it
holds plain data only; a damaged one is one line; its card is one the Hub reads, with a command
that trains the run again; and it shows a greedy episode, or says why not."""

from __future__ import annotations

import dataclasses
import json
import shlex
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import rlherd
from rlherd.cli import main
from rlherd.commands.evaluate import evaluate, load_run
from rlherd.commands.package import VIDEO_SECONDS, model_card, package, train_command
from rlherd.core import policy_state
from rlherd.errors import ConfigError
from rlherd.run.rundir import RunDir

pytest.importorskip("safetensors")  # the export extra

EPISODES = 3
FIRST_SEED = 1_000_000  # rlherd eval's


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two seeds of a tiny PPO run, side by side as ``seed-0/`` and ``seed-1/``, with
    observation normalisation (statistics that acting needs) and a runtime setting of their
    own; and seed 0's package, made by the command line."""
    root = tmp_path_factory.mktemp("sweep")
    for seed in (0, 1):
        rlherd.train("ppo", "CartPole-v1", total_steps=1_000, seed=seed, normalize_obs=True,
                     num_envs=2, run_dir=root / f"seed-{seed}", progress=False)  # fmt: skip
    argv = ["package", str(root / "seed-0"), "-o", str(root / "package"), "--episodes",
            str(EPISODES), "--no-video"]  # fmt: skip
    assert main(argv) == 0
    return root


def _printed(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_package_round_trips_through_eval(sweep, capsys):
    """``rlherd eval DIR`` on the package prints what it prints for the run, and the card's
    score is that evaluation; the package is read, never written."""
    package_dir = sweep / "package"
    before = {p.name: p.read_bytes() for p in package_dir.iterdir()}
    assert main(["eval", str(package_dir), "--episodes", str(EPISODES)]) == 0
    from_package = _printed(capsys)
    assert main(["eval", str(sweep / "seed-0"), "--episodes", str(EPISODES)]) == 0
    assert from_package == _printed(capsys)
    summary = json.loads((package_dir / "summary.json").read_text())
    assert summary["eval_return_mean"] == from_package["eval_return_mean"]
    assert summary["eval_seeds"] == list(range(FIRST_SEED, FIRST_SEED + EPISODES))
    assert len(set(summary["eval_returns"])) > 1  # episodes that differ: a score worth checking
    assert {p.name: p.read_bytes() for p in package_dir.iterdir()} == before


def test_the_package_holds_the_policy_and_nothing_else(sweep):
    """policy.safetensors is exactly the checkpoint's policy, observation statistics included,
    and no optimiser or replay; ``load_policy`` acts the same from the package and the run."""
    from safetensors.torch import load_file

    _, _, checkpoint, _ = load_run(sweep / "seed-0")
    policy = policy_state(checkpoint["learner"])
    tensors = load_file(sweep / "package" / "policy.safetensors")
    assert tensors.keys() == policy.keys()
    assert all(torch.equal(tensors[k], policy[k]) for k in policy)
    assert tensors["obs_norm.count"] > 0  # the statistics training gathered, not fresh ones
    from_run = rlherd.load_policy(sweep / "seed-0")
    from_package = rlherd.load_policy(sweep / "package")
    obs = np.random.default_rng(0).normal(scale=[1.0, 1.0, 0.1, 1.0], size=(256, 4))
    actions = from_package(obs.astype(np.float32))
    assert set(actions.tolist()) == {0, 1}  # both actions taken: the comparison can fail
    assert np.array_equal(actions, from_run(obs.astype(np.float32)))


def test_a_package_is_plain_data_read_without_torch_load(sweep, monkeypatch):
    """No file of a package is a pickle (or a torch.save archive), and reading one never calls
    ``torch.load``, which a run directory's checkpoint needs (so the patch below bites)."""
    package_dir = sweep / "package"
    allowed = {".md", ".json", ".safetensors", ".png", ".mp4", ".gif"}
    assert {p.suffix for p in package_dir.iterdir()} <= allowed
    for path in package_dir.iterdir():
        head = path.read_bytes()[:4]
        assert head[:1] != b"\x80" and head != b"PK\x03\x04", path  # pickle, zip

    def refuse(*args, **kwargs):
        raise AssertionError("torch.load called")

    monkeypatch.setattr(torch, "load", refuse)
    rlherd.load_policy(package_dir)(np.zeros(4, dtype=np.float32))
    assert evaluate(package_dir, episodes=1)["eval_episodes"] == 1
    with pytest.raises(AssertionError, match="torch.load called"):
        rlherd.load_policy(sweep / "seed-0")


def test_a_package_in_the_hubs_cache_reads_as_it_is(sweep, tmp_path):
    """A download into the Hub's cache (``hf download`` without ``--local-dir``) is a folder of
    links into the cache's ``blobs/``: it plays as the package does."""
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "0123abcd"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    for i, path in enumerate(sorted((sweep / "package").iterdir())):
        shutil.copy(path, blobs / f"blob{i}")
        (snapshot / path.name).symlink_to(Path("..", "..", "blobs", f"blob{i}"))
    assert evaluate(snapshot, episodes=EPISODES) == evaluate(sweep / "package", episodes=EPISODES)
    assert all(p.is_symlink() for p in snapshot.iterdir())  # and it was not written to


def _front_matter(card: str) -> tuple[dict, str]:
    yaml = pytest.importorskip("yaml")
    empty, front, body = card.split("---\n", 2)
    assert empty == ""  # the front matter opens the file, as the Hub reads it
    return yaml.safe_load(front), body


def test_the_model_cards_seed_aggregate_leaves_out_seeds_without_a_return(sweep):
    """A sibling with no training return (a game's seeds report theirs per policy; a seed whose
    first episode has not ended) has none to aggregate: it is not a NaN in the IQM."""
    record = RunDir(sweep / "seed-0").read_config()
    seeds = [{"run": "a", "final_return_mean": None}, {"run": "b", "final_return_mean": 5.0},
             {"run": "c", "final_return_mean": 7.0}]  # fmt: skip
    score = json.loads((sweep / "package" / "summary.json").read_text())
    card = model_card(record, score, score, "rlherd train ...", seeds, [], [])
    assert "| a | - |" in card
    (final,) = [line for line in card.splitlines() if line.startswith("Final return:")]
    assert "nan" not in final and "over 2 seeds" in final


def test_the_model_card_says_what_was_trained_and_how_it_scores(sweep):
    """Front matter with the Hub's keys (``library_name``, ``tags``, ``model-index``: the
    environment and the mean return with its std); a body with the seeds, the bootstrap
    interval, each seed's return, the command, the run's siblings and the curves."""
    card = (sweep / "package" / "README.md").read_text()
    meta, body = _front_matter(card)
    summary = json.loads((sweep / "package" / "summary.json").read_text())
    mean, std = summary["eval_return_mean"], summary["eval_return_std"]
    assert meta["library_name"] == "rlherd"
    assert meta["tags"] == ["reinforcement-learning", "rlherd", "ppo", "CartPole-v1"]
    (model,) = meta["model-index"]
    (result,) = model["results"]
    assert result["task"]["type"] == "reinforcement-learning"
    assert result["dataset"] == {"name": "CartPole-v1", "type": "CartPole-v1"}
    assert result["metrics"] == [{"type": "mean_reward", "name": "mean_reward",
                                  "value": f"{mean:.2f} +/- {std:.2f}", "verified": False}]
    low, high = summary["eval_return_ci95"]
    assert low <= mean <= high and low < high
    assert f"[{low:.2f}, {high:.2f}]" in body
    assert f"seeds {FIRST_SEED} to {FIRST_SEED + EPISODES - 1}" in body
    for seed, ret in zip(summary["eval_seeds"], summary["eval_returns"], strict=True):
        assert f"| {seed} | {ret:.2f} |" in body
    assert train_command(RunDir(sweep / "seed-0").read_config()) in body
    assert "## Across seeds" in body and "| seed-1 |" in body
    from rlherd.run.statistics import aggregate

    finals = [json.loads((sweep / f"seed-{k}" / "summary.json").read_text())["final_return_mean"]
              for k in (0, 1)]  # fmt: skip
    iqm = aggregate(finals)["iqm"]
    assert f"IQM {iqm.value:.2f} [{iqm.low:.2f}, {iqm.high:.2f}]" in body
    assert "![learning curves](curves.png)" in body and (sweep / "package" / "curves.png").exists()
    assert "replay." not in body  # --no-video


def test_huggingface_hub_reads_the_card(sweep):
    import huggingface_hub as hub

    card = hub.ModelCard.load(sweep / "package" / "README.md")
    assert card.data.library_name == "rlherd"
    (result,) = card.data.eval_results
    assert (result.task_type, result.dataset_type) == ("reinforcement-learning", "CartPole-v1")
    assert result.metric_type == "mean_reward"


def test_the_cards_command_trains_the_run_again(sweep, tmp_path, capsys):
    """The card's ``rlherd train`` command, run, records the run's config and settings (the
    normalisation and the number of environments, which are not the defaults) and learns the
    same policy."""
    record = RunDir(sweep / "seed-0").read_config()
    command = train_command(record)
    assert "--set normalize_obs=true" in command and "--num-envs 2" in command
    again = tmp_path / "again"
    assert main([*shlex.split(command)[1:], "--run-dir", str(again), "--no-progress"]) == 0
    capsys.readouterr()
    retrained = RunDir(again).read_config()
    assert dataclasses.replace(retrained, machine={}) == dataclasses.replace(record, machine={})
    package(again, tmp_path / "package", episodes=1, video=False)
    assert (tmp_path / "package" / "policy.safetensors").read_bytes() == (
        sweep / "package" / "policy.safetensors").read_bytes()  # fmt: skip


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:100])


@pytest.mark.parametrize(("damage", "said"), [
    (lambda p: _truncate(p / "policy.safetensors"), "policy.safetensors is damaged"),
    (lambda p: (p / "policy.safetensors").unlink(), "policy.safetensors is missing"),
    (lambda p: (p / "config.json").unlink(), "config.json is missing"),
    (lambda p: (p / "config.json").write_text("{"), "config.json is not valid JSON"),
])  # fmt: skip
def test_a_damaged_package_is_one_line(sweep, tmp_path, capsys, damage, said):
    copy = shutil.copytree(sweep / "package", tmp_path / "package")
    damage(copy)
    assert main(["eval", str(copy), "--episodes", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and said in err, err


def _tensors(change):
    """Rewrite a package's policy.safetensors as ``change`` makes its tensors."""

    def damage(package_dir: Path) -> None:
        from safetensors.torch import load_file, save_file

        path = package_dir / "policy.safetensors"
        save_file(change(load_file(path)), path)

    return damage


_MISFITS = {  # eval, export and collect said torch's Missing, Unexpected key(s), size mismatch
    "missing": _tensors(lambda policy: dict(list(policy.items())[1:])),
    "extra": _tensors(lambda policy: {**policy, "evil": torch.zeros(1)}),
    "of another shape": _tensors(lambda policy: {k: torch.zeros(3, 3) for k in policy}),
    "none": _tensors(lambda policy: {}),
}


@pytest.mark.parametrize("command", ["eval", "export", "collect"])
@pytest.mark.parametrize("tensors", _MISFITS)
def test_a_package_whose_tensors_do_not_fit_its_config_is_one_line(sweep, tmp_path, capsys,
                                                                   monkeypatch, command,
                                                                   tensors):  # fmt: skip
    copy = shutil.copytree(sweep / "package", tmp_path / "package")
    _MISFITS[tensors](copy)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "datasets"))
    args = {"eval": ["eval", str(copy), "--episodes", "1"],
            "export": ["export", str(copy), "--format", "torchscript", "-o", str(tmp_path)],
            "collect": ["collect", str(copy), "--out", "misfit/run-v0", "--episodes", "1"],
            }[command]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"{copy / 'policy.safetensors'} does not fit the run's config" in err, err


def test_package_keeps_to_its_own_files(sweep, tmp_path):
    """A folder in use is refused unless ``--overwrite``, which replaces the package's files
    only (a clone's .git stays; a video of an earlier package goes); a run directory or a
    package is never a package's source or target."""
    run, out = sweep / "seed-0", tmp_path / "repo"
    (out / ".git").mkdir(parents=True)
    (out / "replay.gif").write_bytes(b"an older package's")
    with pytest.raises(ConfigError, match="not empty.*--overwrite"):
        package(run, out, episodes=1, video=False)
    package(run, out, episodes=1, video=False, overwrite=True)
    assert (out / ".git").is_dir() and not (out / "replay.gif").exists()
    assert (out / "policy.safetensors").is_file()
    with pytest.raises(ConfigError, match="is a run directory"):
        package(run, sweep / "seed-1", episodes=1, overwrite=True)
    with pytest.raises(ConfigError, match="is a package already"):
        package(sweep / "package", tmp_path / "again", episodes=1)
    with pytest.raises(ConfigError, match="episodes must be >= 1"):
        package(run, tmp_path / "none", episodes=0)


def test_the_package_shows_a_greedy_episode_or_says_why_not(sweep, tmp_path):
    """The video is the first scored episode, frame by frame (CartPole pays 1 a step, so its
    return is its length); an environment that cannot render gets a note instead."""
    iio = pytest.importorskip("imageio.v3")
    result = package(sweep / "seed-0", tmp_path / "package", episodes=1)
    (video,) = [name for name in result["files"] if name.startswith("replay.")]
    frames = iio.imread(tmp_path / "package" / video)
    assert len(frames) == min(result["eval_return_mean"], VIDEO_SECONDS * 50)  # CartPole: 50 fps
    assert video in (tmp_path / "package" / "README.md").read_text()
    corridor = rlherd.train("ppo", "rlherd/Corridor-v0", total_steps=300,
                            run_dir=tmp_path / "corridor", progress=False)  # fmt: skip
    result = package(corridor.path, tmp_path / "corridor-package", episodes=1)
    assert not [name for name in result["files"] if name.startswith("replay.")]
    (note,) = result["notes"]
    assert note.startswith("no video: rlherd/Corridor-v0"), note
    assert note in (tmp_path / "corridor-package" / "README.md").read_text()


def test_a_recurrent_policy_acts_the_same_from_its_package(tmp_path):
    """An LSTM policy's actions depend on what it saw before: through whole episodes, the
    package's policy and the run's act alike, and evaluate alike."""
    run = rlherd.train("impala", "CartPole-v1", total_steps=1_000, use_lstm=True, lstm_size=16,
                       run_dir=tmp_path / "run", progress=False)  # fmt: skip
    package(run.path, tmp_path / "package", episodes=2, video=False)
    from_run = rlherd.load_policy(run.path)
    from_package = rlherd.load_policy(tmp_path / "package")
    env = rlherd.make("CartPole-v1")
    for seed in range(2):
        obs, _ = env.reset(seed=seed)
        from_run.reset()
        from_package.reset()
        done = False
        while not done:
            action = from_run(obs)
            assert from_package(obs) == action
            obs, _, terminated, truncated, _ = env.step(int(action))
            done = terminated or truncated
    assert evaluate(tmp_path / "package", episodes=2) == evaluate(run.path, episodes=2)


def test_package_help_renders(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["package", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in ("-o DIR", "--episodes", "--no-video", "--overwrite"))


def test_a_package_is_never_written_by_resume_or_export(tmp_path, capsys):
    """``--resume`` and ``rlherd export`` read runs; a package given to them stays as it was,
    and its config.json trains the run again."""
    import rlherd
    from rlherd.cli import main

    run = rlherd.train("ppo", "CartPole-v1", total_steps=300, run_dir=tmp_path / "run",
                       progress=False)  # fmt: skip
    assert main(["package", str(run.path), "-o", str(tmp_path / "pkg"), "--episodes", "1",
                 "--no-video"]) == 0  # fmt: skip
    before = sorted(p.name for p in (tmp_path / "pkg").iterdir())
    capsys.readouterr()
    assert main(["train", "--resume", str(tmp_path / "pkg")]) == 2
    assert "is a package" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "pkg")]) == 2
    assert "say where the file goes: -o policy.onnx" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == before
    assert main(["train", "--config", str(tmp_path / "pkg" / "config.json"), "--run-dir",
                 str(tmp_path / "again"), "--total-steps", "200", "--no-progress"]) == 0
