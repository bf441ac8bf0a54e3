"""The Behaviour Suite: bsuite ids made through the bsuite package, runs logged in bsuite's CSV
format, resumable sweeps and bsuite's own scoring."""

import json
import re
import shutil
import signal
import warnings

import numpy as np
import pandas as pd
import pytest
import torch
from bsuite.logging import csv_load  # the bsuite extra, which the test install has (all)
from bsuite.utils import wrappers

import rlherd
from rlherd import envs as rl_envs
from rlherd.commands import bsuite as sweeps
from rlherd.envs.bsuite import STEP_BOUND
from rlherd.errors import ConfigError
from rlherd.run.rundir import RunDir
from rlherd.runtime import settings as settings_mod


def csv_of(run_dir) -> pd.DataFrame:
    """The bsuite CSV a run wrote, read by bsuite's own loader."""
    data, _ = csv_load.load_bsuite({"agent": str(run_dir / "bsuite")})
    return data


def copy_of(sweep, to):
    """A copy of the sweep folder ``sweep`` at ``to`` (its ``csv/`` links, which are relative,
    as links), for a test to change as it likes."""
    shutil.copytree(sweep, to, symlinks=True)
    return to


# Each id a sweep trains is a process of its own (seconds of imports before its first step), so
# the sweeps that several tests start from are made once (per worker: their tests are grouped
# onto one), and each test changes a copy of its own.
SHARES_CATCH = pytest.mark.xdist_group("bsuite-swept-catch")
SHARES_TWO_AGENTS = pytest.mark.xdist_group("bsuite-two-agents")


@pytest.fixture(scope="module")
def swept_catch(tmp_path_factory):
    """A finished sweep of DQN on bsuite/catch/0 at 3 episodes (its replay dropped as it
    finished), as ``sweeps.sweep("dqn", ["bsuite/catch/0"], OUT, total_episodes=3)`` leaves it.
    Tests take a :func:`copy_of` it."""
    out = tmp_path_factory.mktemp("swept-catch") / "sweep"
    result, done = sweeps.sweep("dqn", ["bsuite/catch/0"], out, progress=False, total_episodes=3)
    assert not result.failed and done == []
    return out


@pytest.fixture(scope="module")
def failed_dqfd_sweep(tmp_path_factory):
    """A sweep of DQfD on bsuite/catch/0, which has no expert to give DQfD its demonstrations:
    its one id fails at once in its own process, before a checkpoint. The sweep's outcome and
    folder; tests that change the folder take a :func:`copy_of` it."""
    out = tmp_path_factory.mktemp("failed-dqfd") / "failed"
    result, _ = sweeps.sweep("dqfd", ["bsuite/catch/0"], out, progress=False, total_episodes=3)
    return result, out


@pytest.fixture(scope="module")
def two_agents_swept(tmp_path_factory):
    """Sweeps of DQN and IMPALA (folders ``dqn`` and ``impala`` of the returned one) over
    bsuite/bandit/0 and bsuite/deep_sea/0 at 30 episodes each. Tests take a :func:`copy_of`
    them."""
    parent = tmp_path_factory.mktemp("two-agents")
    for agent in ("dqn", "impala"):
        result, _ = sweeps.sweep(agent, ["bsuite/bandit/0", "bsuite/deep_sea/0"], parent / agent,
                                 progress=False, total_episodes=30)  # fmt: skip
        assert not result.failed
    return parent


def test_bsuite_ids_are_bsuites_own():
    env = rl_envs.make("bsuite/deep_sea/0")
    spec = rl_envs.spec_of(env, "bsuite/deep_sea/0")
    assert spec.obs.shape == (10, 10) and spec.num_actions == 2  # deep sea of size 10
    assert rl_envs.family("bsuite/deep_sea/0") == "bsuite"
    assert rl_envs.resolve("bsuite/memory_len/3") == "bsuite/memory_len/3"
    with pytest.raises(ConfigError, match="Did you mean: bsuite/deep_sea/0"):
        rl_envs.make("bsuite/deep_see/0")
    with pytest.raises(ConfigError, match="takes no options"):
        rl_envs.make("bsuite/deep_sea/0", size=12)
    with pytest.raises(ConfigError, match="Did you mean: memory_len"):
        sweeps.select(["memory_lenn"], None)


def test_an_experiments_name_alone_is_pointed_at_its_ids_not_shimmys():
    """``--env bsuite/catch`` was answered with Shimmy's ``bsuite/catch-v0``, a Gymnasium id
    that trains without bsuite's CSV or budget, so a run of it is not bsuite's to score: a
    near miss of a bsuite id is pointed at bsuite's own ids."""
    for env_id in ("bsuite/catch", "bsuite/catch/"):
        with pytest.raises(ConfigError, match=r"Did you mean: bsuite/catch/0\? \(its ids: "
                                              r"bsuite/catch/0 to /19\)") as refused:
            rl_envs.resolve(env_id)
        assert "-v0" not in str(refused.value)
    with pytest.raises(ConfigError, match="unknown bsuite id 'bsuite/catch/0/1'"):
        rl_envs.resolve("bsuite/catch/0/1")
    assert rl_envs.resolve("bsuite/catch-v0") == "bsuite/catch-v0"  # Shimmy's own id, as it was


def test_a_bsuite_run_stops_at_its_episode_budget_and_writes_bsuites_csv(tmp_path):
    run = rlherd.train("dqn", "bsuite/catch/0", run_dir=tmp_path / "run", total_episodes=25,
                       progress=False)  # fmt: skip
    assert run.summary["episodes"] == 25
    data = csv_of(tmp_path / "run")
    assert data["episode"].max() == 25  # bsuite's count: its logger sits in the training env
    assert (data["bsuite_env"] == "catch").all() and data["steps"].max() == 25 * 9
    # The evaluation environment logs nothing: a second writer would corrupt bsuite's counts.
    rlherd.train("dqn", "bsuite/catch/0", run_dir=tmp_path / "evaluated", total_episodes=10,
                 eval_episodes=3, progress=False)  # fmt: skip
    assert csv_of(tmp_path / "evaluated")["episode"].max() == 10


def test_bsuites_budget_is_the_default(tmp_path):
    with pytest.raises(ConfigError, match="single runtime"):
        rlherd.train("dqn", "bsuite/catch/0", runtime="mono", progress=False)
    with pytest.raises(ConfigError, match="drop --num-envs"):
        rlherd.train("dqn", "bsuite/catch/0", num_envs=2, progress=False)
    with pytest.raises(ConfigError, match="drop --env-workers"):  # its logger must be saved
        rlherd.train("dqn", "bsuite/catch/0", env_workers=1, progress=False)
    with pytest.raises(ConfigError, match="plays no episodes of its own"):  # never ignored
        settings_mod.resolve("offline", {}, {"dataset": "d4rl/x", "total_episodes": 5})
    with pytest.raises(ConfigError, match="results_dir"):
        rlherd.train("dqn", "bsuite/catch/0", env_kwargs={"results_dir": "x"}, progress=False)
    run = rlherd.train("dqn", "bsuite/deep_sea/0", run_dir=tmp_path / "run", total_steps=50,
                       progress=False)  # fmt: skip
    assert run.summary["total_episodes"] == 10_000  # bsuite's budget for deep sea
    assert rlherd.train("dqn", "bsuite/deep_sea/0", run_dir=tmp_path / "unbounded",
                        total_steps=None, progress=False, total_episodes=2
                        ).config.total_steps == STEP_BOUND  # fmt: skip


