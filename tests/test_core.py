"""Acme's seams: Counter, VariableClient, EnvironmentLoop (with next-step autoreset), and
TensorFlow Agents' batched algorithm interface driven by simulate."""

import threading
import time

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlherd import envs
from rlherd.core import Actor, BatchedAlgorithm, VariableClient
from rlherd.run.counting import Counter
from rlherd.run.loop import EnvironmentLoop, simulate


def test_counter_prefixes_and_state():
    root = Counter()
    actor, learner = Counter(root, "actor"), Counter(root, "learner")
    actor.increment(steps=5)
    actor.increment(steps=2, episodes=1)
    learner.increment(steps=1)
    assert root.get_counts() == {"actor_steps": 7, "actor_episodes": 1, "learner_steps": 1}
    assert Counter(actor, "worker0").increment(steps=1)["actor_worker0_steps"] == 1
    restored = Counter()
    restored.load_state_dict(root.state_dict())
    assert restored.get_counts() == root.get_counts()


def test_counter_is_thread_safe():
    root = Counter()
    child = Counter(root, "actor")
    threads = [
        threading.Thread(target=lambda: [child.increment(steps=1) for _ in range(1000)])
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert root.get_counts()["actor_steps"] == 4000


class Source:
    def __init__(self):
        self.module = torch.nn.Linear(2, 2)
        self.calls = 0

    def get_variables(self, names):
        self.calls += 1
        return [self.module.state_dict() for _ in names]


def test_variable_client_fetches_every_n_calls_in_the_background():
    source, local = Source(), torch.nn.Linear(2, 2)
    client = VariableClient(source, local, update_period=3)
    client.update()
    client.update()
    assert source.calls == 0
    client.update()  # third call: a background fetch starts
    deadline = time.monotonic() + 5
    while not torch.equal(local.weight, source.module.weight) and time.monotonic() < deadline:
        time.sleep(0.01)
        client.update()  # applies what the background fetch brought
    torch.testing.assert_close(local.weight, source.module.weight)
    assert 1 <= source.calls <= 3
    with torch.no_grad():
        source.module.weight.add_(1.0)
    client.update(wait=True)
    torch.testing.assert_close(local.weight, source.module.weight)


class RecordingActor:
    def __init__(self):
        self.events = []

    def select_action(self, obs):
        return np.ones(len(obs), dtype=np.int64)  # always right

    def observe_first(self, obs, envs):
        self.events.append(
            ("first", np.flatnonzero(envs).tolist(), obs[envs, :].argmax(1).tolist())
        )

    def observe(self, action, reward, next_obs, terminated, truncated, skip, extras=None):
        self.events.append(("step", (~skip).tolist(), terminated.tolist()))

    def update(self, wait=False):
        pass


def test_environment_loop_skips_autoreset_steps():
    vec = envs.make_vector("rlherd/Corridor-v0", 2, length=3)
    actor = RecordingActor()
    assert isinstance(actor, Actor)
    episodes = []

    class Rec:
        steps = 0

        def add_actor_steps(self, n, agent_steps=0):
            Rec.steps += n

        def episodes(self, returns, lengths, policies=None):
            episodes.extend(zip(returns.tolist(), lengths.tolist(), strict=True))

    loop = EnvironmentLoop(vec, actor, Rec(), seed=0)
    for _ in range(4):
        loop.step()
    assert actor.events == [
        ("first", [0, 1], [0, 0]),
        ("step", [True, True], [False, False]),
        ("step", [True, True], [True, True]),  # both reach the end
        ("step", [False, False], [False, False]),  # autoreset step: not a transition
        ("first", [0, 1], [0, 0]),  # the new episodes' first observations
        ("step", [True, True], [False, False]),
    ]
    assert [(round(r, 6), n) for r, n in episodes] == [(0.98, 2), (0.98, 2)]
    assert Rec.steps == 8


class RecordingAlgorithm:
    """TensorFlow Agents' batched interface, recording its calls."""

    def __init__(self):
        self.calls = []

    def begin_episodes(self, indices):
        self.calls.append(("begin", indices.tolist()))

    def perform(self, obs):
        self.calls.append(("perform", obs.argmax(1).tolist()))
        return np.ones(len(obs), dtype=np.int64)

    def experience(self, obs, action, reward, next_obs, terminated, truncated, skip):
        self.calls.append(("experience", (~skip).tolist(), next_obs.argmax(1).tolist()))

    def end_episodes(self, indices):
        self.calls.append(("end", indices.tolist()))


def test_simulate_drives_the_batched_algorithm_interface():
    # Episodes end at different steps: env 0 is truncated after every step.
    vec = gym.vector.SyncVectorEnv(
        [lambda n=n: envs.make("rlherd/Corridor-v0", length=3, max_steps=n) for n in (1, 50)],
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP,
    )
    algorithm = RecordingAlgorithm()
    assert isinstance(algorithm, BatchedAlgorithm)
    simulate(vec, algorithm, steps=4, seed=0)
    assert algorithm.calls == [
        ("begin", [0, 1]),
        ("perform", [0, 0]),
        ("experience", [True, True], [1, 1]),
        ("end", [0]),
        ("perform", [1, 1]),
        ("experience", [False, True], [0, 2]),  # env 0 resets: not a transition
        ("end", [1]),
        ("begin", [0]),
        ("perform", [0, 2]),
        ("experience", [True, False], [1, 0]),
        ("end", [0]),
        ("begin", [1]),
        ("perform", [1, 0]),
        ("experience", [False, True], [0, 1]),
    ]


@pytest.mark.parametrize("max_norm", [None, 1.0, 1e9])
def test_clip_grad_norm_gives_pytorchs_numbers(max_norm):
    """rlherd's lean clip (agents/learning.py) against torch.nn.utils.clip_grad_norm_: the same
    norm and the same gradients, bit for bit, whether it clips (1.0) or not (1e9, None)."""
    from rlherd.agents.learning import clip_grad_norm

    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Linear(32, 3)) for _ in "ab"]
    for ours, theirs in zip(*(n.parameters() for n in nets), strict=True):
        ours.grad = torch.randn_like(ours) * 10
        theirs.grad = ours.grad.clone()
    norm = clip_grad_norm(nets[0].parameters(), max_norm)
    limit = float("inf") if max_norm is None else max_norm
    expected = torch.nn.utils.clip_grad_norm_(nets[1].parameters(), limit, foreach=True)
    assert norm.item() == expected.item() > 1.0
    for ours, theirs in zip(*(n.parameters() for n in nets), strict=True):
        assert torch.equal(ours.grad, theirs.grad)


