"""IMPALA end to end: tiny environments solved, resume, Ctrl-C, a killed actor, eval, plot."""

import csv
import json
import multiprocessing
import os
import resource
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from conftest import hold_run_until, hold_until_restarts, kill_an_actor, learn_to

import rlherd
import rlherd.commands.evaluate
from rlherd.cli import main
from rlherd.envs.vector import alive
from rlherd.errors import ConfigError
from rlherd.run.rundir import RunDir
from rlherd.runtime.mono import FORKED


def params(run_dir):
    return RunDir(run_dir).load_checkpoint()


@pytest.mark.parametrize("env_id", ["rlherd/Bandit-v0", "rlherd/Corridor-v0"])
@pytest.mark.parametrize("runtime", ["single", "mono"])
def test_tiny_environments_are_solved(env_id, runtime, tmp_path):
    run = rlherd.train("impala", env_id, runtime=runtime, run_dir=tmp_path, progress=False)
    optimum = rlherd.make(env_id).unwrapped.optimal_return
    # The sampling policy keeps some entropy: judge it over the last 200 episodes, and the greedy
    # policy by its exact return.
    returns = [float(r["episode_return"]) for r in _rows(tmp_path / "metrics" / "train.csv")]
    assert run.summary["episodes"] == len(returns) >= 200
    assert sum(returns[-200:]) / 200 >= 0.95 * optimum
    result = rlherd.commands.evaluate.evaluate(tmp_path, episodes=5)
    assert result["eval_return_mean"] == pytest.approx(optimum)
    assert json.loads((tmp_path / "summary.json").read_text())["eval_return_mean"] == pytest.approx(
        optimum
    )


def _rows(path):
    with open(path, newline="") as f:
        timing = ("wall_time_s", "sps")
        return [{k: v for k, v in r.items() if k not in timing} for r in csv.DictReader(f)]


def test_interrupt_then_resume_continues_exactly(interrupt_at, tmp_path):
    """Ctrl-C stops at a learner step with a final checkpoint; --resume then finishes the run
    with exactly the parameters, optimiser state and metrics of an uninterrupted run. (Ctrl-C
    comes at 10,000 steps, some 60 learner steps in, with Adam's moments and a few hundred
    episodes behind it; the 20,000 steps after it are some 120 learner steps and hundreds of
    episodes, which any state not restored sends elsewhere.)"""
    kw = dict(total_steps=30_000, seed=3, progress=False)
    straight = rlherd.train("impala", "CartPole-v1", run_dir=tmp_path / "a", **kw)

    interrupt_at(10_000)
    stopped = rlherd.train("impala", "CartPole-v1", run_dir=tmp_path / "b", **kw)
    assert 0 < stopped.summary["actor_steps"] < kw["total_steps"], "the run went on past Ctrl-C"
    assert stopped.stopped and not straight.stopped  # what a script running several reads
    stopped_ckpt = params(tmp_path / "b")
    assert stopped_ckpt["recorder"]["counters"]["actor_steps"] == stopped.summary["actor_steps"]

    resumed = rlherd.train(resume=tmp_path / "b", progress=False)
    for key in ("actor_steps", "learner_steps", "episodes", "final_return_mean"):
        assert resumed.summary[key] == straight.summary[key], key
    a, b = params(tmp_path / "a"), params(tmp_path / "b")
    for name, tensor in a["learner"]["net"].items():
        torch.testing.assert_close(b["learner"]["net"][name], tensor, rtol=0, atol=0)
    opt_a, opt_b = a["learner"]["optimizer"]["state"], b["learner"]["optimizer"]["state"]
    for k in opt_a:
        torch.testing.assert_close(opt_b[k]["exp_avg"], opt_a[k]["exp_avg"], rtol=0, atol=0)
    # Every episode alike. (Learner rows average the steps of each log interval, whose
    # boundaries depend on timing; the parameters above show that learning was the same.)
    assert _rows(tmp_path / "a" / "metrics" / "train.csv") == _rows(
        tmp_path / "b" / "metrics" / "train.csv"
    )


