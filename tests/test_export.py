"""``rlherd export``: the ONNX and TorchScript files act as rlherd's own policy does, on real
episodes, for a feed-forward, a recurrent, a dict-observation, a masked and a continuous
policy; ``--stochastic`` samples what rlherd samples from the same noise; the guide's
inference script runs as written; what cannot be exported is one line.

Each comparison is also shown to fail where the file leaves something out (the normaliser, the
recurrent state, the mask), so that a pass means something."""

from __future__ import annotations

import ast
import importlib.util
import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from mixed_env import MIXED
from test_docs import ROOT, blocks

import rlherd
from rlherd import types as F
from rlherd.agents.ppo.networks import PPONet
from rlherd.cli import main
from rlherd.commands.export import export, file_format
from rlherd.errors import ConfigError
from rlherd.networks.distributions import DiagGaussian

# name: (agent, environment, config fields). Tiny runs: a few hundred steps, a learner step or
# two, so that the normaliser's statistics and the weights are not their initial values.
RUNS = {
    "feedforward": ("ppo", "CartPole-v1", dict(normalize_obs=True)),
    "recurrent": ("impala", "CartPole-v1", dict(use_lstm=True, lstm_size=32)),
    "r2d2": ("r2d2", "CartPole-v1", dict(lstm_size=32, evaluation_epsilon=0.0)),  # greedy
    "dict": ("ppo", MIXED, {}),
    "masked": ("impala", "rlherd/DictCorridor-v0", {}),
    "continuous": ("ppo", "Pendulum-v1", dict(normalize_obs=True)),
}
FORMATS = ["onnx", "torchscript"]
TOLERANCE = dict(rtol=1e-4, atol=1e-4)
onnxruntime = pytest.importorskip("onnxruntime")  # the export extra


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("export")


@pytest.fixture(scope="module")
def run(workdir):
    """``run(name)``: the run directory of :data:`RUNS` ``[name]``, trained on first use."""

    @cache
    def trained(name: str) -> Path:
        agent, env, fields = RUNS[name]
        return rlherd.train(agent, env, total_steps=600, seed=0, progress=False,
                            run_dir=workdir / name, **fields).path  # fmt: skip

    return trained


@pytest.fixture(scope="module")
def exported(run, workdir):
    """``exported(name, fmt, stochastic=False)``: that run's file, written on first use."""

    @cache
    def file(name: str, fmt: str, stochastic: bool = False) -> Path:
        suffix = "-stochastic" if stochastic else ""
        out = workdir / "files" / f"{name}{suffix}.{fmt}"
        out.parent.mkdir(exist_ok=True)
        return export(run(name), fmt, stochastic, out)

    return file


class Exported:
    """An exported file, run as its users run it (onnxruntime; ``torch.jit.load``), fed and
    read by the names its own metadata gives."""

    def __init__(self, path: Path):
        if path.suffix == ".onnx":
            self.session = onnxruntime.InferenceSession(str(path))
            about = self.session.get_modelmeta().custom_metadata_map["rlherd"]
        else:
            extra = {"rlherd.json": ""}
            self.module = torch.jit.load(str(path), _extra_files=extra)
            about = extra["rlherd.json"]
        self.meta = json.loads(about)
        self.inputs, self.outputs = self.meta["inputs"], self.meta["outputs"]

    def zero_state(self, rows: int) -> dict[str, np.ndarray]:
        return {name: np.zeros((rows, *i["shape"]), i["dtype"])
                for name, i in self.inputs.items() if i["role"] == "state"}  # fmt: skip

    def __call__(self, obs, state: dict[str, np.ndarray], noise=None) -> dict[str, np.ndarray]:
        """The outputs for a batch ``obs`` (an array or a dict of arrays)."""
        feed = dict(state)
        for name, i in self.inputs.items():
            if i["role"] == "observation":
                feed[name] = np.asarray(obs if i["key"] is None else obs[i["key"]], i["dtype"])
        if noise is not None:
            feed["noise"] = np.asarray(noise, np.float32)
        if hasattr(self, "session"):
            return dict(zip(self.outputs, self.session.run(self.outputs, feed), strict=True))
        with torch.no_grad():
            values = self.module(*(torch.as_tensor(feed[name]) for name in self.inputs))
        return {name: v.numpy() for name, v in zip(self.outputs, values, strict=True)}


def stack(observations: list):
    """Environments' observations as one batch (a dict observation key by key)."""
    if isinstance(observations[0], dict):
        return {k: np.stack([np.asarray(o[k]) for o in observations]) for k in observations[0]}
    return np.stack(observations)