def test_flattened_parameters_train_as_the_network_did():
    """After ``flatten_parameters`` the network computes what it did, ``backward`` fills the one
    flat gradient with every parameter's gradient, and Adam on the flat parameter takes the steps
    that Adam on the separate parameters takes (elementwise: the same numbers, up to the last bit
    of float32, where a CPU's vector width splits the flat tensor's loop differently)."""
    import copy

    from rlherd.agents.learning import adam, flatten_parameters

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(12, 5))  # fmt: skip
    plain = copy.deepcopy(net)
    flat = flatten_parameters(net)
    assert flat.numel() == sum(p.numel() for p in plain.parameters())
    optimizers = adam([flat], 1e-2), adam(plain.parameters(), 1e-2)
    for step in range(3):
        x = torch.randn(4, 2, 4, 4)
        torch.testing.assert_close(net(x), plain(x), rtol=1e-6, atol=1e-7)
        flat.grad.zero_()
        plain.zero_grad()
        net(x).square().sum().backward()
        plain(x).square().sum().backward()
        grads = torch.cat([p.grad.reshape(-1) for p in plain.parameters()])
        torch.testing.assert_close(flat.grad, grads, rtol=1e-6, atol=1e-7)
        for optimizer in optimizers:
            optimizer.step()
        for ours, theirs in zip(net.parameters(), plain.parameters(), strict=True):
            assert ours.data_ptr() != theirs.data_ptr()
            torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7, msg=f"step {step}")
    assert all(p.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
               for p in net.parameters())  # fmt: skip


