"""Nothing lost, nothing silent: runs that would overwrite, merge or misreport other runs."""

import json
import signal
import subprocess
import sys
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

import rlherd
from rlherd.commands.train import _new_run_dir
from rlherd.envs.vector import alive
from rlherd.errors import ConfigError, TrainingDiverged
from rlherd.run.recorder import Recorder
from rlherd.run.rundir import RunDir

BANDIT = dict(total_steps=320, progress=False)


def test_a_run_dir_holding_a_run_is_refused_and_left_alone(tmp_path):
    rlherd.train("impala", "rlherd/Bandit-v0", run_dir=tmp_path, **BANDIT)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match=f"--resume {tmp_path}"):
        rlherd.train("ppo", "rlherd/Bandit-v0", run_dir=tmp_path, **BANDIT)
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    # Replacing it is explicit, and leaves nothing of the old run behind.
    rlherd.train("ppo", "rlherd/Bandit-v0", run_dir=tmp_path, overwrite=True, **BANDIT)
    assert json.loads((tmp_path / "config.json").read_text())["agent"] == "ppo"
    assert len(list((tmp_path / "checkpoints").glob("*.pt"))) == 1


def test_a_config_error_found_by_the_runtime_leaves_no_run_behind(tmp_path):
    """(Caught only when the runtime builds its buffers: batch_size 8 over 3 environments.)"""
    kw = dict(runtime="mono", envs_per_actor=3, run_dir=tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match="multiple of envs_per_actor"):
        rlherd.train("ppo", "CartPole-v1", **kw)
    assert not (tmp_path / "run").exists()  # so the corrected command may use the directory