@pytest.mark.parametrize("env_id", ["bsuite/catch/0", "bsuite/catch_noise/0",
                                    "bsuite/catch_scale/0"])  # fmt: skip
def test_a_stopped_bsuite_run_continues_its_csv(tmp_path, interrupt_at, env_id):
    """Also for the noise and scale experiments, whose bsuite wrappers could not be unpickled
    (so their checkpoints could not be resumed)."""
    interrupt_at(100)
    run = rlherd.train("dqn", env_id, run_dir=tmp_path / "run", total_episodes=30,
                       progress=False)  # fmt: skip
    assert run.stopped and run.summary["episodes"] < 30
    run = rlherd.train(resume=tmp_path / "run", progress=False)
    data = csv_of(tmp_path / "run")
    # One stream: the restored environment's logger goes on counting where it was.
    assert data["episode"].is_monotonic_increasing and data["episode"].max() == 30
    assert data["steps"].max() == 30 * 9


def test_the_subset_spreads_across_each_experiment():
    chosen = sweeps.select(["deep_sea", "bandit"], ["subset"])
    deep = [i for i in chosen if "/deep_sea/" in i]
    assert deep == ["bsuite/deep_sea/0", "bsuite/deep_sea/5", "bsuite/deep_sea/10",
                    "bsuite/deep_sea/15", "bsuite/deep_sea/20"]  # sizes 10 to 50  # fmt: skip
    assert len(chosen) == 2 * sweeps.SUBSET_SIZE
    assert sweeps.select(None, ["deep_sea/3"]) == ["bsuite/deep_sea/3"]
    with pytest.raises(ConfigError, match="not among --experiments"):
        sweeps.select(["catch"], ["deep_sea/3"])


def test_a_bare_number_is_that_id_of_each_experiment_given():
    assert sweeps.select(["catch", "deep_sea"], ["0", "5"]) == [
        "bsuite/catch/0", "bsuite/deep_sea/0", "bsuite/catch/5", "bsuite/deep_sea/5"]  # fmt: skip
    with pytest.raises(ConfigError, match="needs --experiments") as refused:
        sweeps.select(None, ["0"])
    assert "deep_sea/0" in str(refused.value)
    with pytest.raises(ConfigError, match="memory_len/30"):  # memory_len has 23 ids
        sweeps.select(["memory_len"], ["30"])


@pytest.mark.parametrize(("ids", "said"), [
    (["-1"], "--ids -1: give EXPERIMENT/N"),
    (["0.5"], "--ids 0.5: give EXPERIMENT/N"),
    (["catch"], "--ids catch: an experiment: --experiments catch sweeps its ids"),
    (["subset", "0"], "--ids subset stands alone"),
])  # fmt: skip
def test_an_id_that_is_none_is_named_as_given(ids, said):
    """``--ids -1`` was refused as the unknown id ``bsuite/-1``, and ``--ids subset 0`` as
    ``bsuite/subset``: names the user never wrote."""
    with pytest.raises(ConfigError, match=re.escape(said)) as refused:
        sweeps.select(["catch"], ids)
    assert "bsuite/" not in str(refused.value)


@pytest.mark.parametrize("episodes", [0, -3])
def test_a_sweep_of_no_episodes_is_refused_before_it_starts(episodes, tmp_path):
    """train's 0 means no episode limit, which would play an id past bsuite's budget."""
    with pytest.raises(ConfigError, match=f"--total-episodes must be >= 1.*got {episodes}"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], tmp_path / "out", progress=False,
                     total_episodes=episodes)  # fmt: skip
    assert not (tmp_path / "out").exists()


def replay_kept(run_dir) -> list[bool]:
    """Whether each checkpoint a run keeps holds its replay."""
    paths = sorted((run_dir / "checkpoints").glob("ckpt-*.pt"))
    return [torch.load(p, weights_only=True)["tables"] is not None for p in paths]


@SHARES_CATCH
def test_a_stopped_sweep_resumes_without_redoing_finished_ids(tmp_path, interrupt_at,
                                                              swept_catch):  # fmt: skip
    out = copy_of(swept_catch, tmp_path / "sweep")  # catch/0 finished, 3 episodes
    finished = (out / "catch-0" / "summary.json").stat().st_mtime_ns
    # catch/1 stopped on its way (in its third and last 9-step episode), as a killed sweep
    # leaves it.
    interrupt_at(20, signal.SIGTERM)
    stopped = rlherd.train("dqn", "bsuite/catch/1", run_dir=sweeps.run_path(out, "bsuite/catch/1"),
                           total_episodes=3, seed=1, progress=False)  # fmt: skip
    assert stopped.stopped and stopped.summary["episodes"] == 2
    assert replay_kept(out / "catch-1") == [True]  # to continue exactly
    (out / "catch-1" / "kept").touch()  # a new run (--overwrite) would start in an empty folder
    result, done = sweeps.sweep("dqn", ["bsuite/catch/0", "bsuite/catch/1"], out,
                                progress=False, total_episodes=3)  # fmt: skip
    assert done == ["bsuite/catch/0"] and not result.failed
    assert (out / "catch-0" / "summary.json").stat().st_mtime_ns == finished  # not redone
    assert (out / "catch-1" / "kept").exists()  # continued, not started again
    assert replay_kept(out / "catch-0") == replay_kept(out / "catch-1") == [False]
    data = csv_of(out / "catch-1")
    assert data["episode"].tolist() == [1, 2, 3]  # one stream: 1 and 2, then 3 continued
    # bsuite's loader reads the sweep's csv/ folder as it is.
    data, _ = csv_load.load_bsuite({"dqn": str(out / sweeps.CSV_DIR)})
    assert sorted(data["bsuite_id"].unique()) == ["catch/0", "catch/1"]


@SHARES_CATCH
def test_a_finished_id_keeps_its_policy_and_lets_go_of_its_replay(tmp_path, swept_catch):
    """A finished id is never continued, so its replay (gigabytes for R2D2) goes from its
    checkpoint as it finishes, and from ids a sweep finished before that, on the next sweep;
    its policy stays, for eval."""
    from rlherd.cli import main

    out = copy_of(swept_catch, tmp_path / "sweep")
    assert replay_kept(out / "catch-0") == [False]  # dropped by the sweep, as catch/0 finished
    assert main(["eval", str(out / "catch-0"), "--episodes", "2"]) == 0
    before = rlherd.train("dqn", "bsuite/catch/1", run_dir=sweeps.run_path(out, "bsuite/catch/1"),
                          total_episodes=3, seed=1, progress=False)  # finished without a sweep
    assert not before.stopped and replay_kept(out / "catch-1")[-1]
    held = RunDir(out / "catch-1")
    held.lock()  # as a process using the run holds it
    sweeps.sweep("dqn", ["bsuite/catch/0", "bsuite/catch/1"], out, progress=False,
                 total_episodes=3)  # fmt: skip
    assert replay_kept(out / "catch-1")[-1]  # left as it is
    held.unlock()
    _, done = sweeps.sweep("dqn", ["bsuite/catch/0", "bsuite/catch/1"], out, progress=False,
                           total_episodes=3)  # fmt: skip
    assert done == ["bsuite/catch/0", "bsuite/catch/1"]
    assert replay_kept(out / "catch-1") == [False]
    # A checkpoint that cannot be read (truncated; pickled by an old rlherd) stops no sweep.
    (checkpoint,) = (out / "catch-1" / "checkpoints").glob("ckpt-*.pt")
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    with pytest.warns(UserWarning, match="unreadable"):
        _, done = sweeps.sweep("dqn", ["bsuite/catch/1"], out, progress=False, total_episodes=3)
    assert done == ["bsuite/catch/1"]