def expected_outputs(outputs: dict[str, torch.Tensor], continuous: bool) -> dict[str, np.ndarray]:
    """What rlherd's policy computed, by the names the exported file gives the same numbers: a
    Gaussian's parameters as ``mean`` and ``log_std``, anything else's as ``logits``."""
    params = outputs.get(F.POLICY_LOGITS, outputs.get(F.POLICY_PARAMS))
    named = {"logits": params, "q_values": outputs.get("q_values"),
             "value": outputs.get(F.BASELINE)}  # fmt: skip
    if continuous:
        named["mean"], named["log_std"] = DiagGaussian.split(named.pop("logits"))
    return {k: v.numpy() for k, v in named.items() if v is not None}


def compare(path: Path, run_dir: Path, env_id: str, steps: int = 8, rows: int = 5,
            carry_state: bool = True) -> int:  # fmt: skip
    """Step ``rows`` environments for ``steps`` steps with rlherd's greedy policy (the one
    :func:`rlherd.load_policy` returns), feeding the same observations to the exported file:
    its actions are rlherd's, and its logits, Q-values, values (and a Gaussian's mean) are the
    policy's to :data:`TOLERANCE`; its recurrent state goes back in at each step (unless not
    ``carry_state``). The number of steps compared."""
    file = Exported(path)
    trained = rlherd.load_policy(run_dir)
    policy = trained.make_actor().policy  # what stands behind the actions, called as actors do
    ref_state = policy.initial_state(rows)
    first = torch.ones(rows, dtype=torch.bool)
    state = file.zero_state(rows)
    envs = [rlherd.make(env_id) for _ in range(rows)]
    obs = [env.reset(seed=i)[0] for i, env in enumerate(envs)]
    continuous = trained.spec.action_kind == "continuous"
    for _ in range(steps):
        batch = stack(obs)
        actions = trained(batch)
        outputs, ref_state = policy(F.map_obs(torch.as_tensor, batch), first, ref_state, None)
        first[:] = False
        got = file(batch, state)
        if continuous:
            np.testing.assert_allclose(got["action"], actions, **TOLERANCE)
        else:
            np.testing.assert_array_equal(got["action"], actions)
        for name, want in expected_outputs(outputs, continuous).items():
            np.testing.assert_allclose(got[name], want, **TOLERANCE, err_msg=name)
        if carry_state:
            state = {name: got[f"next_{name}"] for name in state}
        for k, env in enumerate(envs):
            obs[k], _, terminated, truncated, _ = env.step(actions[k])
            if terminated or truncated:
                obs[k] = env.reset()[0]
    for env in envs:
        env.close()
    return steps


# ------------------------------------------------------------------------------- acting
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_feed_forward_policy_acts_as_rlherds(exported, run, fmt):
    """PPO on CartPole with its observation normaliser: actions, logits and values."""
    path = exported("feedforward", fmt)
    assert Exported(path).outputs == ["action", "logits", "value"]
    compare(path, run("feedforward"), "CartPole-v1")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", ["recurrent", "r2d2"])
def test_a_recurrent_policy_carries_its_state_as_inputs_and_outputs(exported, run, name, fmt):
    """IMPALA's LSTM and R2D2's: the state goes out and back in for 12 steps, and the file acts
    as rlherd's policy does, which keeps the state itself."""
    path = exported(name, fmt)
    file = Exported(path)
    assert file.inputs["core_state.0"]["shape"] == [1, 32]  # [layers, hidden], batch first
    assert file.outputs[-2:] == ["next_core_state.0", "next_core_state.1"]
    compare(path, run(name), "CartPole-v1", steps=12)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_dict_observation_is_one_input_per_array_in_its_own_dtype(exported, run, fmt):
    """The mixed corridor's nested arrays of eight dtypes (uint8 image, int16, bool, int8,
    int64 codes, floats), each an input the graph encodes as PPO's multi-input torso does."""
    path = exported("dict", fmt)
    inputs = Exported(path).inputs
    assert inputs["obs.agent.cell"] == dict(role="observation", key="agent.cell", shape=[],
                                            dtype="int64")  # fmt: skip
    assert inputs["obs.image"]["dtype"] == "uint8" and inputs["obs.at_wall"]["dtype"] == "bool"
    assert len(inputs) == 8
    compare(path, run("dict"), MIXED)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_action_mask_is_an_input_the_graph_obeys(exported, run, fmt):
    """The dict corridor forbids moving left at the left end: the file's logit for it is the
    lowest float there and its action never takes it, as rlherd's; with the mask lifted, the
    same observation gets another logit (the mask is read inside the graph)."""
    path = exported("masked", fmt)
    compare(path, run("masked"), "rlherd/DictCorridor-v0")
    file = Exported(path)
    at_left = {"cell": np.array([0]), "ends": np.array([[1, 0]], np.int8),
               "action_mask": np.array([[0, 1]], np.int8)}  # fmt: skip
    masked = file(at_left, {})
    assert masked["logits"][0, 0] == np.finfo(np.float32).min and masked["action"][0] == 1
    lifted = file({**at_left, "action_mask": np.array([[1, 1]], np.int8)}, {})
    assert lifted["logits"][0, 0] > -1e3


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_continuous_policy_gives_its_clipped_action_and_its_gaussian(exported, run, fmt):
    """PPO on Pendulum, normaliser included: the mean action clipped to [-2, 2] as the actor
    clips it, and the Gaussian's mean and log std."""
    path = exported("continuous", fmt)
    file = Exported(path)
    assert file.outputs == ["action", "mean", "log_std", "value"]
    assert file.meta["action_space"] == dict(kind="continuous", shape=[1], low=[-2.0],
                                             high=[2.0])  # fmt: skip
    compare(path, run("continuous"), "Pendulum-v1")