def test_a_non_empty_directory_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty and holds no run"):
        rlherd.train("impala", "rlherd/Bandit-v0", run_dir=tmp_path, overwrite=True, **BANDIT)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_runs_started_in_the_same_second_get_their_own_directories(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("rlherd.commands.train.time.strftime", lambda fmt: "20261122-120000")
    paths = [_new_run_dir(None, "impala", "CartPole-v1", False).path for _ in range(3)]
    assert len(set(paths)) == 3 and all((tmp_path / p / "metrics").is_dir() for p in paths)


@pytest.mark.parametrize("steps", [0, -5])
def test_zero_or_negative_budgets_are_errors(steps, tmp_path):
    with pytest.raises(ConfigError, match="total_steps must be positive"):
        rlherd.train("impala", "rlherd/Bandit-v0", run_dir=tmp_path / "a", total_steps=steps,
                     progress=False)  # fmt: skip
    rlherd.train("impala", "rlherd/Bandit-v0", run_dir=tmp_path / "b", **BANDIT)
    with pytest.raises(ConfigError, match="total_steps must be positive"):
        rlherd.train(resume=tmp_path / "b", total_steps=steps, progress=False)


def test_resume_keeps_the_summarys_extras(tmp_path):
    kw = dict(eval_every=320, eval_episodes=2, progress=False)
    first = rlherd.train("impala", "rlherd/Bandit-v0", run_dir=tmp_path, total_steps=320, **kw)
    assert "eval_return_mean" in first.summary
    resumed = rlherd.train(resume=tmp_path, total_steps=400, eval_every=0, progress=False)
    assert resumed.summary["eval_return_mean"] == first.summary["eval_return_mean"]


def test_eval_episodes_given_alone_to_a_resumed_run_evaluates_at_its_end(tmp_path):
    """``--eval-episodes`` alone evaluates a new run once, at its end; a resumed run that never
    evaluated takes it the same way, rather than keeping its period of 0 and ignoring it."""
    rlherd.train("impala", "rlherd/Bandit-v0", run_dir=tmp_path, **BANDIT)
    resumed = rlherd.train(resume=tmp_path, total_steps=400, eval_episodes=2, progress=False)
    assert resumed.summary["eval_episodes"] == 2
    evaluations = (tmp_path / "metrics" / "evaluator.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in evaluations[1:]] == ["400"]


def test_resume_refuses_what_it_cannot_honour_and_applies_new_evaluations(
    capsys, monkeypatch, tmp_path
):
    """A flag given with --resume either takes effect or is an error naming it: never ignored
    (--runtime, --seed, the agent and --env were silently dropped before)."""
    from rlherd.cli import main

    run = str(tmp_path / "run")
    rlherd.train("impala", "rlherd/Bandit-v0", run_dir=run, seed=1, **BANDIT)
    before = (tmp_path / "run" / "config.json").read_text()
    refused = {
        ("--runtime", "mono"): "runtime 'single'); drop --runtime 'mono'",
        ("--seed", "2"): "seed 1); drop --seed 2",
        ("--set", "learning_rate=0.1"): "drop --set learning_rate",
        ("--num-envs", "4"): "drop --num-envs",
        ("--preset", "classic"): "drop --preset",
        ("--run-dir", str(tmp_path / "other")): "drop --run-dir",
    }
    for flag, message in refused.items():
        assert main(["train", "--resume", run, "--total-steps", "640", "--no-progress", *flag]) == 2
        assert message in capsys.readouterr().err
    assert main(["train", "ppo", "--resume", run, "--no-progress"]) == 2
    assert "drop the agent 'ppo'" in capsys.readouterr().err
    assert main(["train", "--env", "CartPole-v1", "--resume", run, "--no-progress"]) == 2
    assert "drop --env 'CartPole-v1'" in capsys.readouterr().err
    assert (tmp_path / "run" / "config.json").read_text() == before  # nothing was trained
    # The run's own values are no change; new evaluations apply to the steps still to come, and
    # the machine's settings (the device, the cluster's address) are the resumed run's own.
    monkeypatch.chdir(tmp_path)  # the same directory, named another way, is no change
    assert main(["train", "impala", "--env", "rlherd/Bandit-v0", "--seed", "1", "--resume", run,
                 "--run-dir", "run", "--total-steps", "640", "--eval-every", "160",
                 "--eval-episodes", "2", "--device", "cpu", "--no-progress"]) == 0  # fmt: skip
    capsys.readouterr()
    evaluations = (tmp_path / "run" / "metrics" / "evaluator.csv").read_text().splitlines()
    assert [row.split(",")[0] for row in evaluations[1:]] == ["480", "640"]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert (config["eval_every"], config["eval_episodes"]) == (160, 2)


def test_train_to_continues_a_stopped_run_leaves_a_finished_one_and_retrains_the_rest(
    tmp_path,
):
    from rlherd.commands.train import train_to

    run = tmp_path / "run"
    rlherd.train("impala", "rlherd/Bandit-v0", run_dir=run, seed=3, **BANDIT)
    # What a run of 640 steps stopped at 320 leaves behind: its config asks for 640.
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "total_steps": 640}))
    (run / "marker").write_text("a run trained again from the start (overwritten) loses this")
    continued = train_to("impala", "rlherd/Bandit-v0", run, 640, seed=3, progress=False)
    assert continued.summary["actor_steps"] == 640 and (run / "marker").exists()
    episodes = (run / "metrics" / "train.csv").read_text()
    for steps in (640, 480):  # finished, or longer than asked: left as it is
        again = train_to("impala", "rlherd/Bandit-v0", run, steps, seed=3, progress=False)
        assert again.summary == continued.summary
    # A run from before a config field was added (recorded without it: its default) too.
    config = json.loads((run / "config.json").read_text())
    del config["config"]["obs_encoders"]
    (run / "config.json").write_text(json.dumps(config))
    again = train_to("impala", "rlherd/Bandit-v0", run, 640, seed=3, progress=False)
    assert again.summary == continued.summary and (run / "marker").exists()
    assert (run / "metrics" / "train.csv").read_text() == episodes  # nothing more trained
    # Another seed, or a finished run shorter than asked (its schedules ended at its own
    # length), is trained again from the start.
    other_seed = train_to("impala", "rlherd/Bandit-v0", run, 640, seed=4, progress=False)
    assert other_seed.config.seed == 4 and not (run / "marker").exists()
    (run / "marker").write_text("")
    longer = train_to("impala", "rlherd/Bandit-v0", run, 800, seed=4, progress=False)
    assert longer.summary["actor_steps"] == 800 and not (run / "marker").exists()
    # So is a directory holding no checkpoint (a run killed before its first one).
    for path in (run / "checkpoints").iterdir():
        path.unlink()
    (run / "marker").write_text("")
    fresh = train_to("impala", "rlherd/Bandit-v0", run, 320, seed=3, progress=False)
    assert fresh.summary["actor_steps"] == 320 and not (run / "marker").exists()