def test_an_empty_folder_flag_is_refused_not_the_working_directory(tmp_path, monkeypatch):
    """``--out "$OUT"`` with ``OUT`` unset is ``--out ""``, which ``Path`` reads as ``.``: the
    sweep wrote its runs, ``csv/`` and ``sweep.json`` where the command was typed."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="--out is empty"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], "", progress=False, total_episodes=3)
    with pytest.raises(ConfigError, match="--kept is empty"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], "out", kept="", progress=False,
                     total_episodes=3)  # fmt: skip
    with pytest.raises(ConfigError, match="--output is empty"):
        sweeps.report([tmp_path], "")
    assert list(tmp_path.iterdir()) == []


def test_an_agent_that_cannot_act_in_bsuites_spaces_is_refused_once(tmp_path):
    """Every bsuite id's actions are Discrete: a sweep of sac started every id's process to
    fail there, a line and a log per id (115 for the subset)."""
    with pytest.raises(ConfigError, match="sac acts in continuous"):
        sweeps.sweep("sac", ["bsuite/catch/0", "bsuite/bandit/0"], tmp_path / "out",
                     progress=False, total_episodes=3)  # fmt: skip
    assert not (tmp_path / "out").exists()


@SHARES_CATCH
def test_a_deleted_run_leaves_no_link_in_the_sweeps_csv_folder(tmp_path, swept_catch):
    """An id's run deleted (to redo or drop it) and the sweep run again without it: ``csv/``,
    the folder bsuite's loader reads, kept a link to its CSV, and the loader failed on it."""
    out = copy_of(swept_catch, tmp_path / "sweep")  # catch/0 finished; bandit/0 added to it
    sweeps.sweep("dqn", ["bsuite/catch/0", "bsuite/bandit/0"], out, progress=False,
                 total_episodes=3)  # fmt: skip
    assert (out / sweeps.CSV_DIR / "bsuite_id_-_bandit-0.csv").is_symlink()
    shutil.rmtree(out / "bandit-0")
    sweeps.sweep("dqn", ["bsuite/catch/0"], out, progress=False, total_episodes=3)
    assert sorted(p.name for p in (out / sweeps.CSV_DIR).iterdir()) == [
        "bsuite_id_-_catch-0.csv"]  # fmt: skip
    data, _ = csv_load.load_bsuite({"dqn": str(out / sweeps.CSV_DIR)})
    assert set(data["bsuite_id"]) == {"catch/0"}


@pytest.mark.parametrize("key", ["seed", "jobs", "kept"])
def test_a_sweeps_own_option_given_by_set_is_one_line(key, tmp_path, capsys):
    """``--set seed=5`` (the sweep's ``--seed``, not an agent field) reached ``sweep()`` beside
    the flag's own value: a ``TypeError`` traceback (got multiple values for argument)."""
    from rlherd.cli import main

    assert main(["bsuite", "dqn", "--ids", "catch/0", "--out", str(tmp_path / "out"),
                 "--set", f"{key}=5"]) == 2  # fmt: skip
    assert f"--set {key}: not an agent field or runtime setting" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("setting", "said"), [
    ({"num_envs": 2}, "drop --num-envs"), ({"runtime": "mono"}, "single runtime"),
    ({"env_workers": 1}, "drop --env-workers"), ({"env_kwargs": {"size": 12}}, "no options")])
def test_a_setting_every_bsuite_run_refuses_is_refused_once(setting, said, tmp_path):
    """A setting no bsuite id's run takes was handed to every id's process, each of which
    failed on it (115 failures for the subset), leaving the folder with a log per id."""
    with pytest.raises(ConfigError, match=said):
        sweeps.sweep("dqn", ["bsuite/catch/0", "bsuite/bandit/0"], tmp_path / "out",
                     progress=False, total_episodes=3, **setting)  # fmt: skip
    assert not (tmp_path / "out").exists()


@SHARES_CATCH
def test_a_sweep_folder_keeps_one_agent_and_its_settings(tmp_path, swept_catch, failed_dqfd_sweep):
    out = copy_of(swept_catch, tmp_path / "sweep")  # dqn on catch/0, 3 episodes
    with pytest.raises(ConfigError, match="holds a sweep of dqn with another agent"):
        sweeps.sweep("ppo", ["bsuite/catch/2"], out, progress=False, total_episodes=3)
    # Its finished ids would be kept as they are: a full budget, or other fields, are refused...
    with pytest.raises(ConfigError, match="another settings"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], out, progress=False)
    with pytest.raises(ConfigError, match="another config"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], out, progress=False, total_episodes=3,
                     learning_rate=0.5)  # fmt: skip
    # ... but the same sweep written another way is the same sweep (the command line's text).
    _, done = sweeps.sweep("dqn", ["bsuite/catch/0"], out, progress=False, total_episodes="3",
                           learning_rate="0.001", preset="bsuite")  # fmt: skip
    assert done == ["bsuite/catch/0"]
    rlherd.train("ppo", "bsuite/catch/3", run_dir=tmp_path / "older" / "catch-3",
                 total_episodes=2, progress=False)  # fmt: skip
    with pytest.raises(ConfigError, match="without the sweep.json"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], tmp_path / "older", progress=False)
    # An id every run would refuse is refused once, before any process starts...
    with pytest.raises(ConfigError, match="n_step"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], tmp_path / "bad", progress=False, n_step=0)
    assert not (tmp_path / "bad").exists()
    # ... while a setting the agent's preset makes good is not (DQfD's demonstrations).
    sweeps.sweep("dqfd", ["bsuite/deep_sea/0"], tmp_path / "dqfd", progress=False,
                 total_episodes=3, demonstration_ratio=0.25)  # fmt: skip
    # A sweep whose every id failed before a checkpoint does not hold its folder.
    result, failed = failed_dqfd_sweep
    assert result.failed
    failed = copy_of(failed, tmp_path / "failed")
    assert not sweeps.sweep("dqn", ["bsuite/catch/0"], failed, progress=False,
                            total_episodes=3)[0].failed  # fmt: skip
    assert sweeps.select(None, ["deep_sea/0", "bsuite/deep_sea/0"]) == ["bsuite/deep_sea/0"]


@SHARES_CATCH
def test_a_run_directory_is_no_sweeps_folder(tmp_path, swept_catch):
    """``--out`` or ``--kept`` naming one id's run directory (``OUT/catch-0``, a slip of the
    shell) is refused before anything is written: the sweep would put its runs, ``csv/`` and
    ``sweep.json`` among that run's files."""
    out = copy_of(swept_catch, tmp_path / "sweep")
    before = sorted(p.name for p in (out / "catch-0").iterdir())
    with pytest.raises(ConfigError, match="--out .*catch-0 is a run directory"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], out / "catch-0", progress=False,
                     total_episodes=3)  # fmt: skip
    with pytest.raises(ConfigError, match="--kept .*catch-0 is a run directory"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], tmp_path / "other", progress=False,
                     kept=out / "catch-0", total_episodes=3)  # fmt: skip
    assert sorted(p.name for p in (out / "catch-0").iterdir()) == before
    assert not (tmp_path / "other").exists()


