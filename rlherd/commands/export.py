"""``rlherd export``: a run's policy as one ONNX or TorchScript file that acts from raw
observations, for inference where rlherd is not installed (onnxruntime and numpy suffice).

The file holds the agent's own policy, the one ``rlherd eval`` and :func:`rlherd.load_policy`
act with, traced: whatever it does to an observation is in the graph (observation
normalisation, frame scaling, the encoders of a dict observation, the action mask), and so is
what the actor does to its action (clipping a Gaussian's to the action box). Inputs and outputs,
all batch first (any batch size):

- inputs: ``obs`` (one array), or ``obs.KEY`` for each array of a dict observation (its
  ``action_mask`` too), in the dtypes the environment gives; recurrent agents' state
  ``core_state.K`` (``[B, layers, hidden]``; zeros begin an episode); with ``--stochastic``,
  ``noise``;
- outputs: ``action``; then what the policy computes that a caller may want: ``logits``
  (discrete actions), ``mean`` and ``log_std`` (a Gaussian's), ``q_values``, ``value``; then the
  recurrent state for the next step, ``next_core_state.K``.

Sampling (``--stochastic``) reads its randomness from the ``noise`` input: a uniform number in
[0, 1) per head for discrete actions (the inverse-CDF sampler rlherd's actors use), standard
normal numbers per dimension for a Gaussian. Why an input and not a random operator in the graph:
ONNX's random operators are seeded per session or not at all and draw differently in each
runtime, while noise from the caller is reproducible (a seeded numpy generator) and samples
exactly what rlherd would sample with the same numbers, which the tests check.

A JSON description of the inputs and outputs (which observation key each input reads, shapes,
dtypes, the action space) travels inside the file: ONNX metadata ``rlherd``, TorchScript extra
file ``rlherd.json``.
"""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rlherd import types as F
from rlherd.commands.evaluate import run_policy
from rlherd.core import EnvSpec, Leaf
from rlherd.errors import ConfigError
from rlherd.networks.distributions import (
    Categorical,
    DiagGaussian,
    MultiCategorical,
    categorical_from_uniform,
    distribution_for,
)
from rlherd.run.package import is_package
from rlherd.run.provenance import machine
from rlherd.run.rundir import atomic_write_bytes, make_folder, names_folder

FORMATS = {"onnx": ".onnx", "torchscript": ".pt"}  # format: the default file's suffix
SUFFIXES = {".onnx": "onnx", ".pt": "torchscript", ".pth": "torchscript"}  # suffix: its format
METADATA = "rlherd"  # the ONNX metadata key; TorchScript's extra file is METADATA + ".json"
ONNX_MODULES = ("onnx", "onnxruntime", "onnxscript")  # what torch's exporter and the check use
STATE, NEXT = F.CORE_STATE, "next_"  # state inputs core_state.K, outputs next_core_state.K
TRACE_BATCH, CHECK_BATCH = 2, 3  # batches to trace with and to check the file with: they differ


