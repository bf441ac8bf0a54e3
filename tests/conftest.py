import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

# Tests read MP4s back through imageio-ffmpeg in processes where gRPC is loaded (poly and server
# tests share the worker); its preexec_fn makes that a fork() that runs gRPC's fork handlers in
# ffmpeg's child, which broke its pipe now and then. rlherd's own writer turns it off the same way
# (rlherd.run.video); this covers the tests' reads.
os.environ["IMAGEIO_FFMPEG_NO_PREVENT_SIGINT"] = "1"

# pytest-xdist runs the suite in two worker processes (pyproject's addopts); each keeps to one
# intra-op thread so that the two together fit the two cores the suite is sized for.
torch.set_num_threads(1)


@pytest.fixture(autouse=True, scope="session")
def _snapshot_key(tmp_path_factory):
    """Runs seal their environment snapshots with a key of the user's (rlherd.run.plain); the
    suite's, and its subprocesses', lives in a temporary folder instead."""
    os.environ["RLHERD_SNAPSHOT_KEY"] = str(tmp_path_factory.mktemp("key") / "snapshot.key")


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config, items):
    """Marks before every other plugin's hook, sorts after them all: pytest-xdist's own hook reads
    each test's ``xdist_group`` into the id its scheduler groups by, so a group marked after it is
    never seen; and the order is the last word, after pytest's own reordering."""
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)
        if "ray" in item.keywords:
            # One worker runs every Ray test, one after another: two embedded Ray clusters at
            # once would share the machine's ports and cores.
            item.add_marker(pytest.mark.xdist_group("ray"))
    result = yield
    # Longest work first, so that neither worker is left with one long test at the end while
    # the other idles: the Ray group (minutes, on one worker), then the other `slow` tests,
    # then the quick ones, which fill the gaps. (The sort is stable: files keep their order.)
    items.sort(key=lambda item: ("ray" not in item.keywords, "slow" not in item.keywords))
    return result


@pytest.fixture(autouse=True)
def _no_leftover_processes():
    """Every test must stop the processes it starts."""
    yield
    children = multiprocessing.active_children()
    assert not children, f"processes left running: {children}"


@pytest.fixture
def interrupt_at(monkeypatch):
    """``interrupt_at(steps, signum=SIGINT)``: the next run gets Ctrl-C's SIGINT (or ``signum``)
    once it has counted ``steps`` steps, sent from its own main loop. A timer's SIGINT would
    land at a different step on every machine, and after a run that finished first it would stop
    pytest itself."""
    from rlherd.run.recorder import Recorder

    def arm(steps: int, signum: int = signal.SIGINT) -> None:
        done, sent = Recorder.done, []

        def done_or_interrupt(recorder: Recorder) -> bool:
            if not sent and recorder.counters[recorder.counts] >= steps:
                sent.append(steps)
                os.kill(os.getpid(), signum)
            return done(recorder)

        monkeypatch.setattr(Recorder, "done", done_or_interrupt)

    return arm


def learn_to(score: float, agent: str, env: str, metric: str = "final_return_mean",
             **kwargs: Any) -> tuple[Any, bool]:
    """``rlherd.train(agent, env, **kwargs)`` that stops once ``metric`` reaches ``score``, and
    whether it got there: by default the mean return of the last 20 training episodes, checked
    each second; ``eval_return_mean`` at each evaluation (so pass ``eval_every``).

    A learning test asks whether the agent gets to a score within a budget; a run that has got
    there has answered it, and training out the rest of the budget only costs the suite time.
    A run that never gets there trains the whole budget and fails as before."""
    import rlherd
    from rlherd.run.callbacks import StopAtReturn

    stop = StopAtReturn(score, metric=metric)
    run = rlherd.train(agent, env, callbacks=[stop], log_interval_s=1.0, **kwargs)
    return run, stop.reason != ""  # set only on reaching it (a run's end gets a last check)


def judge_on_the_way(interrupt_at: Callable[[int], None], steps: int,
                     judge: Callable[[Any], tuple[bool, Any]], agent: str, env: str,
                     **kwargs: Any) -> tuple[bool, Any]:  # fmt: skip
    """:func:`learn_to` for a judgement that is not one of the run's metrics (games against
    opponents, played by ``rlherd eval``): ``rlherd.train(agent, env, **kwargs)`` stopped at
    ``steps`` as Ctrl-C stops it (``interrupt_at``, the fixture) and judged there, then resumed
    to its whole budget and judged again only if ``judge(run)`` says it is not there yet.
    ``--resume`` continues exactly, so the budget's end is the uninterrupted run's. Returns the
    last verdict and what it saw."""
    import rlherd

    interrupt_at(steps)
    run = rlherd.train(agent, env, **kwargs)
    assert run.stopped and run.summary["actor_steps"] < kwargs["total_steps"], run.summary
    passed, seen = judge(run)
    if not passed:
        passed, seen = judge(rlherd.train(resume=run.path, progress=False))
    return passed, seen