# ------------------------------------------------------------------ the checks can fail
def test_the_comparison_fails_without_the_normaliser(run, workdir, monkeypatch):
    """A file exported with PPO's normaliser skipped acts otherwise than the run, and the
    comparison of the tests above says so."""
    monkeypatch.setattr(PPONet, "normalize", lambda self, obs: obs.float())
    path = export(run("feedforward"), "torchscript", output=workdir / "unnormalised.pt")
    monkeypatch.undo()
    with pytest.raises(AssertionError):
        compare(path, run("feedforward"), "CartPole-v1")


def test_the_comparison_fails_when_the_state_is_not_carried(exported, run):
    with pytest.raises(AssertionError):
        compare(exported("recurrent", "onnx"), run("recurrent"), "CartPole-v1", steps=12,
                carry_state=False)  # fmt: skip


# ---------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("name", ["recurrent", "continuous"])
def test_stochastic_files_sample_what_rlherd_samples_from_the_same_noise(exported, run, name):
    """rlherd's sampling policy draws from a seeded generator; the file, given the numbers that
    generator draws (a uniform per row for a categorical, a normal per dimension for a
    Gaussian), samples the same actions. Zero noise gives a Gaussian's mean."""
    file = Exported(exported(name, "onnx", stochastic=True))
    noise = file.inputs["noise"]
    sampler = rlherd.load_policy(run(name), greedy=False)
    policy, spec, rows = sampler.make_actor().policy, sampler.spec, 64
    env = rlherd.make(RUNS[name][1])
    batch = stack([env.reset(seed=i)[0] for i in range(rows)])
    outputs, _ = policy(torch.as_tensor(batch), torch.ones(rows, dtype=torch.bool),
                        policy.initial_state(rows), torch.Generator().manual_seed(7))  # fmt: skip
    draws = torch.Generator().manual_seed(7)
    if noise["distribution"] == "uniform":
        u = torch.rand((rows, 1), generator=draws)[:, 0].numpy()
        got = file(batch, file.zero_state(rows), u)["action"]
        np.testing.assert_array_equal(got, outputs[F.ACTION].numpy())
        assert len(set(got.tolist())) == 2  # it samples: both actions, from one observation kind
        return
    z = torch.randn((rows, *spec.action_shape), generator=draws).numpy()
    got = file(batch, {}, z)
    want = np.clip(outputs[F.ACTION].numpy(), spec.action_low, spec.action_high)
    np.testing.assert_allclose(got["action"], want, **TOLERANCE)
    mean = file(batch, {}, np.zeros_like(z))
    np.testing.assert_allclose(mean["action"], np.clip(got["mean"], -2, 2), **TOLERANCE)


def test_stochastic_needs_a_policy_that_outputs_its_distribution(run):
    with pytest.raises(ConfigError, match="r2d2's policy outputs only action, q_values: export "
                       "its greedy action, without --stochastic"):  # fmt: skip
        export(run("r2d2"), "torchscript", stochastic=True)


# ----------------------------------------------------------- the guide and the command
def _guide_script() -> str:
    guide = ROOT / "docs" / "guides" / "export.md"
    return next(b.text for b in blocks(guide, "python") if b.text.startswith("# act.py"))


def test_the_guides_script_is_about_twenty_lines_of_onnxruntime_and_numpy():
    script = _guide_script()
    tree = ast.parse(script)
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}  # fmt: skip
    assert imported == {"json", "numpy", "onnxruntime"}
    assert not any(isinstance(node, ast.ImportFrom) for node in ast.walk(tree))
    assert len([line for line in script.splitlines() if line.strip()]) <= 32