def test_counts_kept_per_session_add_up_across_resumes(tmp_path):
    def recorder() -> Recorder:
        return Recorder(RunDir(tmp_path, create=True), dict(agent="a", env="e", runtime="r"),
                        100, progress=False)  # fmt: skip

    first = recorder()
    first.set_run_count("actor_restarts", 2)
    state = first.state_dict()
    second = recorder()
    second.load_state_dict(state)
    assert second.summary()["actor_restarts"] == 2  # before this session restarts any
    second.set_run_count("actor_restarts", 1)
    assert second.summary()["actor_restarts"] == 3


@pytest.mark.parametrize("damage", [b"", b"PK\x03\x04 truncated"])
def test_an_unreadable_latest_checkpoint_falls_back_to_the_one_before(damage, tmp_path):
    rundir = RunDir(tmp_path, create=True)
    rundir.save_checkpoint({"step": 1}, 1)
    newest = rundir.save_checkpoint({"step": 2}, 2)
    newest.write_bytes(damage)
    with pytest.warns(UserWarning, match=newest.name):
        assert rundir.load_checkpoint() == {"step": 1}
    (rundir.checkpoint_dir / "ckpt-000000000001.pt").write_bytes(damage)
    with pytest.warns(UserWarning), pytest.raises(FileNotFoundError, match="no readable"):
        rundir.load_checkpoint()


@pytest.mark.parametrize(
    "agent, runtime, lr",
    # PPO's Adam steps and clipped gradients stay finite up to about 1e10 (it then trains a
    # collapsed policy, which no check of finiteness can tell from learning); 1e30 overflows.
    # IMPALA's RMSProp moves every weight by about lr / sqrt(1 - alpha) in its first step: on
    # mono, whose actors have a batch ready at once, 1e12 stops the run at learner step 1, before
    # its first checkpoint; 1e2 at step 8-10, after several.
    [("impala", "single", 1e12), ("dqn", "single", 1e12), ("ppo", "single", 1e30),
     ("impala", "mono", 1e2)],
)  # fmt: skip
def test_a_diverging_run_stops_clearly_and_checkpoints_nothing_non_finite(agent, runtime, lr,
                                                                          tmp_path):
    """A huge learning rate: the run stops at the steps that went non-finite (those since the
    last learner row, which every checkpoint writes), naming the cause (in mono too, not blaming
    its actors), and the checkpoints it wrote on the way (one per step here) are all finite."""
    with pytest.raises(TrainingDiverged, match=r"learner steps? [\d-]+: .*learning rate"):
        rlherd.train(agent, "CartPole-v1", runtime=runtime, run_dir=tmp_path, progress=False,
                     total_steps=30_000, learning_rate=lr, checkpoint_interval_s=0.0)  # fmt: skip
    state = RunDir(tmp_path).load_checkpoint()
    tensors = [v for v in state["learner"]["net"].values() if v.is_floating_point()]
    assert tensors and all(torch.isfinite(t).all() for t in tensors)


def test_the_summary_is_written_with_each_checkpoint(tmp_path, monkeypatch):
    """A crash must not leave summary.json behind the checkpoint a resume starts from: every
    checkpoint is followed at once by a summary (here the log interval never comes)."""
    events = []
    save, write = RunDir.save_checkpoint, RunDir.write_summary
    monkeypatch.setattr(RunDir, "save_checkpoint",
                        lambda self, state, step: events.append("checkpoint") or save(self, state,
                                                                                          step))
    monkeypatch.setattr(RunDir, "write_summary",
                        lambda self, summary: events.append("summary") or write(self, summary))
    rlherd.train("dqn", "rlherd/Corridor-v0", total_steps=3_000, run_dir=tmp_path, progress=False,
                 checkpoint_interval_s=0.2, log_interval_s=1e6)  # fmt: skip
    assert events.count("checkpoint") >= 2
    for i, event in enumerate(events):
        if event == "checkpoint":
            assert events[i + 1] == "summary", events


