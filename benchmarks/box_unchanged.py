"""Array (Box) observations train exactly as before: this tree against an older commit, bit for
bit, after the same learner steps.

Each case trains in a process of its own for each tree (the older commit checked out into a
temporary git worktree: ``trees.py``), then hashes every tensor of the learner's state
in its last checkpoint (network, target network, optimiser state). Equal hashes mean every
update saw the same numbers.

- ``single``: one process, so a whole run is deterministic: the learner's parameters after all
  its steps are compared.
- ``mono``: actor processes fetch parameters whenever the learner publishes them, so which
  parameters acted depends on timing, even between two runs of one tree. The check runs one
  actor at a learning rate of 1e-30, which leaves every parameter unchanged in float32: actors
  always act with the initial ones, rollouts are reproducible, and the optimiser's moments,
  which accumulate every gradient, are compared at the same number of learner steps (whether
  the learner took the last batch before the run ended is timing too). That checks the data
  path (shared-memory rollout slots, the learner's batches) bit for bit.

Prints one JSON line per case and tree, and one per case with ``equal``.
Usage: python benchmarks/box_unchanged.py [--rev 64a6c20] [--cases impala-single ...]
"""

from __future__ import annotations

import argparse
import json

from trees import ROOT, older_tree, run_in

from rlherd.run.provenance import machine

MACHINE = machine()

FROZEN = dict(learning_rate=1e-30, num_actors=1)  # mono: parameters never move (see above)
CASES: dict[str, tuple[str, str, str, int, dict]] = {
    # name: (agent, env, runtime, total steps, overrides)
    "impala-single": ("impala", "CartPole-v1", "single", 6_000, {}),
    "impala-minatar-single": ("impala", "MinAtar/Breakout-v1", "single", 3_000, {}),
    "ppo-single": ("ppo", "CartPole-v1", "single", 6_000, {}),
    "ppo-pendulum-single": ("ppo", "Pendulum-v1", "single", 4_000, {}),
    "dqn-single": ("dqn", "CartPole-v1", "single", 3_000, {}),
    "r2d2-single": ("r2d2", "rlherd/MaskedCartPole-v1", "single", 3_000, {}),
    "d4pg-single": ("d4pg", "Pendulum-v1", "single", 1_500, {}),
    "mcts-single": ("mcts", "CartPole-v1", "single", 600, {}),
    "impala-mono": ("impala", "CartPole-v1", "mono", 6_000, FROZEN),
    "ppo-mono": ("ppo", "CartPole-v1", "mono", 6_000, FROZEN),
}

# One training run, in a process of its own: rlherd is whichever tree PYTHONPATH puts first.
RUN = """
import hashlib, json, sys, tempfile
import torch
import rlherd
from rlherd.run.rundir import RunDir

def tensors(value, path=""):
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            yield from tensors(value[k], f"{path}/{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from tensors(v, f"{path}/{i}")

if __name__ == "__main__":
    agent, env, runtime, steps, extra = json.loads(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        run = rlherd.train(agent, env, runtime=runtime, total_steps=steps, seed=3, run_dir=tmp,
                           progress=False, **extra)
        learner = RunDir(tmp).load_checkpoint()["learner"]
    digest, count = hashlib.sha256(), 0
    for path, t in tensors(learner):
        digest.update(path.encode())
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
        count += 1
    print(json.dumps(dict(sha256=digest.hexdigest()[:16], tensors=count,
                          learner_steps=run.summary["learner_steps"])))
"""


def fingerprint(script: str, tree: str, case: tuple) -> dict:
    return json.loads(run_in(tree, script, json.dumps(case)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rev", default="64a6c20", help="the older commit")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    args = parser.parse_args()
    with older_tree(args.rev, RUN) as (script, old):
        for name in args.cases:
            # learner steps -> fingerprints, per tree. On mono the run ends when the actors
            # have taken their steps, and the learner may or may not have taken its last
            # batches by then: runs are compared at the same learner steps, running again (up
            # to 4 rounds) until both trees have a run at the same count.
            prints: dict[str, dict[int, set[str]]] = {args.rev: {}, "this": {}}
            for _ in range(4 if CASES[name][2] == "mono" else 1):
                for tree_name, tree in ((args.rev, old), ("this", ROOT)):
                    got = fingerprint(script, tree, CASES[name])
                    prints[tree_name].setdefault(got["learner_steps"], set()).add(got["sha256"])
                    print(json.dumps(dict(bench="box_unchanged", case=name, tree=tree_name,
                                          **got, machine=MACHINE)), flush=True)
                common = set(prints[args.rev]) & set(prints["this"])
                if common:
                    break
            equal = bool(common) and all(
                prints[args.rev][n] == prints["this"][n] and len(prints["this"][n]) == 1
                for n in common
            )
            print(json.dumps(dict(bench="box_unchanged", case=name, rev=args.rev, equal=equal,
                                  machine=MACHINE)), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
