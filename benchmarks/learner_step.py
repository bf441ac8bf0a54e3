"""DQN learner updates per second, as a run makes them: sample a batch from the replay table,
update, write priorities back, report the metrics. Four paths, in one run so the ratios hold:

  before    the learner step as it was before the learner-overhead work (commit 125efb9),
            copied below: separate forward passes for the double-Q selector, Adam's foreach
            and RMSprop's single-tensor implementations, a host read of every metric and a
            metrics row (CSV + TensorBoard) written for every step, subnormal floats computed
            in full, and prioritised replay's sum-tree (before its blocks);
  eager     today's DQNLearner and Recorder (parameters flattened into one tensor, fused
            Adam, metrics left as tensors and written once per log interval), with subnormals
            flushed to zero as every runtime now runs (``rlherd.runtime.torch_threads``);
  unflushed the eager path with subnormals computed in full (what the flush alone is worth);
  compiled  the same with ``compile_step=true``: the whole update (loss, gradient, clip,
            optimiser) traced once and compiled by TorchInductor (``CompiledStep`` in
            rlherd/agents/learning.py).

Networks: CartPole's (the ``classic`` preset: 128x128 dueling MLP, double Q, prioritised
replay, Adam), RL Zoo's CartPole DQN (the ``rlzoo`` preset: 256x256 MLP, uniform replay) and
MinAtar's (the ``minatar_paper`` preset: one 16-channel conv + 128 fc, RMSprop, uniform
replay).
The table holds random transitions. Their values matter only through the units that stop
learning (dead ReLUs), whose optimiser state then decays into the subnormal range, as in a run.

The paths take turns (``--slices`` per path), since this kind of machine's speed drifts within
minutes. Prints one JSON line per (network, path). Usage:
  python benchmarks/learner_step.py [--seconds 20] [--slices 20]
      [--setups classic rlzoo minatar_paper]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import tempfile
import time

import numpy as np
import torch

from rlherd import envs
from rlherd.agents import BUILDERS
from rlherd.commands.train import resolve_config
from rlherd.losses.td import double_q_learning_td, huber, q_learning_td
from rlherd.replay import MinSize, Prioritized
from rlherd.run.provenance import machine
from rlherd.run.recorder import Recorder
from rlherd.run.rundir import RunDir

PATHS = ("before", "unflushed", "eager", "compiled")
SETUPS = {"classic": "CartPole-v1", "rlzoo": "CartPole-v1", "minatar_paper": "MinAtar/Breakout-v1"}
MACHINE = machine()


class BeforeLearner:
    """DQNLearner.learn as of commit 125efb9, for comparison (the importance-beta schedule and
    checkpointing, which do not touch the step's speed, are left out)."""

    def __init__(self, net, config, table):
        self.net, self.config, self.table = net, config, table
        self.target_net = copy.deepcopy(net)
        self.target_net.requires_grad_(False)
        self.num_steps = 0
        if config.optimizer == "adam":
            self.optimizer = torch.optim.Adam(
                net.parameters(), lr=config.learning_rate, eps=config.adam_eps, foreach=True
            )
        else:
            self.optimizer = torch.optim.RMSprop(
                net.parameters(), lr=config.learning_rate, alpha=config.rmsprop_alpha,
                eps=config.rmsprop_eps, centered=True,
            )  # fmt: skip

    def loss(self, data, weights):
        c, net = self.config, self.net
        q_tm1 = net(data["obs"])
        with torch.no_grad():
            q_t_value = self.target_net(data["next_obs"])
            q_t_selector = net(data["next_obs"]) if c.double_q else None
        args = (q_tm1, data["action"], data["reward"], data["discount"], q_t_value)
        td = double_q_learning_td(*args, q_t_selector) if c.double_q else q_learning_td(*args)
        return (weights * huber(td, c.huber_delta)).mean(), td.detach()

    def learn(self, sample) -> dict[str, float]:
        weights = sample.weights
        if weights is None:
            weights = torch.ones(len(sample.info.keys))
        loss, td = self.loss(sample.data, weights)
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(),
                                                   self.config.grad_norm_clip)  # fmt: skip
        self.optimizer.step()
        self.num_steps += 1
        self.net.experience.fill_(self.table.insert_count)
        if self.num_steps % self.config.target_update_period == 0:
            self.target_net.load_state_dict(self.net.state_dict())
        if not torch.isfinite(td).all():
            raise RuntimeError("TD errors are not finite")
        if self.config.prioritized:
            priorities = np.abs(td.cpu().numpy()).astype(np.float64) + self.config.priority_eps
            self.table.update_priorities(sample.info.keys, priorities)
        return dict(loss=loss.item(), td_abs_mean=td.abs().mean().item(),
                    grad_norm=grad_norm.item(), importance_beta=0.4)  # fmt: skip