def test_checkpoints_lose_at_most_a_minute_and_at_most_a_few_percent(tmp_path):
    from rlherd.runtime.settings import Common

    assert Common().checkpoint_interval_s <= 60
    recorder = Recorder(RunDir(tmp_path, create=True), dict(agent="a", env="e", runtime="r"), 10,
                        progress=False)  # fmt: skip
    # A large replay table took 9 s to gather and write:
    recorder.checkpointed(tmp_path / "ckpt", seconds=9.0)
    assert recorder.checkpoint_interval_s >= 9.0 / 0.05
    # One slow write does not space them out for good:
    recorder.checkpointed(tmp_path / "ckpt", seconds=0.1)
    assert recorder.checkpoint_interval_s == 60


def test_bad_environment_options_are_one_clear_error(capsys):
    from rlherd.cli import main

    with pytest.raises(ConfigError, match="does not take the options"):
        rlherd.make("CartPole-v1", foo=1)
    with pytest.raises(ConfigError, match="Corridor length must be >= 2"):
        rlherd.make("rlherd/Corridor-v0", length=1)
    assert main(["train", "dqn", "--env", "CartPole-v1", "--env-kwargs", '{"foo": 1}']) == 2
    assert "does not take the options" in capsys.readouterr().err


def test_a_bug_keeps_its_traceback_and_a_user_error_is_one_line(monkeypatch, capsys, tmp_path):
    """The CLI turns what a user can fix into one line; anything else is a bug to see whole."""
    import rlherd.commands.train as train_module
    from rlherd.cli import main

    def bug(*args, **kwargs):
        raise ValueError("an unexpected bug")

    monkeypatch.setattr(train_module, "_run", bug)
    with pytest.raises(ValueError, match="an unexpected bug"):
        main(["train", "dqn", "--env", "rlherd/Corridor-v0", "--no-progress", "--run-dir",
              str(tmp_path / "run")])  # fmt: skip
    assert main(["train", "dqn", "--env", "NoSuchEnv-v0"]) == 2
    assert "unknown environment id 'NoSuchEnv-v0'" in capsys.readouterr().err


def test_a_missing_extra_is_named(monkeypatch, capsys):
    """HalfCheetah-v5 without MuJoCo installed: the extra to install, not Gymnasium's traceback."""
    import gymnasium as gym

    from rlherd.cli import main

    def no_mujoco(env_id, **kwargs):
        raise gym.error.DependencyNotInstalled("MuJoCo is not installed")

    monkeypatch.setattr(gym, "make", no_mujoco)
    assert main(["train", "ppo", "--env", "HalfCheetah-v5", "--no-progress"]) == 2
    assert "pip install 'rlherd[mujoco]'" in capsys.readouterr().err


CHILD_SCRIPT = """
import multiprocessing as mp, threading, time
from rlherd.envs.vector import die_with_parent

def child():
    die_with_parent()
    time.sleep(120)

if __name__ == "__main__":
    procs = []
    starter = threading.Thread(target=lambda: procs.append(mp.get_context("spawn").Process(
        target=child)) or procs[0].start())
    starter.start()
    starter.join()  # the thread that started the child is gone
    print(procs[0].pid, flush=True)
    time.sleep(120)
"""


def _start_parent(script_text: str, tmp_path) -> tuple[subprocess.Popen, int]:
    """Run ``script_text`` (which prints the pid of a process it started); return both."""
    script = tmp_path / "parent.py"
    script.write_text(script_text)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    return parent, int(parent.stdout.readline())


def _outlives_killed_parent(parent: subprocess.Popen, child: int) -> bool:
    """SIGKILL ``parent``; whether ``child`` still runs 5 s later."""
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive(child)