@SHARES_CATCH
def test_a_sweep_folder_of_finished_ids_without_checkpoints_keeps_its_settings(tmp_path,
                                                                               swept_catch):
    """Finished runs whose checkpoints were deleted (to free the disk) or never copied (kept
    results) still hold the folder to its settings: another budget is refused, not written
    over the folder's sweep.json with the old ids counted as done."""
    out = copy_of(swept_catch, tmp_path / "sweep")  # 3 episodes
    shutil.rmtree(out / "catch-0" / "checkpoints")
    with pytest.raises(ConfigError, match="another settings"):
        sweeps.sweep("dqn", ["bsuite/catch/0", "bsuite/catch/1"], out, progress=False,
                     total_episodes=7)  # fmt: skip
    assert '"total_episodes": 3' in (out / sweeps.SWEEP_FILE).read_text()


@SHARES_CATCH
def test_a_sweep_recorded_before_a_field_existed_continues_at_its_default(tmp_path, swept_catch):
    """A sweep of days goes on after an upgrade that added a config field or a setting: the
    folder's record, which lacks it, was swept with what its default does. Setting the new
    field to something else is still another sweep."""
    out = copy_of(swept_catch, tmp_path / "sweep")  # 3 episodes
    record = json.loads((out / sweeps.SWEEP_FILE).read_text())
    del record["config"]["double_q"], record["settings"]["torch_threads"]  # "not yet" fields
    (out / sweeps.SWEEP_FILE).write_text(json.dumps(record))
    _, done = sweeps.sweep("dqn", ["bsuite/catch/0", "bsuite/catch/1"], out, progress=False,
                           total_episodes=3)  # fmt: skip
    assert done == ["bsuite/catch/0"] and (out / "catch-1" / "summary.json").exists()
    with pytest.raises(ConfigError, match="another config"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], out, progress=False, total_episodes=3,
                     double_q=False)  # fmt: skip


@SHARES_CATCH
def test_a_sweep_starts_from_the_ids_kept_elsewhere_and_adds_those_it_finishes(tmp_path,
                                                                               swept_catch):
    """``--kept``: what the report reads of each finished id (config, summary, bsuite CSV; no
    checkpoints) is kept, an unfinished id is not, and a sweep in a fresh folder (another
    machine, a fresh clone) redoes none of what is kept, replaces an unfinished run of a kept
    id, and adds what it finishes."""
    from rlherd.cli import main

    first, kept, fresh = tmp_path / "first", tmp_path / "kept", tmp_path / "fresh"
    copy_of(swept_catch, first)  # catch/0 finished there: the command keeps it
    sweep = ["--total-episodes", "3", "--no-progress", "--kept", str(kept)]
    assert main(["bsuite", "dqn", "--ids", "catch/0", "--out", str(first), *sweep]) == 0
    begun = first / "catch-1"  # an id begun and not finished: its summary is not at budget
    shutil.copytree(first / "catch-0", begun)
    (begun / "summary.json").write_text('{"episodes": 1, "total_episodes": 3}')
    assert sweeps.copy_finished(first, kept, "bsuite/catch/0") == 0  # catch-1 is unfinished
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "catch-0/bsuite/bsuite_id_-_catch-0.csv", "catch-0/config.json", "catch-0/summary.json",
        sweeps.SWEEP_FILE]  # fmt: skip
    shutil.copytree(begun, fresh / "catch-0")  # stopped here, finished elsewhere
    shutil.copy2(first / sweeps.SWEEP_FILE, fresh / sweeps.SWEEP_FILE)
    result, done = sweeps.sweep("dqn", ["bsuite/catch/0", "bsuite/catch/2"], fresh,
                                progress=False, total_episodes=3, kept=kept)  # fmt: skip
    assert done == ["bsuite/catch/0"] and [r.config.env for r in result.runs] == ["bsuite/catch/2"]
    assert (kept / "catch-2" / "summary.json").exists()
    assert not (kept / "catch-2" / "checkpoints").exists() and not (kept / sweeps.PARTS).exists()
    data, _ = csv_load.load_bsuite({"dqn": str(fresh / sweeps.CSV_DIR)})
    assert sorted(data["bsuite_id"].unique()) == ["catch/0", "catch/2"]
    assert data[data["bsuite_id"] == "catch/0"]["episode"].max() == 3  # the finished one
    assert not (fresh / "catch-0" / "checkpoints").exists()  # nothing made in a kept id


@SHARES_CATCH
def test_a_kept_id_is_read_as_a_copy_without_a_policy_and_never_written(tmp_path, capsys,
                                                                       swept_catch):  # fmt: skip
    """A ``--kept`` id (config, summary, bsuite CSV) was read as a package that lost its policy
    ("package the run again"), or as a run "stopped before its first checkpoint", and opening it
    made empty checkpoints/ and metrics/ folders in it."""
    from rlherd.cli import main

    kept = tmp_path / "kept"  # the sweep finds catch/0 finished, and keeps it
    sweeps.sweep("dqn", ["bsuite/catch/0"], copy_of(swept_catch, tmp_path / "out"),
                 progress=False, total_episodes=3, kept=kept)  # fmt: skip
    copy = kept / "catch-0"
    before = sorted(p.relative_to(copy) for p in copy.rglob("*"))
    for argv in (["eval", str(copy)], ["package", str(copy), "-o", str(tmp_path / "pkg")],
                 ["train", "--resume", str(copy)], ["export", str(copy)]):  # fmt: skip
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err == (f"rlherd: error: {copy} holds a run's record and results without its "
                       "checkpoints/ (a copy, as a bsuite sweep's --kept folder keeps): no policy "
                       "or state to load; give the run it was copied from\n"), (argv, err)
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == before
    assert not (tmp_path / "pkg").exists()


@SHARES_TWO_AGENTS
def test_a_finished_id_whose_csv_is_gone_is_said_not_left_out_silently(tmp_path,
                                                                       two_agents_swept):
    """A finished id whose bsuite CSV was deleted stayed finished, and the report left it out
    of the scores without a word (and counted it among the ids both sweeps finished)."""
    for agent in ("dqn", "impala"):  # bandit/0 and deep_sea/0 finished, 30 episodes
        copy_of(two_agents_swept / agent, tmp_path / agent)
    (tmp_path / "dqn" / "deep_sea-0" / "bsuite" / "bsuite_id_-_deep_sea-0.csv").unlink()
    with pytest.warns(Warning, match="deep_sea-0 finished, but its bsuite CSV is gone"):
        _, done = sweeps.sweep("dqn", ["bsuite/bandit/0", "bsuite/deep_sea/0"], tmp_path / "dqn",
                               progress=False, total_episodes=30)  # fmt: skip
    assert done == ["bsuite/bandit/0", "bsuite/deep_sea/0"]
    notes = sweeps.notes([tmp_path / "dqn", tmp_path / "impala"])
    assert any("1 finished ids have no bsuite CSV (deep_sea-0)" in n for n in notes), notes
    assert any("finished different ids" in n and "dqn: 1" in n for n in notes), notes