def test_mono_resume_continues_counters_and_optimizer(tmp_path):
    first = rlherd.train(
        "impala", "CartPole-v1", runtime="mono", total_steps=16_000, run_dir=tmp_path,
        progress=False,
    )  # fmt: skip
    steps = first.summary["learner_steps"]
    resumed = rlherd.train(resume=tmp_path, total_steps=32_000, progress=False)
    assert resumed.summary["actor_steps"] >= 32_000
    # The second session learned about as much as the first (steps count as actors take them,
    # so either may end a few batches behind its actors, more so on a loaded machine).
    assert resumed.summary["learner_steps"] >= 2 * steps - 5
    state = params(tmp_path)
    adam_steps = {int(s["step"]) for s in state["learner"]["optimizer"]["state"].values()}
    assert adam_steps == {resumed.summary["learner_steps"]}
    assert json.loads((tmp_path / "config.json").read_text())["total_steps"] == 32_000


def test_killed_actors_are_restarted_and_the_run_goes_on(tmp_path, monkeypatch):
    """SIGKILL an actor three times, at whatever point it is (acting, waiting for a slot,
    answering the learner): each is replaced, and the run reaches its step budget.

    The kills are a second apart once two actors are up: the third falls at about 15,000 steps
    (13,360 and 16,800 on two loaded runs), so a budget of 40,000 finds the actors acting at
    each, and the restarted ones play the rest. Were it spent first, the run is held (actors
    idle at the budget, alive, and are killed and restarted there) until three restarts."""
    hold_until_restarts(monkeypatch, 3)
    result = {}
    run = threading.Thread(
        target=lambda: result.update(
            run=rlherd.train(
                "impala",
                "CartPole-v1",
                runtime="mono",
                total_steps=40_000,
                run_dir=tmp_path,
                progress=False,
            )  # fmt: skip
        )
    )
    run.start()
    killed = [kill_an_actor() for _ in range(3)]
    pids = killed + [p.pid for p in multiprocessing.active_children()]
    run.join(timeout=300)
    assert not run.is_alive(), "the run hung after its actors were killed"
    summary = result["run"].summary
    assert summary["actor_restarts"] >= 3
    assert summary["actor_steps"] >= 40_000
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _has_pidfds() -> bool:
    try:
        os.close(os.pidfd_open(os.getpid()))
        return True
    except (AttributeError, OSError):
        return False