class SumTree(Prioritized):
    """Prioritized's sampling and updates as of commit 72559d8: a sum-tree descended one vector
    step per level, for the ``before`` path."""

    def reset(self, capacity: int) -> None:
        self.uniform.reset(capacity)
        self.tree_leaves = 1 << max(0, (capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.tree_leaves, dtype=np.float64)

    def _set_one(self, slot: int, value: float) -> None:
        i = slot + self.tree_leaves
        self.tree[i] = value
        i >>= 1
        while i:
            self.tree[i] = self.tree[2 * i] + self.tree[2 * i + 1]
            i >>= 1

    def _set(self, slots: np.ndarray, values: np.ndarray) -> None:
        idx = np.asarray(slots, dtype=np.int64) + self.tree_leaves
        self.tree[idx] = values
        idx = np.unique(idx >> 1)
        while idx[0] >= 1:
            self.tree[idx] = self.tree[2 * idx] + self.tree[2 * idx + 1]
            parents = idx >> 1
            idx = parents[np.concatenate(([True], parents[1:] != parents[:-1]))]

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        total = self.tree[1]
        target = rng.random(n) * total
        idx = np.ones(n, dtype=np.int64)
        while idx[0] < self.tree_leaves:
            left = 2 * idx
            right = (target >= self.tree[left]) & (self.tree[left + 1] > 0)
            target = np.where(right, target - self.tree[left], target)
            idx = np.where(right, left + 1, left)
        return idx - self.tree_leaves, self.tree[idx] / total


def row_per_step(recorder: Recorder):
    """What Recorder.learner did before: one metrics row per learner step."""

    def log(metrics: dict[str, float]) -> None:
        recorder.learner_counter.increment(steps=1)
        counts = recorder.counters
        row = dict(learner_steps=int(counts["learner_steps"]),
                   actor_steps=int(counts["actor_steps"]), sps=round(recorder.sps(), 1),
                   **metrics)  # fmt: skip
        recorder.rundir.log("learner", row, step=int(counts["actor_steps"]))

    return log


def filled_tables(builder, spec, rng, sum_tree: bool):
    """The preset's replay table, holding random transitions beyond its minimum size (with the
    old sum-tree, if ``sum_tree`` and the table is prioritised)."""
    tables = builder.make_replay_tables(spec, insert_blocking=False)
    tables[0].limiter = MinSize(1)  # no rate limiter holds a sample back
    if sum_tree and isinstance(tables[0].sampler, Prioritized):
        tables[0].sampler = SumTree(tables[0].sampler.exponent)
        tables[0].sampler.reset(tables[0].max_size)
    adder = builder.make_adder(tables, 1)

    def obs():
        if spec.obs_dtype == np.uint8:
            return rng.integers(0, 2, size=(1, *spec.obs_shape)).astype(np.uint8)
        return rng.standard_normal((1, *spec.obs_shape)).astype(spec.obs_dtype)

    no = np.zeros(1, dtype=bool)
    adder.add_first(obs(), np.ones(1, dtype=bool))
    for _ in range(builder.config.min_replay_size + 1_000):
        adder.add(rng.integers(spec.num_actions, size=1), rng.standard_normal(1), obs(),
                  no, no, no)  # fmt: skip
    return tables


class Path:
    """One path's learner, dataset and recorder over its own copy of the table and network."""

    def __init__(self, setup: str, path: str, tmp: str):
        env_id = SETUPS[setup]
        config, _ = resolve_config("dqn", env_id, setup, dict(compile_step=path == "compiled"))
        builder = BUILDERS["dqn"](config)
        spec = envs.spec_for(env_id)
        torch.manual_seed(0)
        tables = filled_tables(builder, spec, np.random.default_rng(0), path == "before")
        self.dataset = builder.make_dataset(tables)
        net = builder.make_networks(spec)
        self.recorder = Recorder(RunDir(os.path.join(tmp, path), create=True),
                                 dict(agent="dqn", env=env_id, runtime="bench"), 10**9,
                                 progress=False)  # fmt: skip
        if path == "before":
            self.learner = BeforeLearner(net, config, tables[0])
            self.report = row_per_step(self.recorder)
        else:
            self.learner = builder.make_learner(net, self.dataset, 10**9, tables)
            self.report = self.recorder.learner
        self.config, self.env_id, self.updates, self.elapsed = config, env_id, 0, 0.0
        self.flush = path not in ("before", "unflushed")
        torch.set_flush_denormal(self.flush)
        start = time.perf_counter()
        for _ in range(20):  # warm up (and compile)
            self.update()
        self.warmup = time.perf_counter() - start

    def update(self) -> None:
        self.report(self.learner.learn(next(self.dataset)))
        self.recorder.tick()

    def run(self, seconds: float) -> None:
        torch.set_flush_denormal(self.flush)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            self.update()
            self.updates += 1
        self.elapsed += time.perf_counter() - start


def measure(setup: str, seconds: float, slices: int) -> list[dict]:
    """The paths' updates/s, measured in ``slices`` interleaved turns each (this machine's
    speed drifts; interleaving spreads the drift over every path alike)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: Path(setup, name, tmp) for name in PATHS}
        for _ in range(slices):
            for path in paths.values():
                path.run(seconds / slices)
        for path in paths.values():
            path.recorder.close()
    before = paths["before"].updates / paths["before"].elapsed
    rows = []
    for name, p in paths.items():
        rate = p.updates / p.elapsed
        rows.append(dict(bench="learner_step", agent="dqn", network=setup, env=p.env_id,
                         path=name, optimizer=p.config.optimizer,
                         batch_size=p.config.batch_size, updates_per_s=round(rate, 1),
                         speedup_vs_before=round(rate / before, 2),
                         warmup_s=round(p.warmup, 2), machine=MACHINE))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=20.0, help="per path and network")
    parser.add_argument("--slices", type=int, default=20, help="interleaved turns per path")
    parser.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    for setup in args.setups:
        for row in measure(setup, args.seconds, args.slices):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