@pytest.mark.parametrize("name", ["feedforward", "recurrent", "dict"])
def test_the_guides_script_acts_as_rlherd_for_an_episode(exported, run, name, tmp_path):
    """``act.py`` as the guide writes it, one environment, one observation at a time for a
    whole episode (the recurrent state carried by the script), against rlherd's policy."""
    (tmp_path / "act.py").write_text(_guide_script())
    spec = importlib.util.spec_from_file_location("act", tmp_path / "act.py")
    act = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(act)
    policy = act.Policy(str(exported(name, "onnx")))
    trained = rlherd.load_policy(run(name))
    env = rlherd.make(RUNS[name][1])
    obs, _ = env.reset(seed=3)
    done, steps = False, 0
    while not done:
        action = policy(obs)
        assert action == trained(obs), steps
        obs, _, terminated, truncated, _ = env.step(action)
        done, steps = terminated or truncated, steps + 1
    assert steps >= 4


def test_an_output_ending_in_a_slash_is_a_folder_made_for_the_file(run, workdir, capsys):
    """``-o exports/new/`` names a folder: the file goes in it by its default name, the folder
    made. ``Path`` drops the slash, so the export was a file named ``new`` instead."""
    folder = workdir / "slashed" / "new"
    assert main(["export", str(run("feedforward")), "-o", f"{folder}/"]) == 0
    assert capsys.readouterr().out.strip() == str(folder / "policy.onnx")
    assert folder.is_dir() and (folder / "policy.onnx").stat().st_size > 0


def test_the_command_writes_where_it_says_and_refuses_in_one_line(run, workdir, capsys):
    """``rlherd export`` prints the file it wrote (by default in the run directory); a search
    agent and a format its file's name contradicts are one line each, exit 2."""
    assert main(["export", str(run("feedforward")), "--format", "torchscript"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path == run("feedforward") / "policy.pt" and path.stat().st_size > 0
    elsewhere = workdir / "exports" / "cartpole" / "policy.pt"  # its folders made, as a run's
    assert main(["export", str(run("feedforward")), "--format", "torchscript", "-o",
                 str(elsewhere)]) == 0 and elsewhere.stat().st_size > 0  # fmt: skip
    # Without --format, -o's suffix says which; a --format the suffix contradicts is refused
    named = workdir / "exports" / "named.pt"
    assert main(["export", str(run("feedforward")), "-o", str(named)]) == 0
    assert torch.jit.load(named) is not None
    capsys.readouterr()
    # A folder that exists is where the file goes, by its default name (as `cp` takes one).
    assert main(["export", str(run("feedforward")), "-o", str(workdir / "exports")]) == 0
    assert capsys.readouterr().out.strip() == str(workdir / "exports" / "policy.onnx")
    assert (workdir / "exports" / "policy.onnx").stat().st_size > 0
    package = workdir / "exports" / "package"  # read, never written: not even into with -o
    package.mkdir()
    (package / "policy.safetensors").write_bytes(b"")
    assert main(["export", str(run("feedforward")), "-o", str(package)]) == 2
    assert "is a package, which rlherd export does not write into" in capsys.readouterr().err
    assert not (package / "policy.onnx").exists()
    assert main(["export", str(run("feedforward")), "--format", "onnx", "-o",
                 str(workdir / "exports" / "other.pth")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "suffix is torchscript's, and --format is onnx" in err
    assert not (workdir / "exports" / "other.pth").exists()
    mcts = rlherd.train("mcts", "open_spiel/tic_tac_toe", total_steps=50, progress=False,
                        run_dir=workdir / "mcts").path  # fmt: skip
    assert main(["export", str(mcts)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mcts acts by searching its environment" in err


def test_a_missing_extra_names_it(run, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    with pytest.raises(ConfigError, match=r'needs onnxruntime: pip install "rlherd\[export\]"'):
        export(run("feedforward"), "onnx")


@pytest.mark.parametrize("fmt, output, chosen", [
    (None, None, "onnx"), (None, "policy", "onnx"), (None, "p.onnx", "onnx"),
    (None, "p.pt", "torchscript"), (None, "dir/P.PTH", "torchscript"),
    ("torchscript", "policy", "torchscript"), ("onnx", "p.ONNX", "onnx"),
    ("torchscript", "p.onnx", "suffix is onnx's"), ("onnx", "p.pt", "suffix is torchscript's"),
    ("tflite", None, "unknown format"),
])  # fmt: skip
def test_the_format_is_the_one_asked_for_or_the_one_the_files_suffix_names(fmt, output, chosen):
    if " " not in chosen:
        assert file_format(fmt, output) == chosen
    else:
        with pytest.raises(ConfigError, match=chosen):
            file_format(fmt, output)