@pytest.mark.skipif(not FORKED, reason="actors fork from a fork server on Linux only")
@pytest.mark.skipif(not _has_pidfds(), reason="without pidfds the fork server's word is all")
def test_mono_actors_outlive_their_fork_server(tmp_path, monkeypatch):
    """SIGKILL the fork server the actors came from, then one actor: the others act on (a
    server's death is not theirs: no false restart beside a live actor, writing into the slot
    its successor is given), the dead one is restarted from a new server, and no actor
    outlives the run. The actor is killed 3 s after both are up (about 15,000 steps): a budget
    of 40,000 finds them acting; the run is held until the restart is counted."""
    hold_until_restarts(monkeypatch, 1)
    result = {}
    run = threading.Thread(target=lambda: result.update(run=rlherd.train(
        "impala", "CartPole-v1", runtime="mono", total_steps=40_000, run_dir=tmp_path,
        progress=False)))  # fmt: skip
    run.start()
    deadline = time.monotonic() + 60
    while len(multiprocessing.active_children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    actors = [p.pid for p in multiprocessing.active_children()]
    parents = {int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
               for pid in actors}  # fmt: skip
    (server,) = parents
    assert "forkserver" in open(f"/proc/{server}/cmdline").read()  # nothing else is killed
    os.kill(server, signal.SIGKILL)
    time.sleep(2.0)  # the learner looks after its actors several times meanwhile
    os.kill(actors[0], signal.SIGKILL)
    run.join(timeout=300)
    assert not run.is_alive(), "the run hung after its fork server was killed"
    summary = result["run"].summary
    assert summary["actor_restarts"] == 1
    assert summary["actor_steps"] >= 40_000
    assert not [pid for pid in actors if alive(pid)]


def test_mono_starts_actors_whatever_the_number_of_rollout_slots(tmp_path):
    """64 slots of 8 shared tensors each, under the common soft limit of 1,024 open files: a
    forked process gets its arguments' shared tensors as file descriptors in one message, which
    holds at most 252, so the slots reach an actor over its pipe, each a descriptor lent until
    the actor took it, and the learner raises its soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= 2_048, "this test needs a hard limit of open files of at least 2,048"
    cmd = [sys.executable, "-m", "rlherd.cli", "train", "impala", "--env", "CartPole-v1",
           "--runtime", "mono", "--total-steps", "2000", "--num-actors", "2",
           "--envs-per-actor", "1", "--num-buffers", "64", "--run-dir", str(tmp_path / "run"),
           "--no-progress"]  # fmt: skip
    common = lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (1_024, hard))  # noqa: E731
    out = subprocess.run(cmd, preexec_fn=common, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def test_mono_actors_run_at_the_niceness_they_are_given(monkeypatch, tmp_path):
    """Actor processes lower their priority by ``actor_nice`` (so the learner gets a core first
    on a machine with fewer cores than processes); a niceness outside 0..19 is refused."""
    import contextlib

    seen = {}
    expected = min(19, os.getpriority(os.PRIO_PROCESS, 0) + 5)

    def settled(recorder) -> bool:  # the learner's loop, while the actors run
        for child in multiprocessing.active_children():
            with contextlib.suppress(ProcessLookupError):
                seen[child.pid] = os.getpriority(os.PRIO_PROCESS, child.pid)
        return len(seen) == 2 and set(seen.values()) == {expected}

    # On a loaded machine an actor may still be starting (not yet reniced) when the budget is
    # spent: the run goes on until both have been seen after their start, or 60 s.
    hold_run_until(monkeypatch, settled, timeout_s=60)
    rlherd.train("impala", "CartPole-v1", runtime="mono", total_steps=6_000, num_actors=2,
                 actor_nice=5, run_dir=tmp_path, progress=False)  # fmt: skip
    assert len(seen) == 2 and set(seen.values()) == {expected}
    with pytest.raises(ConfigError, match="actor_nice must be in 0..19"):
        rlherd.train("impala", "CartPole-v1", runtime="mono", actor_nice=20,
                     run_dir=tmp_path / "bad", progress=False)  # fmt: skip


def test_eval_video_and_plot(tmp_path, capsys):
    pytest.importorskip("imageio")
    run_dir = tmp_path / "run"
    rlherd.train("impala", "CartPole-v1", total_steps=8_000, run_dir=run_dir, progress=False)
    video = tmp_path / "videos" / "episode.gif"  # its folder made, as a run directory is
    assert main(["eval", str(run_dir), "--episodes", "2", "--video", str(video)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["eval_episodes"] == 2 and result["eval_return_mean"] > 0
    assert video.stat().st_size > 1000
    (tmp_path / "blocked").write_text("a file where the video's folder would go")
    assert main(["eval", str(run_dir), "--episodes", "2", "--video",
                 str(tmp_path / "blocked" / "episode.gif")]) == 2  # fmt: skip
    assert "blocked is a file" in capsys.readouterr().err
    image = tmp_path / "figures" / "curves.png"
    assert main(["plot", str(run_dir), str(run_dir), "-o", str(image)]) == 0
    assert image.read_bytes()[:4] == b"\x89PNG"
    capsys.readouterr()
    assert main(["plot", str(run_dir), "-o", str(tmp_path / "curves.txt")]) == 2
    err = capsys.readouterr().err.strip()  # a suffix matplotlib cannot write: one line
    assert err.count("\n") == 0 and "curves.txt: matplotlib writes" in err and "png" in err, err
    # A folder that exists is drawn in, and a name without a format is a PNG: the path printed
    # is the file written (matplotlib added ".png" to "curves" and it said "curves").
    for given, written in ((tmp_path / "figures", image), (tmp_path / "bare", "bare.png")):
        assert main(["plot", str(run_dir), "-o", str(given)]) == 0
        assert capsys.readouterr().out.strip() == str(tmp_path / written)
        assert (tmp_path / written).read_bytes()[:4] == b"\x89PNG"
    assert main(["plot", str(video), "-o", str(image)]) == 2  # a file, not runs: one line
    assert f"{video} is a file; give run directories" in capsys.readouterr().err
    for window in ("0", "-3"):  # a mean over no episodes: NaN curves, or an IndexError
        assert main(["plot", str(run_dir), "-o", str(image), "--window", window]) == 2
        assert "--window must be at least 1 episode" in capsys.readouterr().err


def test_atari_pong_smoke_through_mono(tmp_path):
    pytest.importorskip("ale_py")
    run = rlherd.train(
        "impala", "ALE/Pong-v5", runtime="mono", total_steps=640, run_dir=tmp_path,
        progress=False, num_actors=2, envs_per_actor=4, unroll_length=20, batch_size=8,
    )  # fmt: skip
    # Steps count as actors take them, so the run ends as the last batches are being learned.
    assert run.summary["actor_steps"] >= 640 and run.summary["learner_steps"] >= 2
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["preset"] == "atari" and config["config"]["torso"] == "auto"


@pytest.mark.slow
@pytest.mark.parametrize("runtime, precision, faster",
                         [("single", "float32", {}), ("mono", "float32", {"learning_rate": 2e-3}),
                          ("single", "bfloat16", {})],
                         ids=["single-float32", "mono-float32", "single-bfloat16"])  # fmt: skip
def test_impala_learns_cartpole(runtime, precision, faster, tmp_path):
    """Judged on the mean action (argmax) over 20 episodes, as `rlherd eval` scores a run: seed 0
    gets to 500 there on every runtime within 500k steps (random: ~22), judged every 100k and
    stopped once past 475 (on an AMD EPYC: at 300k single, 200k mono, 400k bfloat16). The last
    training episodes sample their actions, and a policy that is greedy-perfect still drops 1-6
    of 20 episodes at 11-18 steps (mono under load: 346.75 on CI), so training returns are too
    noisy a bar. Mono, whose runs are not deterministic, trains at Adam 2e-3: at the `classic`
    preset's 1e-3 (set to hold 500 to 1M steps) seed 0 is still climbing at 500k (379.3 in one
    run; 2e-3: 500 in two)."""
    run, reached = learn_to(475, "impala", "CartPole-v1", metric="eval_return_mean",
                            runtime=runtime, total_steps=500_000, seed=0, eval_every=100_000,
                            eval_episodes=20, run_dir=tmp_path, progress=False,
                            precision=precision, **faster)  # fmt: skip
    assert reached, run.summary


@pytest.mark.slow
def test_the_classic_preset_holds_cartpole_to_a_million_steps(tmp_path):
    """Once at 500, the preset stays there: the training episodes of a 1M-step run's last 100k
    steps (about 200, sampled actions) average 450 or more. With Adam at 2e-3 and an entropy
    cost of 0.01 this seed averaged 253.1 there on mono (and its last 20 episodes 232.6): the
    policy fell from 500 late in the run, and stayed random enough to drop episodes early.
    The run is on `single`, which is deterministic for a seed and, on two cores, costs less
    CPU than mono's processes (seed 2: 500.0 there, in 72 s alone on an AMD EPYC, where mono
    took 57 s on both cores; seed 0: 498.0 in 64 s)."""
    rlherd.train(
        "impala", "CartPole-v1", runtime="single", total_steps=1_000_000, seed=2,
        run_dir=tmp_path, progress=False,
    )  # fmt: skip
    rows = np.genfromtxt(tmp_path / "metrics" / "train.csv", delimiter=",", names=True)
    last = rows["episode_return"][rows["actor_steps"] > 900_000]
    assert len(last) >= 100 and last.mean() >= 450, (len(last), last.mean())


def test_bfloat16_torso_feeds_float32_heads_and_a_close_loss():
    """precision=bfloat16 runs the learner's torso products in bfloat16 and hands the heads,
    V-trace and the optimiser float32; the loss stays within bfloat16's rounding of float32's.
    Acting (no gradients) stays float32."""
    from rlherd import envs
    from rlherd.agents.impala.config import ImpalaConfig
    from rlherd.agents.impala.learning import impala_loss
    from rlherd.agents.impala.networks import ImpalaNet
    from rlherd.networks import PRECISIONS

    spec = envs.spec_for("CartPole-v1")
    torch.manual_seed(0)
    nets = [ImpalaNet(spec, ImpalaConfig(precision=p, torso="mlp")) for p in PRECISIONS]
    nets[1].load_state_dict(nets[0].state_dict())
    seen = []
    nets[1].torso.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    T, B = 5, 3
    batch = {"obs": torch.randn(T + 1, B, 4), "action": torch.randint(2, (T + 1, B)),
             "reward": torch.randn(T + 1, B), "terminated": torch.zeros(T + 1, B, dtype=bool),
             "truncated": torch.zeros(T + 1, B, dtype=bool),
             "reset": torch.zeros(T + 1, B, dtype=bool),
             "policy_logits": torch.randn(T + 1, B, 2)}  # fmt: skip
    (loss32, _), (loss16, _) = (impala_loss(net, batch, (), ImpalaConfig()) for net in nets)
    assert seen == [torch.bfloat16] and loss16.dtype == torch.float32
    assert loss16.item() == pytest.approx(loss32.item(), rel=2e-2)
    assert loss16.item() != loss32.item()  # it did run in bfloat16
    with torch.no_grad():  # acting
        nets[1](batch["obs"], batch["reset"])
    assert seen[-1] == torch.float32


def test_rewards_squashed_by_tanh_are_what_vtrace_sees():
    """NLE's "tim" clipping: the loss of rewards r with reward_tanh_scale s is the loss of
    rewards tanh(r / s) with no transformation; clipping and squashing together are refused."""
    from rlherd import envs
    from rlherd.agents.impala.config import ImpalaConfig
    from rlherd.agents.impala.learning import impala_loss
    from rlherd.agents.impala.networks import ImpalaNet

    torch.manual_seed(0)
    squash = ImpalaConfig(reward_clip=None, reward_tanh_scale=100.0)
    net = ImpalaNet(envs.spec_for("CartPole-v1"), squash)
    T, B = 5, 3
    batch = {"obs": torch.randn(T + 1, B, 4), "action": torch.randint(2, (T + 1, B)),
             "reward": 300 * torch.randn(T + 1, B), "terminated": torch.zeros(T + 1, B, dtype=bool),
             "truncated": torch.zeros(T + 1, B, dtype=bool),
             "reset": torch.zeros(T + 1, B, dtype=bool),
             "policy_logits": torch.randn(T + 1, B, 2)}  # fmt: skip
    squashed = dict(batch, reward=torch.tanh(batch["reward"] / 100.0))
    loss, _ = impala_loss(net, batch, (), squash)
    expected, _ = impala_loss(net, squashed, (), ImpalaConfig(reward_clip=None))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    raw, _ = impala_loss(net, batch, (), ImpalaConfig(reward_clip=None))
    assert raw.item() != pytest.approx(expected.item(), rel=1e-3)
    with pytest.raises(ValueError, match="reward_clip=None"):
        ImpalaConfig(reward_tanh_scale=100.0)


@pytest.mark.gpu
@pytest.mark.parametrize("runtime", ["single", "mono"])
def test_learner_on_cuda(runtime, tmp_path):
    run = rlherd.train(
        "impala", "CartPole-v1", runtime=runtime, total_steps=20_000, run_dir=tmp_path,
        progress=False, device="cuda", use_lstm=True,
    )  # fmt: skip
    assert run.summary["learner_steps"] > 0
    assert rlherd.commands.evaluate.evaluate(tmp_path, episodes=1)["eval_episodes"] == 1


def test_cuda_without_cuda_is_a_clear_error(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with pytest.raises(ValueError, match="CUDA is not available"):
        rlherd.train("impala", "CartPole-v1", run_dir=tmp_path, device="cuda", progress=False)


@pytest.mark.slow
def test_impala_minatar_preset_passes_the_breakout_plateau(interrupt_at, tmp_path):
    """TorchBeast's step size (RMSprop 4.8e-4) held the ``minatar`` preset near 4 on Breakout at
    1M steps and near 5 all the way to 5M; the preset's Adam at 7.3e-3 on 32 x 10 rollouts gets
    past that plateau. The run is the shipped command's (5M steps, whose schedule anneals the
    step size), stopped at 1M: seed 0 was at 15.6 there on an AMD EPYC (the mean of its last
    100 episodes). When a seed leaves the plateau is partly chance: seed 2 was at 6.7 at 1M and
    ended at 24.4. (The former preset, Adam at 6e-3 on 16 x 20 rollouts, was at 16.5 on an Intel
    Xeon and 9.4 on an AMD EPYC.) The run differs from machine to machine: on another AMD EPYC
    VM, with the same code as the 15.6, seed 0 was at 7.25 at 1M (its last 20 episodes, which
    the test reads; 6.2 over its last 100), just over the bar."""
    pytest.importorskip("minatar")
    interrupt_at(1_000_000)
    run = rlherd.train("impala", "MinAtar/Breakout-v1", total_steps=5_000_000, seed=0,
                       run_dir=tmp_path, progress=False)  # fmt: skip
    assert run.stopped and run.summary["actor_steps"] < 1_100_000, run.summary
    assert run.summary["final_return_mean"] >= 7, run.summary