def test_a_network_learner_loads_its_parts_in_place():
    """``NetworkLearner``'s checkpoint, part by kind: a network, a tensor and a dict's tensor are
    loaded into the very objects the optimiser updates (replacing them would leave it updating
    tensors the learner no longer has); plain values, alone or in a dict, are set."""
    from rlherd.agents.learning import NetworkLearner, adam

    class Learner(NetworkLearner):
        checkpointed = ("net", "scale", "duals", "optimizer", "beta")

        def __init__(self):
            self.net, self.num_steps, self.beta = torch.nn.Linear(3, 2), 0, 1.0
            self.scale = torch.zeros((), requires_grad=True)
            self.duals = dict(temperature=torch.zeros(2, requires_grad=True), count=0)
            self.optimizer = adam(self.tensors(), 1e-3)

        def tensors(self) -> list[torch.Tensor]:
            return [*self.net.parameters(), self.scale, self.duals["temperature"]]

    saved = Learner()
    with torch.no_grad():
        for tensor in saved.tensors():
            tensor.add_(torch.randn_like(tensor))
    saved.num_steps, saved.beta, saved.duals["count"] = 7, 1.5, 3
    learner = Learner()
    updated = [id(t) for t in learner.optimizer.param_groups[0]["params"]]
    learner.load_state_dict(saved.state_dict())
    assert [id(t) for t in learner.tensors()] == updated
    for ours, theirs in zip(learner.tensors(), saved.tensors(), strict=True):
        assert torch.equal(ours, theirs) and ours.requires_grad
    assert (learner.num_steps, learner.beta, learner.duals["count"]) == (7, 1.5, 3)


def test_centered_rmsprop_gives_pytorchs_numbers():
    """rlherd's CenteredRMSprop (agents/learning.py) against torch.optim.RMSprop(centered=True):
    the same parameters after several steps, bit for bit."""
    from rlherd.agents.learning import CenteredRMSprop

    torch.manual_seed(0)
    ours, theirs = torch.nn.Parameter(torch.randn(50)), torch.nn.Parameter(torch.zeros(50))
    theirs.data.copy_(ours.data)
    optimizers = (
        CenteredRMSprop([ours], 1e-2, 0.95, 0.01),
        torch.optim.RMSprop([theirs], 1e-2, alpha=0.95, eps=0.01, centered=True),
    )
    for _ in range(5):
        grad = torch.randn(50)
        ours.grad, theirs.grad = grad.clone(), grad.clone()
        for optimizer in optimizers:
            optimizer.step()
        assert torch.equal(ours, theirs)
    assert not torch.equal(ours, grad)


def test_compiled_step_takes_any_batch_structure_and_updates_as_eager_adam():
    """CompiledStep over a network and a frozen one: a batch given as a dict and a None, an
    auxiliary output nested in tuples (returned in its structure), Adam's update as torch's
    fused Adam makes it, and the frozen module's parameters read at every call (not baked in)."""
    from rlherd.agents.learning import CompiledStep, adam, clip_grad_norm, flatten_parameters

    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
            for _ in range(2)]  # fmt: skip
    frozen = torch.nn.Linear(3, 1).requires_grad_(False)
    nets[1].load_state_dict(nets[0].state_dict())
    flats = [flatten_parameters(net) for net in nets]
    optimizers = [adam([flat], 1e-2) for flat in flats]

    def loss_fn(net, batch, none):
        assert none is None
        error = net(batch["x"])[:, 0] + frozen(batch["x"])[:, 0] - batch["y"]
        return error.square().mean(), (error.detach(), (batch["y"].sum(),))

    step = CompiledStep(lambda batch, none: loss_fn(nets[1], batch, none), [nets[1], frozen],
                        flats[1], optimizers[1], max_norm=0.5)  # fmt: skip
    for _ in range(4):
        batch = dict(x=torch.randn(16, 3), y=torch.randn(16))
        loss, (error, _) = loss_fn(nets[0], batch, None)
        flats[0].grad.zero_()
        loss.backward()
        norm = clip_grad_norm(list(nets[0].parameters()), 0.5)
        optimizers[0].step()
        compiled_loss, (compiled_error, (y_sum,)), compiled_norm = step(batch, None)
        torch.testing.assert_close(compiled_loss, loss.detach())
        torch.testing.assert_close(compiled_error, error)
        torch.testing.assert_close(y_sum, batch["y"].sum())
        torch.testing.assert_close(compiled_norm, norm)
        torch.testing.assert_close(flats[1], flats[0], rtol=1e-5, atol=1e-6)
        with torch.no_grad():
            frozen.bias += 1.0  # read anew at the next call
    assert len(step.compiled) == 1