class PolicyGraph(nn.Module):
    """The agent's policy as a graph of plain tensors: ``forward(*inputs) -> outputs``, in the
    order of :attr:`input_names` and :attr:`output_names` (see the module docstring).

    ``policy`` is the agent's greedy :class:`~rlherd.core.Policy`, called as its actor calls
    it; what decides the outputs is what it returns (one dry run on construction): logits
    (``policy_logits``) or a distribution's parameters (``policy_params``), Q-values, a value
    (``baseline``)."""

    def __init__(self, policy: Any, spec: EnvSpec, agent: str, stochastic: bool):
        super().__init__()
        self.policy, self.spec, self.stochastic = policy, spec, stochastic
        self.net = policy.net  # a submodule: its parameters and buffers become the graph's
        self.keys = list(spec.obs) if spec.structured else []
        self.states = [s.transpose(0, 1)[0] for s in policy.initial_state(1)]  # one row each
        self.continuous = spec.action_kind == "continuous"
        if self.continuous:  # the actor clips actions to the box (PPO's Gaussian samples)
            self.register_buffer("action_low", torch.as_tensor(spec.action_low).float())
            self.register_buffer("action_high", torch.as_tensor(spec.action_high).float())
        probe = example_inputs(self, 1)
        outputs, _ = self.policy(self.observation(probe), *self.first_and_state(probe), None)
        self.dist = _distribution(outputs, spec)
        if stochastic and self.dist is None:
            raise ConfigError(
                "--stochastic samples from the distribution a policy outputs (logits or a "
                f"Gaussian's parameters); {agent}'s policy outputs only {', '.join(outputs)}: "
                "export its greedy action, without --stochastic")  # fmt: skip
        self.noise_shape = _noise_shape(self.dist, spec) if stochastic else None
        self.output_names = [*self.named_outputs(outputs, None), *self.state_names(NEXT)]

    # --------------------------------------------------------------------------- interface
    @property
    def input_names(self) -> list[str]:
        noise = ["noise"] if self.stochastic else []
        return [*self.obs_names(), *self.state_names(), *noise]

    def obs_names(self) -> list[str]:
        """``obs``, or ``obs.KEY`` per array: the names rlherd's batches store them under."""
        return list(F.obs_fields(F.OBS, dict.fromkeys(self.keys) if self.keys else None))

    def state_names(self, prefix: str = "") -> list[str]:
        return [f"{prefix}{STATE}.{k}" for k in range(len(self.states))]

    def leaves(self) -> dict[str, Leaf]:
        """Each observation input's leaf."""
        leaves = [self.spec.obs[k] for k in self.keys] if self.keys else [self.spec.obs]
        return dict(zip(self.obs_names(), leaves, strict=True))

    def describe(self, record: Any) -> dict[str, Any]:
        """What the file's metadata says: enough to feed it and read it without rlherd."""
        inputs: dict[str, dict[str, Any]] = {}
        for (name, leaf), key in zip(self.leaves().items(), self.keys or [None], strict=True):
            inputs[name] = dict(role="observation", key=key, shape=list(leaf.shape),
                                dtype=np.dtype(leaf.dtype).name)  # fmt: skip
        for name, state in zip(self.state_names(), self.states, strict=True):
            inputs[name] = dict(role="state", shape=list(state.shape),
                                dtype=str(state.dtype).removeprefix("torch."))  # fmt: skip
        if self.stochastic:
            kind = "normal" if self.dist is DiagGaussian else "uniform"
            inputs["noise"] = dict(role="noise", distribution=kind, shape=list(self.noise_shape),
                                   dtype="float32")  # fmt: skip
        return dict(rlherd=machine()["rlherd"], agent=record.agent, env=record.env,
                    stochastic=self.stochastic, inputs=inputs, outputs=self.output_names,
                    action_space=_action_space(self.spec))  # fmt: skip

    # ------------------------------------------------------------------------- the graph
    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        first, state = self.first_and_state(inputs)
        outputs, state = self.policy(self.observation(inputs), first, state, None)
        noise = inputs[-1] if self.stochastic else None
        named = self.named_outputs(outputs, noise)
        return (*named.values(), *(s.transpose(0, 1) for s in state))

    def observation(self, inputs) -> torch.Tensor | dict[str, torch.Tensor]:
        """The observation, as the policy takes it, from the graph's inputs."""
        if not self.keys:
            return inputs[0]
        return dict(zip(self.keys, inputs[: len(self.keys)], strict=True))

    def first_and_state(self, inputs) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """No row begins an episode here (a caller begins one with zeros as the state), and the
        state inputs ``[B, layers, H]`` as the policy keeps them, ``[layers, B, H]``."""
        rows = inputs[0].reshape(inputs[0].shape[0], -1)[:, 0]  # shape[0]: a traced batch
        start = max(len(self.keys), 1)
        state = tuple(s.transpose(0, 1) for s in inputs[start : start + len(self.states)])
        return torch.zeros_like(rows, dtype=torch.bool), state

    def named_outputs(self, outputs: dict[str, torch.Tensor], noise: torch.Tensor | None):
        """The graph's outputs from the policy's: its action (or one sampled with ``noise``),
        clipped to the box; its distribution's parameters; its Q-values and value."""
        params = outputs.get(F.POLICY_LOGITS, outputs.get(F.POLICY_PARAMS))
        action = outputs[F.ACTION] if noise is None else _sample(self.dist, params, noise)
        if self.continuous:
            action = torch.clamp(action, self.action_low, self.action_high)
        named = {"action": action}
        if self.dist is DiagGaussian:
            named["mean"], named["log_std"] = DiagGaussian.split(params)
        elif self.dist is not None:
            named["logits"] = params
        if "q_values" in outputs:
            named["q_values"] = outputs["q_values"]
        if F.BASELINE in outputs:
            named["value"] = outputs[F.BASELINE]
        return named