@SHARES_CATCH
def test_resuming_a_sweeps_folder_names_the_command_that_continues_it(tmp_path, capsys,
                                                                     swept_catch):  # fmt: skip
    """A sweep's folder holds one run per id: ``train --resume`` of it names ``rlherd bsuite``
    with its agent, and one of its runs, where it said only that it was not a run."""
    from rlherd.cli import main

    out = copy_of(swept_catch, tmp_path / "sweep")
    assert main(["train", "--resume", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"`rlherd bsuite dqn --out {out}`" in err and f"--resume {out / 'catch-0'}" in err
    assert main(["train", "--resume", str(out / "catch-0"), "--no-progress"]) == 0  # a run is


@SHARES_CATCH
def test_a_kept_folder_holds_one_sweeps_settings(tmp_path, monkeypatch, swept_catch):
    """A kept folder of another sweep, or of runs without a record, is refused before anything
    is copied or run; one kept before an upgrade added a field is the same sweep; a copy cut
    short leaves the folder usable; a stopped sweep keeps the ids it finished."""
    kept = tmp_path / "kept"  # the sweep finds catch/0 finished, and keeps it
    sweeps.sweep("dqn", ["bsuite/catch/0"], copy_of(swept_catch, tmp_path / "first"),
                 progress=False, total_episodes=3, kept=kept)  # fmt: skip
    other = tmp_path / "other"
    with pytest.raises(ConfigError, match=re.escape(f"{kept} holds a sweep of dqn with another "
                                                    "settings; give another --kept")):
        sweeps.sweep("dqn", ["bsuite/catch/3"], other, progress=False, total_episodes=4,
                     kept=kept)  # fmt: skip
    assert not other.exists()
    sweeps.sweep("dqn", ["bsuite/catch/3"], other, progress=False, total_episodes=4)
    with pytest.raises(ConfigError, match="another settings"):
        sweeps.copy_finished(other, kept, "bsuite/catch/3")
    assert not (kept / "catch-3").exists()
    unknown = tmp_path / "unknown"  # runs kept without the record of how they were swept
    shutil.copytree(kept / "catch-0", unknown / "catch-0")
    with pytest.raises(ConfigError, match="without the sweep.json"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], tmp_path / "fresh", progress=False,
                     total_episodes=3, kept=unknown)  # fmt: skip
    assert not (tmp_path / "fresh").exists()
    with pytest.raises(ConfigError, match="is a file"):
        sweeps.sweep("dqn", ["bsuite/catch/0"], tmp_path / "fresh", progress=False,
                     total_episodes=3, kept=kept / sweeps.SWEEP_FILE)  # fmt: skip
    # A copy cut short: a part left behind is no run, and is copied again.
    shutil.copytree(kept / "catch-0", kept / sweeps.PARTS / "catch-4")
    # Kept before an upgrade added a field, and holding no finished id of the new one's: the
    # same sweep, continued from and added to.
    record = json.loads((kept / sweeps.SWEEP_FILE).read_text())
    del record["config"]["double_q"]
    (kept / sweeps.SWEEP_FILE).write_text(json.dumps(record))
    upgraded = tmp_path / "upgraded"
    _, done = sweeps.sweep("dqn", ["bsuite/catch/0", "bsuite/catch/4"], upgraded,
                           progress=False, total_episodes=3, kept=kept)  # fmt: skip
    assert done == ["bsuite/catch/0"] and (kept / "catch-4" / "summary.json").exists()
    assert not (kept / sweeps.PARTS).exists()
    # A sweep stopped by an error after its runs: the ids it finished are kept all the same.
    real = sweeps.run_group

    def run_then_fail(*args, **kwargs):
        real(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(sweeps, "run_group", run_then_fail)
    with pytest.raises(KeyboardInterrupt):
        sweeps.sweep("dqn", ["bsuite/catch/5"], upgraded, progress=False, total_episodes=3,
                     kept=kept)  # fmt: skip
    assert (kept / "catch-5" / "summary.json").exists()


def test_replicates_differ_by_their_seed_and_each_seed_reaches_every_layer(tmp_path):
    def returns(env_id: str, seed: int, logged: bool) -> list[float]:
        kwargs = {"results_dir": str(tmp_path / f"logged-{len(made)}")} if logged else {}
        made.append(env_id)
        env = rl_envs.make(env_id, **kwargs)
        env.reset(seed=seed)
        env.action_space.seed(0)
        rewards = []
        for _ in range(60):
            _, reward, term, trunc, _ = env.step(env.action_space.sample())
            rewards.append(reward)
            if term or trunc:
                env.reset()
        return rewards

    made = []
    # The sweep seeds bsuite/catch/N with N: its replicates are not one run.
    out = tmp_path / "sweep"
    sweeps.sweep("dqn", ["bsuite/catch/0", "bsuite/catch/1"], out, progress=False,
                 total_episodes=10)  # fmt: skip
    seeds = [RunDir(out / f"catch-{n}").read_config().seed for n in (0, 1)]
    assert seeds == [0, 1] and sweeps.id_seed(1, "bsuite/catch/19") == 1019
    assert not csv_of(out / "catch-0").equals(csv_of(out / "catch-1"))
    # bsuite's reward noise, a layer between Shimmy and the environment, takes the seed too.
    noisy = "bsuite/catch_noise/0"
    assert returns(noisy, 3, logged=True) == returns(noisy, 3, logged=True)
    assert returns(noisy, 3, logged=True) == returns(noisy, 3, logged=False)


def test_a_resumed_bsuite_run_writes_where_its_folder_is_now(tmp_path, interrupt_at,
                                                             monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    interrupt_at(100)
    rlherd.train("dqn", "bsuite/catch/0", run_dir="relative", total_episodes=30, progress=False)
    (tmp_path / "relative").rename(tmp_path / "moved")
    monkeypatch.chdir("/")
    rlherd.train(resume=tmp_path / "moved", progress=False)
    assert csv_of(tmp_path / "moved")["episode"].max() == 30


def test_a_bsuite_run_from_another_machine_goes_on_with_bsuites_counts(tmp_path, interrupt_at,
                                                                       monkeypatch):  # fmt: skip
    """Its pickled environment is never loaded on another machine (another snapshot key), but
    its checkpoint also holds bsuite's counts as plain data: a fresh environment takes them up,
    and bsuite's CSV goes on from the last episode that ended, logged at the same episodes as
    a run never stopped, its cumulative counts never falling back. (It was refused, and the
    run's episodes were lost.)"""
    interrupt_at(100)  # catch's episodes are 9 steps: stopped within the 12th
    rlherd.train("dqn", "bsuite/catch/0", run_dir=tmp_path / "run", total_episodes=30,
                 progress=False)  # fmt: skip
    before = csv_of(tmp_path / "run")
    logged = [e for e in range(1, 31) if wrappers._logarithmic_logging(e)]  # bsuite's choice
    assert before["episode"].tolist() == logged[:10]
    monkeypatch.setenv("RLHERD_SNAPSHOT_KEY", str(tmp_path / "another-machines.key"))
    with pytest.warns(UserWarning, match="not written on this machine"):
        rlherd.train(resume=tmp_path / "run", progress=False)
    after = csv_of(tmp_path / "run")
    assert after["episode"].tolist() == logged  # 1-10, 12, 14, 17, 20, 25, 30
    pd.testing.assert_frame_equal(after.iloc[: len(before)], before)
    for counter in ("steps", "total_regret"):  # each a running total
        assert after[counter].is_monotonic_increasing, after[counter].tolist()
    assert after["steps"].iloc[-1] > 30 * 9 - 9  # every episode's steps, in the one stream


@SHARES_TWO_AGENTS
def test_the_report_scores_two_agents_with_bsuites_analysis(tmp_path, two_agents_swept):
    for agent in ("dqn", "impala"):  # bandit/0 and deep_sea/0, 30 episodes, neither failed
        copy_of(two_agents_swept / agent, tmp_path / agent)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        scored = sweeps.report([tmp_path / "dqn", tmp_path / "impala"], tmp_path / "report")
    # bsuite's own code warns under newer pandas and matplotlib: nothing a user can act on.
    assert not [w for w in said if "bsuite" in w.filename], [str(w.message) for w in said]
    table, categories = scored
    assert list(table.columns) == ["dqn", "impala"]
    assert list(table.index) == ["bandit", "deep_sea"]
    assert np.isfinite(table.to_numpy()).all()
    for name in ("radar.png", "bars.png", "scores.csv", "categories.csv", "scores.md", "runs.md"):
        assert (tmp_path / "report" / name).stat().st_size > 0
    # runs.md says how each agent's ids ran: their wall time, and the machine and commit of each
    # experiment's, as the ids' own records say.
    runs = (tmp_path / "report" / "runs.md").read_text()
    record = json.loads((tmp_path / "dqn" / "deep_sea-0" / "summary.json").read_text())
    minutes = sum(json.loads((tmp_path / "dqn" / f"{e}-0" / "summary.json").read_text())[
        "wall_time_s"] / 60 for e in ("bandit", "deep_sea"))  # fmt: skip
    assert f"| dqn | 2 | {minutes:,.1f} |" in runs  # a short sweep is not "0" minutes
    assert ("| impala | deep_sea | 1 | " in runs and f"| {record['machine']['cpu']} | "
            f"{record['machine']['commit'][:7]}" in runs)  # fmt: skip
    # A category of a partial sweep is bsuite's mean over the experiments measured, said as such:
    # exploration here is deep sea alone (bsuite has three), and memory has nothing.
    assert categories.loc["exploration", sweeps.EXPERIMENTS] == 3
    assert categories.loc["exploration", "dqn measured"] == 1
    assert categories.loc["exploration", "dqn"] == table.loc["deep_sea", "dqn"]
    assert categories.loc["basic", "impala"] == table.loc["bandit", "impala"]
    assert np.isnan(categories.loc["memory", "dqn"])
    assert categories.loc["memory", "dqn measured"] == 0
    assert f"| exploration (3) | {table.loc['deep_sea', 'dqn']:.3f} (1) |" in (
        tmp_path / "report" / "scores.md").read_text()
    # bsuite's radar draws neither agent whole (that needs all seven categories): said so.
    gaps = sweeps.radar_gaps(categories)
    assert len(gaps) == 1
    assert "not at all: dqn (basic, exploration); impala (basic, exploration)" in gaps[0]
    assert not hasattr(pd.Series, "append")  # pandas is given back as it was
    notes = sweeps.notes([tmp_path / "dqn", tmp_path / "impala"])
    assert len(notes) == 2 and "fewer episodes than bsuite's budget" in notes[0]
    # Two sweeps of one agent in folders of one name are told apart by their parents'.
    shutil.copytree(tmp_path / "dqn", tmp_path / "again" / "dqn", symlinks=True)
    table = sweeps.report([tmp_path / "dqn", tmp_path / "again" / "dqn"], tmp_path / "twice")
    assert set(table.experiments.columns) == {f"{tmp_path.name}-dqn", "again-dqn"}
    # One sweep given twice would be scored as two agents.
    with pytest.raises(ConfigError, match="given twice; give each sweep once"):
        sweeps.report([tmp_path / "dqn", tmp_path / "again" / ".." / "dqn"], tmp_path / "same")


@SHARES_TWO_AGENTS
def test_runs_of_an_installed_rlherd_are_reported_without_a_commit(tmp_path, two_agents_swept):
    """A run of rlherd installed from a wheel (no git checkout) records its commit as None:
    ``bsuite-report`` failed on it with a TypeError while writing runs.md."""
    sweep = copy_of(two_agents_swept / "dqn", tmp_path / "dqn")
    for path in [*sweep.glob("*/config.json"), *sweep.glob("*/summary.json")]:  # first and last
        record = json.loads(path.read_text())
        record["machine"]["commit"] = None
        path.write_text(json.dumps(record))
    runs = sweeps.runs_markdown([sweep], ["dqn"])
    assert "| dqn | deep_sea | 1 | " in runs and "| none (not a git checkout) |" in runs, runs


def test_mnist_without_its_download_is_one_line(monkeypatch):
    from urllib.error import URLError

    from bsuite.utils import datasets

    def offline(url, *args, **kwargs):  # a machine without MNIST that cannot reach it
        raise URLError("no network")

    monkeypatch.setattr(datasets, "_download", offline)
    with pytest.raises(ConfigError, match="needs MNIST, which bsuite downloads into /tmp/mnist"):
        rl_envs.make("bsuite/mnist/0")
    # Its budget, which a report reads for every id, needs no MNIST.
    from rlherd.envs.bsuite import episode_budget

    assert episode_budget("bsuite/mnist/0") == 10_000


@pytest.mark.parametrize("env_id", ["bsuite/mnist/0", "bsuite/mnist_noise/0"])
def test_copies_of_mnist_share_its_images(monkeypatch, env_id):
    """MCTS copies the environment at every node: an MNIST bandit's copies share its images
    (60,000 of them, which a step only reads) instead of copying them each time."""
    import copy

    from bsuite.utils import datasets

    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 128, (50, 28, 28), np.int8), rng.integers(0, 10, 50, np.uint8)
    monkeypatch.setattr(datasets, "load_mnist", lambda: ((images, labels), (images, labels)))
    env = rl_envs.make(env_id)
    env.reset(seed=0)
    imagined = copy.deepcopy(env)

    def bandit(wrapped):  # under bsuite's noise wrapper, if any
        while "_env" in vars(wrapped):
            wrapped = wrapped._env
        return wrapped

    assert bandit(imagined._env)._images is bandit(env._env)._images
    assert imagined.step(3)[1:3] == env.step(3)[1:3]


def test_deep_seas_expert_gives_the_acme_papers_demonstrations():
    from rlherd.replay.demonstrations import expert_episodes

    (one,) = expert_episodes("bsuite/deep_sea/0", {}, None, seed=0)  # one is enough (4.8)
    assert np.sum(one.rewards) == pytest.approx(0.99)  # the optimal return: it always goes right
    windy = expert_episodes("bsuite/deep_sea_stochastic/0", {}, None, seed=0)
    returns = np.array([np.sum(e.rewards) for e in windy])
    assert len(windy) == 10 * 10  # size * 10
    assert (returns > 0).sum() == 80  # 80% successful, though the expert succeeds far less often
    assert len(expert_episodes("bsuite/deep_sea_stochastic/0", {}, 3, seed=0)) == 3
    with pytest.raises(ConfigError, match="no scripted expert"):
        expert_episodes("bsuite/catch/0", {}, None, seed=0)


def test_copies_searched_by_mcts_never_reach_bsuites_csv(tmp_path):
    import copy

    env = rl_envs.make("bsuite/bandit/0", results_dir=str(tmp_path))
    env.reset(seed=0)
    env.step(0)  # one real episode: the CSV's first row
    for _ in range(5):  # imagined episodes, as a search steps copies of the environment
        imagined = copy.deepcopy(env)
        imagined.reset()
        imagined.step(1)
    data, _ = csv_load.load_bsuite({"agent": str(tmp_path)})
    assert data["episode"].tolist() == [1]
    run = rlherd.train("mcts", "bsuite/catch/0", run_dir=tmp_path / "run", total_episodes=12,
                       progress=False)  # fmt: skip
    data = csv_of(tmp_path / "run")
    assert data["episode"].max() == 12 and data["steps"].max() == 12 * 9
    assert run.summary["episodes"] == 12


@pytest.mark.parametrize("env_id", ["bsuite/deep_sea_stochastic/0", "bsuite/deep_sea/0",
                                    "bsuite/catch_noise/2"])  # fmt: skip
def test_a_copy_of_a_bsuite_environment_steps_as_it_and_never_moves_it(env_id, tmp_path):
    """MCTS searches copies (a copy shares what a step never changes: deep sea's action mapping,
    a deterministic sea's generator, whose draws it never reads, so only there a copy's steps
    move the environment's generator). A copy steps as the environment would, random draws
    included (the windy sea's moves, the noisy rewards), and stepping it leaves the environment
    where it was, its generators included (but the deterministic sea's)."""
    import copy

    def play(env, actions) -> list:
        steps = []
        for a in actions:
            obs, reward, terminated, _, _ = env.step(int(a))
            steps.append((np.asarray(obs).tolist(), float(reward), bool(terminated)))
        return steps

    def generators(env) -> list:  # the states of the generators a step reads
        layer, states = env._env._env, []  # under bsuite's logger
        while layer is not None:
            if "_rng" in vars(layer):  # the key as a list: arrays do not compare as one bool
                kind, key, *rest = layer._rng.get_state()
                states.append((kind, key.tolist(), *rest))
            layer = vars(layer).get("_env")
        return [] if vars(env._env._env).get("_deterministic") else states

    env = rl_envs.make(env_id, results_dir=str(tmp_path))  # logged, as a sweep's are
    env.reset(seed=3)
    env.step(1)
    actions = np.random.default_rng(0).integers(0, env.action_space.n, 6)
    before = generators(env)
    first, second = copy.deepcopy(env), copy.deepcopy(env)
    imagined = play(first, actions)
    assert generators(env) == before  # the copy drew from generators of its own
    assert play(second, actions) == imagined
    assert play(env, actions) == imagined  # the environment did not move while they stepped
    if env_id == "bsuite/deep_sea/0":
        assert first._env._action_mapping is env._env._env._action_mapping  # shared


def _seeded(tmp_path, name: str, env_id: str = "bsuite/catch/0"):
    """A bsuite environment (catch by default), seeded and logged into its own folder, as a
    sweep's are."""
    env = rl_envs.make(env_id, results_dir=str(tmp_path / name))
    env.reset(seed=3)
    return env


def _next_ball(env) -> list:
    """Play catch's episode out; the next episode's first observation (its ball's column)."""
    while not env.step(1)[2]:
        pass
    return np.asarray(env.reset()[0]).tolist()


def test_copies_share_a_generator_until_one_of_them_draws(monkeypatch, tmp_path):
    """A search copies the environment at every node, and catch draws only when an episode
    starts (the ball's column), which a search's copies never reach: they share its generator
    and copy none. One that does start an episode takes a generator of its own first, so the
    environment, its copies and their copies each draw as one never copied would."""
    import copy

    from rlherd.envs import bsuite_env

    taken, copied = [], bsuite_env._copied
    monkeypatch.setattr(bsuite_env, "_copied", lambda rng: taken.append(rng) or copied(rng))

    alone = _next_ball(_seeded(tmp_path, "alone"))
    env = _seeded(tmp_path, "searched")
    searched = [copy.deepcopy(env) for _ in range(5)]
    for imagined in searched:
        imagined.step(0)  # a step of catch draws nothing
    deeper = copy.deepcopy(searched[0])
    assert not taken
    assert _next_ball(deeper) == _next_ball(searched[1]) == _next_ball(env) == alone
    assert len(taken) == 3


def test_a_copied_environments_np_random_and_pickles_draw_as_if_never_copied(tmp_path):
    """Sharing stays out of sight: ``np_random`` (Shimmy's, which bsuite's logger holds too) is
    still the generator the environment draws from, and an environment pickled beside its copy
    (a checkpoint, or snapshots sent elsewhere) unpickles with generators of their own."""
    import copy
    import pickle

    def played(env) -> list:  # two episodes, a draw through np_random between them
        first = _next_ball(env)
        env.np_random.randint(5)
        return [first, _next_ball(env)]

    alone, env = _seeded(tmp_path, "alone"), _seeded(tmp_path, "copied")
    imagined = copy.deepcopy(env)
    env_again, imagined_again = pickle.loads(pickle.dumps([env, imagined]))
    assert played(env) == played(alone)
    assert _next_ball(imagined_again) == _next_ball(env_again) == _next_ball(imagined)
    assert type(env_again._env._env._rng) is np.random.RandomState  # a checkpoint holds no holder


@pytest.mark.parametrize("env_id", ["bsuite/cartpole/0", "bsuite/cartpole_swingup/0",
                                    "bsuite/cartpole_noise/3"])  # fmt: skip
def test_a_bsuite_cartpole_pickles_and_its_copies_start_episodes_on_their_own(env_id, tmp_path):
    """bsuite's cartpoles draw each episode's start through a function bound to the environment
    they were made as: pickle refused it (a checkpoint held no snapshot of the environment),
    and a copy that started an episode drew from its source's generator. Now a copy and an
    unpickled environment each start their episodes as one never copied would."""
    import copy
    import pickle

    def starts(env, n: int = 2) -> list:
        return [np.asarray(env.reset()[0]).tolist() for _ in range(n)]

    alone = starts(_seeded(tmp_path, "alone", env_id))
    env = _seeded(tmp_path, "copied", env_id)
    assert starts(copy.deepcopy(env)) == alone
    assert starts(env) == alone  # the copy's episodes left its generator where it was
    # The test's own bytes, pickled a line before: nothing from a file is loaded.
    assert starts(pickle.loads(pickle.dumps(_seeded(tmp_path, "pickled", env_id)))) == alone


def test_a_stopped_bsuite_cartpole_run_resumes_as_if_never_stopped(tmp_path, interrupt_at):
    """The resumed run's environment is its checkpoint's (bsuite's CSV, and the episode and
    generator it was at), so its episodes are those of a run never stopped."""
    rlherd.train("dqn", "bsuite/cartpole/0", run_dir=tmp_path / "whole", total_episodes=12,
                 progress=False)  # fmt: skip
    interrupt_at(150)
    run = rlherd.train("dqn", "bsuite/cartpole/0", run_dir=tmp_path / "run", total_episodes=12,
                       progress=False)  # fmt: skip
    assert run.stopped and run.summary["episodes"] < 12
    rlherd.train(resume=tmp_path / "run", progress=False)
    resumed, whole = (csv_of(tmp_path / d).drop(columns="results_dir") for d in ("run", "whole"))
    pd.testing.assert_frame_equal(resumed, whole)


@pytest.mark.slow
def test_demonstrations_solve_deep_sea_where_dqn_does_not(tmp_path):
    """Figure 11's claim on bsuite's smallest deep sea (size 10), at 500 of its 10,000 episodes,
    judged by bsuite's own analysis: DQfD with the paper's one demonstration solves it, and DQN,
    which must find the treasure by itself (once in 2^10 episodes of random actions), does not.
    (Measured: DQfD solved it from episode 400, DQN had not reached it at 500.)"""
    from bsuite.experiments.deep_sea import analysis

    scores = {}
    for agent in ("dqfd", "dqn"):
        rlherd.train(agent, "bsuite/deep_sea/0", run_dir=tmp_path / agent, total_episodes=500,
                     seed=0, progress=False)  # fmt: skip
        with sweeps.pandas_1():
            scores[agent] = analysis.score(csv_of(tmp_path / agent))
    assert scores == {"dqfd": 1.0, "dqn": 0.0}


def test_a_failed_id_is_one_line_naming_it(tmp_path, capsys):
    from rlherd.cli import main

    out, sweep = tmp_path / "sweep", ["--total-episodes", "3", "--no-progress"]
    assert main(["bsuite", "dqfd", "--ids", "deep_sea/0", "--out", str(out), *sweep]) == 0
    # A finished id is kept, and the next one fails in its own run (catch has no expert to
    # give DQfD its demonstrations): named by its id, not by its place among the unfinished.
    code = main(["bsuite", "dqfd", "--ids", "deep_sea/0", "catch/0", "--out", str(out), *sweep])
    err = capsys.readouterr().err
    assert code == 1
    assert "rlherd: error: bsuite/catch/0 failed:" in err and "no scripted expert" in err
    assert "1 of 2 ids were finished already and kept" in err


@pytest.mark.slow
def test_r2d2_remembers_where_dqn_cannot(tmp_path):
    """Figure 10's memory claim on bsuite's memory_len of length 5, at 1,000 of its 10,000
    episodes, judged by bsuite's own analysis: R2D2's LSTM carries the context to the query
    (measured: nearly every episode perfect from episode 500), DQN, which sees one step, stays
    at chance."""
    from bsuite.experiments.memory_len import analysis

    scores = {}
    for agent in ("r2d2", "dqn"):
        rlherd.train(agent, "bsuite/memory_len/4", run_dir=tmp_path / agent,
                     total_episodes=1_000, seed=0, progress=False)  # fmt: skip
        with sweeps.pandas_1():
            scores[agent] = analysis.score(csv_of(tmp_path / agent))
    assert scores == {"r2d2": 1.0, "dqn": 0.0}


def test_a_report_of_runs_too_short_for_bsuites_analysis_is_one_line(tmp_path):
    result, _ = sweeps.sweep("dqn", ["bsuite/deep_sea_stochastic/0"], tmp_path / "dqn",
                             progress=False, total_episodes=5)  # fmt: skip
    assert not result.failed
    with pytest.raises(ConfigError, match="fewer episodes than bsuite's budget"):
        sweeps.report([tmp_path / "dqn"], tmp_path / "report")  # its analysis starts at 100
    assert not (tmp_path / "report").exists()  # a refused report leaves no folder behind


@SHARES_CATCH
def test_a_refused_report_leaves_no_output_folder(tmp_path, failed_dqfd_sweep):
    """A report refused for its sweeps (one that holds no run, or none finished) writes
    nothing: ``-o`` is made only once there is something to put in it."""
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no bsuite run"):
        sweeps.report([tmp_path / "empty"], tmp_path / "report")
    result, failed = failed_dqfd_sweep  # catch has no expert: the id fails at once
    assert result.failed
    with pytest.raises(ConfigError, match="no finished bsuite run"):
        sweeps.report([copy_of(failed, tmp_path / "failed")], tmp_path / "report")
    assert not (tmp_path / "report").exists()


@SHARES_CATCH
def test_a_report_of_one_ids_run_names_the_sweep_that_holds_it(tmp_path, swept_catch):
    """``bsuite-report OUT/catch-0`` (one id's run, not its sweep) was told the folder holds
    no bsuite run, and to sweep into it: a sweep inside a run directory."""
    copy_of(swept_catch, tmp_path / "out")
    with pytest.raises(ConfigError, match=r"catch-0 is a run directory; give the sweep's "
                                          r"folder, .* \(that holds it: .*out\)"):
        sweeps.report([tmp_path / "out" / "catch-0"], tmp_path / "report")


def test_until_solved_stops_a_solved_deep_sea_which_bsuite_scores_as_its_whole_budget(tmp_path):
    """DQfD with its one demonstration solves deep sea of size 10 by episode 400 of 10,000
    (measured: 400): ``until_solved`` stops it there, and the sweep and bsuite's analysis count
    it finished and solved, as they would the whole budget."""
    from bsuite.experiments.deep_sea import analysis

    out = tmp_path / "dqfd"
    result, done = sweeps.sweep("dqfd", ["bsuite/deep_sea/0"], out, progress=False,
                                until_solved=True, log_interval_s=0.5)  # fmt: skip
    assert not result.failed and done == []
    summary = result.runs[0].summary
    assert summary["total_episodes"] == 10_000 and summary["episodes"] < 2_000
    assert summary["stopped_by"].startswith("UntilSolved: bsuite counts it solved at episode")
    with sweeps.pandas_1():
        assert analysis.score(csv_of(out / "deep_sea-0")) == 1.0
    assert sweeps.sweep("dqfd", ["bsuite/deep_sea/0"], out, progress=False,
                        log_interval_s=0.5)[1] == ["bsuite/deep_sea/0"]  # finished: kept
    assert sweeps.report([out], tmp_path / "report").experiments.loc["deep_sea", "dqfd"] == 1.0
    assert any("1 ids stopped once solved" in note for note in sweeps.notes([out]))
    # The stochastic sea's analysis is its own (from episode 100, a stricter threshold).
    from bsuite.experiments.deep_sea_stochastic import analysis as stochastic

    run = rlherd.train("dqfd", "bsuite/deep_sea_stochastic/0", run_dir=tmp_path / "windy",
                       callbacks=[sweeps.UntilSolved()], log_interval_s=0.5, progress=False)
    assert run.summary["stopped_by"].startswith("UntilSolved") and run.summary["episodes"] < 2_000
    with sweeps.pandas_1():
        assert stochastic.score(csv_of(tmp_path / "windy")) == 1.0
    # Unsolved, a run plays on (DQN finds no treasure in 30 episodes of a 10-step sea).
    run = rlherd.train("dqn", "bsuite/deep_sea/0", run_dir=tmp_path / "dqn", total_episodes=30,
                       callbacks=[sweeps.UntilSolved()], log_interval_s=0.1, progress=False)
    assert run.summary["episodes"] == 30 and run.summary.get("stopped_by") is None
    with pytest.raises(ConfigError, match="bsuite/catch/0 is not one: drop it"):
        rlherd.train("dqn", "bsuite/catch/0", run_dir=tmp_path / "catch", total_episodes=3,
                     callbacks=[sweeps.UntilSolved()], progress=False)  # fmt: skip