def test_a_child_outlives_the_thread_that_started_it_but_not_its_parent(tmp_path):
    """mono restarts actors from whichever thread notices a death; an actor must live as long
    as the learner process, not as long as that thread, and die with the process."""
    parent, child = _start_parent(CHILD_SCRIPT, tmp_path)
    try:
        time.sleep(1.5)
        assert alive(child), "the child died with the thread that started it"
        assert not _outlives_killed_parent(parent, child), "the child outlived its parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


SERVER_PARENT_SCRIPT = """
import subprocess, sys, time
server = subprocess.Popen([sys.executable, "-m", "rlherd.envs.server", "CartPole-v1",
                           "--address", "127.0.0.1:0", "--die-with-parent"],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
server.stdout.readline()  # serving ...
print(server.pid, flush=True)
time.sleep(120)
"""


def test_a_local_environment_server_dies_with_the_process_that_started_it(tmp_path):
    """poly's local servers: started without preexec_fn, they must still never outlive it."""
    parent, server = _start_parent(SERVER_PARENT_SCRIPT, tmp_path)
    try:
        assert alive(server)
        assert not _outlives_killed_parent(parent, server), (
            "the server outlived the process that started it"
        )
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


class _NeverEnds(gym.Env):
    """An environment with no end and no limit of its own (as MinAtar's games under a good
    policy)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}


class _FirstAction:
    def observe_first(self, obs, first):
        pass

    def select_action(self, obs):
        return np.zeros(len(obs), dtype=np.int64)


def test_evaluation_and_recorded_episodes_end_in_an_environment_that_never_does(monkeypatch):
    """Before the step limit, a greedy evaluation of an endless episode never returned."""
    import rlherd.replay.recording as recording
    import rlherd.run.evaluation as evaluation

    monkeypatch.setattr(evaluation, "MAX_EPISODE_STEPS", 50)
    monkeypatch.setattr(recording, "MAX_EPISODE_STEPS", 50)

    def hung(signum, frame):
        raise TimeoutError("the episode never ended")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(30)
    try:
        returns, lengths, _ = evaluation.run_episodes(_NeverEnds(), _FirstAction(), 2, seed=0)
        recorded = recording.record_episodes(_NeverEnds(), lambda obs, first: 0, 1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert lengths == [50, 50] and returns == [50.0, 50.0]
    assert evaluation.episode_stats(returns, lengths)["eval_episodes_cut"] == 2
    assert evaluation.episode_stats([1.0], [3])["eval_episodes_cut"] == 0
    assert len(recorded[0]) == 50
    assert recorded[0].truncations[-1] and not recorded[0].truncations[:-1].any()


UNGUARDED_SCRIPT = """
import json, os, sys, rlherd
marks, second = sys.argv[1], json.loads(sys.argv[2])
rlherd.train("dqn", "CartPole-v1", total_steps=300, run_dir=os.path.join(marks, "first"),
             progress=False, overwrite=True)
open(os.path.join(marks, f"trained-{os.getpid()}"), "w").close()
rlherd.train("impala", "CartPole-v1", total_steps=2000, run_dir=os.path.join(marks, "second"),
             progress=False, **second)
"""


@pytest.mark.parametrize("second", [dict(runtime="mono", num_actors=2),
                                    dict(num_envs=2, env_workers=2)])  # fmt: skip
def test_a_script_without_a_main_guard_trains_once_and_is_told_so(second, tmp_path):
    """Each mono actor and each environment worker imports the user's script first. Unguarded,
    the script's first run was trained again in full by every child before the learner saw
    them fail; with env_workers the last line said only that a worker died."""
    script = tmp_path / "unguarded.py"
    script.write_text(UNGUARDED_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path), json.dumps(second)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode != 0
    assert "guard the script's calls with `if __name__ == '__main__':`" in done.stderr
    assert "`if __name__ == '__main__':`" in done.stderr.strip().splitlines()[-1]
    assert len(list(tmp_path.glob("trained-*"))) == 1, "child processes trained the first run"