# ------------------------------------------------------------------------ offline datasets
def corridor_expert(obs):
    return 1  # right, to the goal


def reach_expert(obs):
    return np.clip([(obs[1] - obs[0]) / 0.5], -1.0, 1.0).astype(np.float32)  # goal in one step


def random_transitions(builder, env_id: str, steps: int, seed: int = 0, **table_options) -> list:
    """``builder``'s replay tables (inserts never wait; ``table_options``, e.g. an offline
    agent's ``dataset_size``, go to its ``make_replay_tables``) holding ``steps`` of uniformly
    random actions in ``env_id``, written by its adder: a real batch for a learner's unit test."""
    from rlherd import envs as rl_envs

    options = dict(insert_blocking=False, **table_options)
    tables = builder.make_replay_tables(rl_envs.spec_for(env_id), **options)
    adder = builder.make_adder(tables, 1)
    env = rl_envs.make(env_id)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    adder.add_first(obs[None], np.ones(1, dtype=bool))
    for _ in range(steps):
        action = env.action_space.sample()
        obs, reward, term, trunc, _ = env.step(action)
        adder.add(np.asarray(action)[None], np.array([reward]), obs[None], np.array([term]),
                  np.array([trunc]), np.zeros(1, dtype=bool))  # fmt: skip
        if term or trunc:
            obs, _ = env.reset()
            adder.add_first(obs[None], np.ones(1, dtype=bool))
    return tables


def record_scripted(env_id: str, policy, episodes: int, epsilon: float, seed: int, out: str):
    """Write a dataset of ``policy``'s episodes (a uniformly random action with probability
    ``epsilon``) on ``env_id``, as ``rlherd collect`` records a run's."""
    from rlherd import envs as rl_envs
    from rlherd.replay.offline import write_dataset
    from rlherd.replay.recording import record_episodes

    env = rl_envs.make(env_id)
    recorded = record_episodes(env, lambda obs, first: policy(obs), episodes, epsilon, seed)
    about = dict(env=env_id, env_kwargs={}, policy="scripted", epsilon=epsilon, seed=seed)
    write_dataset(out, recorded, env.observation_space, env.action_space, about)
    env.close()


@pytest.fixture(scope="session")
def offline_datasets(tmp_path_factory):
    """Minari datasets of scripted experts that take a random action 30% of the time, in a
    directory of this session's: ``{env id: dataset id}``. Corridor's return 0.93 (optimal
    0.95), Reach's 0.63 (optimal about 0.88)."""
    os.environ["MINARI_DATASETS_PATH"] = str(tmp_path_factory.mktemp("minari"))
    record_scripted("rlherd/Corridor-v0", corridor_expert, 200, 0.3, 0, "corridor/mixed-v0")
    record_scripted("rlherd/Reach-v0", reach_expert, 300, 0.3, 0, "reach/mixed-v0")
    return {"rlherd/Corridor-v0": "corridor/mixed-v0", "rlherd/Reach-v0": "reach/mixed-v0"}


def hold_run_until(monkeypatch: Any, until: Callable[[Any], bool], timeout_s: float) -> None:
    """Keep the next run going past its budget until ``until(recorder)`` (or ``timeout_s`` from
    now). ``until`` is called at every check of the run's main loop, so it may also watch the
    run while it goes: a test that looks at actors, or kills them, then never finds the budget
    spent first (a warm ``mono`` run plays 16,000 steps in about two seconds)."""
    from rlherd.run.recorder import Recorder

    done, deadline = Recorder.done, time.monotonic() + timeout_s

    def held(recorder: Recorder) -> bool:
        ready = until(recorder)
        return done(recorder) and (ready or time.monotonic() > deadline)

    monkeypatch.setattr(Recorder, "done", held)


def hold_until_restarts(monkeypatch: Any, count: int, timeout_s: float = 120.0) -> None:
    """The next run goes on until it has counted ``count`` actor restarts (or ``timeout_s``)."""

    def restarted(recorder: Any) -> bool:
        return recorder.extra.get("actor_restarts", 0) >= count

    hold_run_until(monkeypatch, restarted, timeout_s)


def kill_an_actor(timeout_s: float = 60.0) -> int:
    """SIGKILL one of this process's children (a ``mono`` actor) once two are up, a second
    later (so it is in the middle of its work, whatever that is); its pid."""
    deadline = time.monotonic() + timeout_s
    while len(multiprocessing.active_children()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    victim = multiprocessing.active_children()[0]
    os.kill(victim.pid, signal.SIGKILL)
    return victim.pid