def _distribution(outputs: dict[str, torch.Tensor], spec: EnvSpec):
    """The distribution a policy's outputs parameterise: IMPALA's logits are a categorical's,
    PPO's parameters its action space's; None where it gives none (Q-values, an action)."""
    if F.POLICY_LOGITS in outputs:
        return Categorical
    if F.POLICY_PARAMS in outputs:
        return distribution_for(spec)[0]
    return None


def _noise_shape(dist: Any, spec: EnvSpec) -> tuple[int, ...]:
    """One uniform number per categorical head, one normal number per Gaussian dimension."""
    if isinstance(dist, MultiCategorical):
        return (len(dist.nvec),)
    return tuple(spec.action_shape) if dist is DiagGaussian else ()


def _sample(dist: Any, params: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The action rlherd's actor samples from ``params`` when its generator draws ``noise``."""
    if dist is DiagGaussian:
        return DiagGaussian.from_normal(params, noise)
    if isinstance(dist, MultiCategorical):
        heads = dist.split(params)
        return torch.stack([categorical_from_uniform(h, noise[:, k, None])
                            for k, h in enumerate(heads)], -1)  # fmt: skip
    return categorical_from_uniform(params, noise[:, None])


def _action_space(spec: EnvSpec) -> dict[str, Any]:
    if spec.action_kind == "discrete":
        return dict(kind="discrete", n=spec.num_actions)
    if spec.action_kind == "multidiscrete":
        return dict(kind="multidiscrete", nvec=list(spec.action_nvec))
    return dict(kind="continuous", shape=list(spec.action_shape),
                low=np.asarray(spec.action_low).tolist(),
                high=np.asarray(spec.action_high).tolist())  # fmt: skip


def example_inputs(
    graph: PolicyGraph, batch: int, seed: int = 0, noise: bool = False
) -> tuple[torch.Tensor, ...]:
    """A batch of plausible inputs: observations within their leaves' ranges, a random state,
    and ``noise`` if asked. Tracing needs a batch; checking the file needs values that tell
    networks apart."""
    rng = np.random.default_rng(seed)
    arrays = []
    for leaf in graph.leaves().values():
        dtype, shape = np.dtype(leaf.dtype), (batch, *leaf.shape)
        if dtype.kind in "biu":  # bool, int, unsigned: codes, flags, counts
            high = leaf.categories or (2 if dtype.kind == "b" or leaf.kind == "binary" else 10)
            arrays.append(rng.integers(0, high, shape).astype(dtype))
        else:
            arrays.append(rng.standard_normal(shape).astype(dtype))
    arrays += [rng.standard_normal((batch, *s.shape)).astype(np.float32) for s in graph.states]
    if noise:
        shape = (batch, *graph.noise_shape)
        draw = rng.standard_normal if graph.dist is DiagGaussian else rng.random
        arrays.append(draw(shape).astype(np.float32))
    return tuple(torch.from_numpy(a) for a in arrays)


def require_onnx() -> None:
    """One line naming the extra where torch's ONNX exporter or onnxruntime is missing."""
    missing = [m for m in ONNX_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(f"rlherd export --format onnx needs {', '.join(missing)}: "
                          'pip install "rlherd[export]"')  # fmt: skip


def onnx_bytes(graph: PolicyGraph, inputs: tuple[torch.Tensor, ...], about: str) -> bytes:
    """The graph as an ONNX model (torch.export's exporter, the batch dimension of every input
    and output left free) holding ``about`` as metadata."""
    import onnx_ir as ir

    batch = torch.export.Dim("batch")
    quiet = logging.getLogger("torch.onnx")  # its notes on torchvision's operators: not used
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        free = (tuple({0: batch} for _ in inputs),)  # one entry: forward's *inputs
        program = torch.onnx.export(graph, inputs, dynamo=True, input_names=graph.input_names,
                                    output_names=graph.output_names, dynamic_shapes=free,
                                    verbose=False)  # fmt: skip
    finally:
        quiet.setLevel(level)
    program.model.metadata_props[METADATA] = about
    return ir.to_proto(program.model).SerializeToString()


def torchscript_bytes(graph: PolicyGraph, inputs: tuple[torch.Tensor, ...], about: str) -> bytes:
    """The graph traced to TorchScript, holding ``about`` as the extra file ``rlherd.json``."""
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.trace(graph, inputs), buffer, _extra_files={f"{METADATA}.json": about})
    return buffer.getvalue()


def run_file(data: bytes, fmt: str, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    """The outputs of the exported file ``data`` for ``inputs``, run as its users run it."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
        names = [i.name for i in session.get_inputs()]
        return session.run(None, {n: x.numpy() for n, x in zip(names, inputs, strict=True)})
    with torch.no_grad():
        return [y.numpy() for y in torch.jit.load(io.BytesIO(data))(*inputs)]


def check_file(graph: PolicyGraph, data: bytes, fmt: str) -> None:
    """The file acts as the policy does, on a batch of another size than the one traced (a
    network that reads the batch with ``len()`` would have fixed it)."""
    inputs = example_inputs(graph, CHECK_BATCH, seed=1, noise=graph.stochastic)
    with torch.no_grad():
        expected = [y.numpy() for y in graph(*inputs)]
    got = run_file(data, fmt, inputs)
    for name, want, have in zip(graph.output_names, expected, got, strict=True):
        same = np.array_equal(want, have) if name == "action" and not graph.continuous else (
            want.shape == have.shape and np.allclose(want, have, rtol=1e-4, atol=1e-5))
        if not same:
            raise RuntimeError(f"the exported {fmt} file's {name} differs from the policy's: "
                               f"{have} against {want}")  # fmt: skip


def file_format(fmt: str | None, output: str | Path | None) -> str:
    """The format asked for, else the one ``output``'s suffix names, else ONNX. A format and a
    suffix that disagree are refused: a ``policy.pt`` holding ONNX would fail only when it is
    loaded, far from here."""
    named = SUFFIXES.get(Path(output).suffix.lower()) if output is not None else None
    if fmt is None:
        return named or "onnx"
    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}; choose {' or '.join(FORMATS)}")
    if named not in (None, fmt):
        raise ConfigError(f"-o {output}'s suffix is {named}'s, and --format is {fmt}: drop "
                          f"--format, or write to a {FORMATS[fmt]} file")  # fmt: skip
    return fmt


def export(
    run_dir: str | Path,
    fmt: str | None = None,
    stochastic: bool = False,
    output: str | Path | None = None,
    best: bool = False,
) -> Path:
    """Write the latest policy of the run in ``run_dir`` (``best``: its best evaluation's, kept
    by ``--save-best``) as an ONNX or TorchScript file
    (``fmt``, or as ``output``'s suffix says: :func:`file_format`; see the module docstring) to
    ``output`` (a file, or a folder to write it in; default: ``policy.onnx`` or ``policy.pt``
    in the run directory, ``policy-best.*`` with ``best``, ``policy-stochastic.*`` with
    ``stochastic``; a package's must be given); its path."""
    fmt = file_format(fmt, output)
    if fmt == "onnx":
        require_onnx()
    trained = run_policy(run_dir, best=best)
    spec, record = trained.spec, trained.record
    if len(set(spec.policies)) > 1:
        raise ConfigError(f"{run_dir} trains {len(set(spec.policies))} policies "
                          f"({', '.join(sorted(set(spec.policies)))}); rlherd export writes "
                          "one: train with one policy (--policies shared)")  # fmt: skip
    graph = PolicyGraph(trained.make_actor().policy, spec, record.agent, stochastic).eval()
    about = json.dumps(graph.describe(record))
    inputs = example_inputs(graph, TRACE_BATCH, noise=stochastic)
    with warnings.catch_warnings():
        # torch warns about its tracers' internals and TorchScript's deprecation, which a user
        # cannot act on; check_file() tests what the tracers made.
        warnings.simplefilter("ignore")
        data = (onnx_bytes if fmt == "onnx" else torchscript_bytes)(graph, inputs, about)
        check_file(graph, data, fmt)
    name = f"policy{'-best' if best else ''}{'-stochastic' if stochastic else ''}{FORMATS[fmt]}"
    if output is None and is_package(run_dir):  # a package is read, never written
        raise ConfigError(f"{run_dir} is a package, which rlherd export does not write into; "
                          f"say where the file goes: -o {name}")  # fmt: skip
    path = Path(output) if output is not None else Path(run_dir)
    if names_folder(path if output is None else output):  # a folder, as `cp` takes one
        if output is not None and is_package(path):
            raise ConfigError(f"-o {output} is a package, which rlherd export does not write "
                              "into; give a file or another folder")  # fmt: skip
        path = path / name
    atomic_write_bytes(make_folder(path.parent, "-o") / path.name, data)
    return path
