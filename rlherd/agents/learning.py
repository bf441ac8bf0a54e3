"""What learners share: optimisers that take few kernel calls per update, a compiled update,
and target copies.

On a CPU, a small network's update (a CartPole MLP, MinAtar's one-conv network) is a hundred or
so small tensor operations, and PyTorch's per-operation overhead, not arithmetic, sets its
speed. So these helpers do each part of an update in as few calls as PyTorch allows:

- :func:`flatten_parameters` makes a network's parameters views of one tensor (and their
  gradients views of its gradient), so zeroing, clipping and the optimiser make one call each
  where they made one per parameter, and their passes over memory are one;
- :func:`adam` uses Adam's fused kernel (CPU and CUDA): one pass over each parameter where the
  plain implementation makes seven; RMSprop has no fused kernel in PyTorch, and
  :class:`CenteredRMSprop` is its arithmetic over the one flat tensor;
- :class:`CompiledStep` goes further: the whole update (loss, gradient, clip, optimiser) traced
  once and compiled by TorchInductor, so only the matrix products and convolutions remain
  library calls and everything between them is a few generated loops;
- :func:`copy_parameters` copies a network into its target with one foreach call.

Learners also return their metrics as 0-d tensors, which the recorder reads once per log
interval (:func:`rlherd.run.recorder.mean_metrics`), so a step never waits on a device to report.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from rlherd.core import copy_tensors
from rlherd.errors import ConfigError, Notice, TrainingDiverged
from rlherd.run.divergence import DivergenceWatch, parameter_norm


class NetworkLearner:
    """What every agent's learner shares (a :class:`~rlherd.core.Learner`): ``step()`` hands the
    dataset's next batch to the subclass's ``learn``, and as a variable source it serves ``net``
    whole under every name, versioned by ``num_steps`` (actors fetch only after an update).

    Its checkpoint (``state_dict``) holds, under each key of :meth:`checkpoint_parts`, the state
    of that part: by default ``num_steps`` and each attribute named in ``checkpointed``, under
    its name (``net``, the policy, is :data:`~rlherd.core.POLICY_KEY`). A part's state is its
    ``state_dict()`` where it has one (networks, optimisers, a :class:`SupportPlacer`), a
    detached copy of a tensor (a Lagrange multiplier), its values' states for a dict (MPO's
    dual variables), and a plain value (a counter, PPO's ``beta``) itself. ``load_state_dict``
    puts the parts back in the order they are named (learners name networks before their
    optimisers), each in place, since optimisers hold the very parameters and tensors they
    update: through ``load_state_dict``, by copying into a tensor, value by value into a dict.
    A plain value, which nothing else holds, is set as the attribute its key names. A learner
    with several optimisers that step together (SAC's, CQL's) keeps them in ``optimizers``, a
    dict, and each is checkpointed under ``optimizer/<name>``; other parts that are not
    attributes of their own are added by overriding ``checkpoint_parts``, and must load in
    place.
    The keys are what runs' checkpoints hold, so renaming one stops runs from resuming
    (``tests/test_contracts.py`` records them).

    Every runtime drives a learner through ``step()``, so that is where a learner that blew up
    while its numbers stay finite is caught (:class:`~rlherd.run.divergence.DivergenceWatch`,
    against the parameters as the first step found them: the start, or the checkpoint a run
    resumed from)."""

    net: torch.nn.Module
    dataset: Iterator[Any]
    table: Any  # a replay table, where priorities are written (``write_priorities``)
    num_steps: int
    checkpointed: tuple[str, ...] = ()
    # A learner with several optimisers that step together (SAC's, CQL's) keeps them here.
    optimizers: dict[str, torch.optim.Optimizer] = {}  # assigned, never mutated
    divergence: DivergenceWatch | None = None  # made at the first step

    def checkpoint_parts(self) -> dict[str, Any]:
        """What the checkpoint holds, by key: ``num_steps``, the attributes ``checkpointed``
        names, and each of ``optimizers`` under ``optimizer/<name>``."""
        return dict(num_steps=self.num_steps,
                    **{name: getattr(self, name) for name in self.checkpointed},
                    **{f"optimizer/{k}": o for k, o in self.optimizers.items()})  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        return {key: _part_state(part) for key, part in self.checkpoint_parts().items()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, part in self.checkpoint_parts().items():
            if _in_place(part):
                _load_part(part, state[key])
            else:  # a plain value: nothing holds it but the attribute
                setattr(self, key, state[key])

    def step(self) -> dict[str, Any]:
        if self.divergence is None:
            self.divergence = DivergenceWatch(parameter_norm(self.net.parameters()))
        metrics = self.learn(next(self.dataset))
        if self.divergence.due():
            norm = parameter_norm(self.net.parameters())
            self.divergence.observe(self.num_steps, norm, metrics)
        return metrics

    def check_divergence(self) -> None:
        """Read the parameters' norm now (before a checkpoint, which must not hold a learner
        that blew up since the last reading)."""
        if self.divergence is not None:
            norm = parameter_norm(self.net.parameters())
            self.divergence.check_norm(self.num_steps, norm)

    def policy_state(self) -> dict[str, Any]:
        return self.net.state_dict()

    def get_variables(self, names: list[str]) -> list[dict[str, Any]]:
        return [self.policy_state() for _ in names]

    def write_priorities(self, keys: np.ndarray, priorities: torch.Tensor) -> None:
        """Give the sampled items (``keys``) new priorities in ``self.table``; non-finite ones
        mean the learner diverged, which stops the run before the table takes them."""
        values = priorities.detach().cpu().numpy().astype(np.float64)
        if not np.isfinite(values).all():
            raise TrainingDiverged(
                f"learner step {self.num_steps}: TD errors are not finite; {TrainingDiverged.HINT}"
            )
        self.table.update_priorities(keys, values)

    def variables_version(self) -> int:
        return self.num_steps


def _part_state(part: Any) -> Any:
    """A checkpointed part's state (:class:`NetworkLearner`): its ``state_dict()``, a tensor's
    detached copy, a dict's values' states, or a plain value itself."""
    if hasattr(part, "state_dict"):
        return part.state_dict()
    if isinstance(part, torch.Tensor):
        return part.detach().clone()
    if isinstance(part, dict):
        return {k: _part_state(v) for k, v in part.items()}
    return part


def _in_place(part: Any) -> bool:
    """Whether :func:`_load_part` can load ``part`` in place; a plain value must be replaced."""
    return hasattr(part, "load_state_dict") or isinstance(part, torch.Tensor | dict)


def _load_part(part: Any, state: Any) -> None:
    """Put ``state`` back into ``part`` in place, so that optimisers and whatever else holds
    the same modules and tensors see it: ``load_state_dict``, a copy into a tensor (not
    recorded for autograd), or each of a dict's values."""
    if hasattr(part, "load_state_dict"):
        part.load_state_dict(state)
    elif isinstance(part, torch.Tensor):
        with torch.no_grad():
            part.copy_(state)
    else:
        for k, v in part.items():
            if _in_place(v):
                _load_part(v, state[k])
            else:
                part[k] = state[k]


def _fusable(params: list[torch.Tensor]) -> bool:
    return all(p.device.type in ("cpu", "cuda") for p in params)


def adam(params: Iterable[torch.Tensor], lr: float, eps: float = 1e-8) -> torch.optim.Adam:
    """Adam (Kingma & Ba 2015) with PyTorch's fused kernel where the parameters' device has
    one. Its numbers match the plain implementation up to float rounding."""
    params = list(params)
    return torch.optim.Adam(params, lr=lr, eps=eps, fused=_fusable(params) or None)


def rmsprop(
    params: Iterable[torch.Tensor],
    lr: float,
    alpha: float,
    eps: float,
    momentum: float = 0.0,
    centered: bool = False,
) -> torch.optim.RMSprop:
    """RMSprop (Tieleman & Hinton 2012) with the foreach implementation."""
    return torch.optim.RMSprop(
        params, lr=lr, alpha=alpha, eps=eps, momentum=momentum, centered=centered, foreach=True
    )


def flatten_parameters(net: torch.nn.Module) -> torch.nn.Parameter:
    """Make every parameter of ``net`` a view of one new parameter, and its gradient a view of
    that parameter's gradient, which starts at zeros; return that parameter, the only one the
    optimiser and the gradient clip need to see.

    Why: an optimiser's update is a few passes over each parameter, and on a CPU the passes over
    a small network's handful of tensors cost more in per-call overhead and in re-reading memory
    than in arithmetic; over one tensor each pass is one call. Autograd accumulates into a
    gradient that exists in place, so ``backward`` fills the flat gradient: zero it with
    ``flat.grad.zero_()``, never set the gradients to ``None`` (``optimizer.zero_grad()``),
    which would cut the views loose. Call it after moving ``net`` to its device (``.to``
    replaces parameters) and after copying it (a deep copy shares the flat layout). The numbers
    do not change: every update is elementwise."""
    params = list(net.parameters())
    if len({(p.dtype, p.device) for p in params}) != 1:
        raise ValueError("flatten_parameters needs parameters of one dtype on one device")
    flat = torch.nn.Parameter(torch.cat([p.detach().reshape(-1) for p in params]))
    flat.grad = torch.zeros_like(flat)
    offset = 0
    for p in params:
        p.data = flat.data[offset : offset + p.numel()].view_as(p)
        p.grad = flat.grad[offset : offset + p.numel()].view_as(p)
        offset += p.numel()
    return flat


def centered_rmsprop_(
    param: torch.Tensor,
    grad: torch.Tensor,
    square_avg: torch.Tensor,
    grad_avg: torch.Tensor,
    lr: float,
    alpha: float,
    eps: float,
) -> None:
    """One centered RMSprop update in place, in ``torch.optim.RMSprop(centered=True)``'s
    operations and order (so its numbers, bit for bit, when not compiled)."""
    square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
    grad_avg.lerp_(grad, 1 - alpha)
    denominator = square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_().add_(eps)
    param.addcdiv_(grad, denominator, value=-lr)


class CenteredRMSprop(torch.optim.Optimizer):
    """Centered RMSprop (Graves 2013), the MinAtar paper's optimiser, without momentum or
    weight decay: ``torch.optim.RMSprop(centered=True)``'s arithmetic, bit for bit, in one
    function (:func:`centered_rmsprop_`) that :class:`CompiledStep` traces too."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, alpha: float, eps: float):
        super().__init__(params, dict(lr=lr, alpha=alpha, eps=eps))

    def init_state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if not state:
            state["square_avg"] = torch.zeros_like(p)
            state["grad_avg"] = torch.zeros_like(p)
        return state

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.init_state(p)
                centered_rmsprop_(p, p.grad, state["square_avg"], state["grad_avg"], group["lr"],
                                  group["alpha"], group["eps"])  # fmt: skip


def clip_grad_norm(params: Iterable[torch.Tensor], max_norm: float | None) -> torch.Tensor:
    """Scale the gradients of ``params`` down to global norm ``max_norm`` (``None``: leave them)
    and return their norm before clipping, as a 0-d tensor.

    The arithmetic of ``torch.nn.utils.clip_grad_norm_(foreach=True)``, so the same numbers, in
    its four kernel calls without its wrapping (grouping by device and dtype, checks, a no-grad
    context): that wrapping took 8% of a CartPole DQN update. A learner's parameters share one
    device and dtype, so there is nothing to group."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    if max_norm is not None:
        torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def adam_(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """One Adam update in place, in ``torch.optim.Adam``'s arithmetic (its fused kernel's up to
    float rounding); ``step``, a 0-d tensor, counts the updates and is incremented here. For
    :class:`CompiledStep`, which traces it: eager learners call the fused kernel."""
    step.add_(1)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2_sqrt = (1 - beta2**step).sqrt()
    denominator = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.sub_(exp_avg / denominator * (lr / bias_correction1))


class _Loss(torch.nn.Module):
    """The modules a loss function calls, under one module whose ``forward`` is that loss:
    ``torch.func.functional_call`` then swaps all their parameters and buffers at once."""

    def __init__(self, loss_fn: Callable[..., Any], modules: Sequence[torch.nn.Module]):
        super().__init__()
        self.loss_fn = loss_fn
        self.parts = torch.nn.ModuleList(modules)

    def forward(self, *args: Any) -> Any:
        return self.loss_fn(*args)


class CompiledStep:
    """A learner's whole update, compiled: ``step(*args) -> (loss, aux, grad_norm)`` computes
    ``loss, aux = loss_fn(*args)``, its gradient with respect to ``flat`` (the parameters of
    ``modules[0]``, flattened by :func:`flatten_parameters`), clips it to global norm
    ``max_norm`` and applies ``optimizer``'s update (Adam or :class:`CenteredRMSprop`, whose
    state it reads and writes, so checkpoints are the eager learner's). ``loss_fn`` calls
    ``modules`` as the eager learner does; the other modules (targets) are read, not trained.
    ``args`` is a pytree of tensors (dicts, tuples, None), a batch.

    Why: on a CPU, a small network's eager update is about a hundred operator calls, and
    PyTorch's per-call overhead costs more than their arithmetic. Here the update is traced
    once (``make_fx``, through ``torch.func.grad_and_value``) into one graph of ATen operations
    and compiled by TorchInductor: everything but the matrix products and convolutions fuses
    into a few generated loops. Updates per second on one core of a 2-core AMD EPYC
    (``benchmarks/learner_step.py``): 1.35x the eager step for RL Zoo's CartPole network, 1.6x
    for MinAtar's, 1.9x for a dueling CartPole network with prioritised replay. It is not
    ``torch.compile``: Dynamo re-checks its guards on every call (on the module, config and
    closures: 100-200 us, a tenth of a MinAtar update), and a traced graph needs none, since a
    learner's update is the same code on batches of one shape. A batch of another structure or
    shape (demonstrations in it, another size) is traced and compiled once more; each takes
    about 5 s, and needs a C++ compiler on a CPU. (Measured and tested on CPUs only: no GPU
    has run it.)

    The numbers are the eager update's up to float rounding (the generated loops sum in
    another order), and the clip is the same per-parameter arithmetic as :func:`clip_grad_norm`.
    What the graph reads is all passed in: parameters, buffers, optimiser state, the batch;
    nothing is baked in but the hyperparameters and the code's structure."""

    def __init__(
        self,
        loss_fn: Callable[..., tuple[torch.Tensor, Any]],
        modules: Sequence[torch.nn.Module],
        flat: torch.nn.Parameter,
        optimizer: torch.optim.Optimizer,
        max_norm: float | None,
    ):
        self.loss = _Loss(loss_fn, modules)
        self.flat, self.optimizer, self.max_norm = flat, optimizer, max_norm
        trained = {id(p) for p in modules[0].parameters()}
        named = dict(self.loss.named_parameters())
        self.trained = [n for n, p in named.items() if id(p) in trained]
        self.shapes = [named[n].shape for n in self.trained]
        self.sizes = [s.numel() for s in self.shapes]
        if sum(self.sizes) != flat.numel():
            raise ValueError("flat must hold modules[0]'s parameters (flatten_parameters)")
        self.read = [n for n, p in named.items() if id(p) not in trained]
        self.read += [n for n, _ in self.loss.named_buffers()]
        tensors = {**named, **dict(self.loss.named_buffers())}
        self.read_tensors = [tensors[n] for n in self.read]  # updated in place, so kept
        group = optimizer.param_groups[0]
        if isinstance(optimizer, torch.optim.Adam):
            if group["amsgrad"] or group["weight_decay"] or group["maximize"]:
                raise ValueError("CompiledStep's Adam has no amsgrad, weight decay or maximize")
            self.rule, self.hyper = adam_, (group["lr"], *group["betas"], group["eps"])
        elif isinstance(optimizer, CenteredRMSprop):
            self.rule, self.hyper = centered_rmsprop_, (group["lr"], group["alpha"], group["eps"])
        else:
            raise ValueError(f"CompiledStep updates with Adam or CenteredRMSprop, not {optimizer}")
        self.compiled: dict[Any, Callable[..., Any]] = {}

    def state(self) -> list[torch.Tensor]:
        """The optimiser's state tensors, looked up each call: ``load_state_dict`` replaces them."""
        if isinstance(self.optimizer, CenteredRMSprop):
            state = self.optimizer.init_state(self.flat)
            return [state["square_avg"], state["grad_avg"]]
        state = self.optimizer.state[self.flat]
        if not state:  # as torch.optim.Adam(fused=True) starts it
            state["step"] = torch.zeros((), dtype=torch.float32, device=self.flat.device)
            state["exp_avg"] = torch.zeros_like(self.flat)
            state["exp_avg_sq"] = torch.zeros_like(self.flat)
        return [state["exp_avg"], state["exp_avg_sq"], state["step"]]

    def update(self, flat: torch.Tensor, state: list[torch.Tensor], read: list[torch.Tensor],
               args: Any) -> tuple[torch.Tensor, Any, torch.Tensor]:  # fmt: skip
        """The update, as traced: gradient, clip and optimiser, in place on ``flat`` and
        ``state``."""

        def loss_of(flat: torch.Tensor) -> tuple[torch.Tensor, Any]:
            pieces = [x.view(s) for x, s in zip(flat.split(self.sizes), self.shapes, strict=True)]
            tensors = {**dict(zip(self.trained, pieces, strict=True)),
                       **dict(zip(self.read, read, strict=True))}  # fmt: skip
            return torch.func.functional_call(self.loss, tensors, args)

        grad, (loss, aux) = torch.func.grad_and_value(loss_of, has_aux=True)(flat)
        norms = [torch.linalg.vector_norm(g) for g in grad.split(self.sizes)]
        norm = torch.linalg.vector_norm(torch.stack(norms))
        if self.max_norm is not None:
            grad = grad * torch.clamp(self.max_norm / (norm + 1e-6), max=1.0)
        self.rule(flat, grad, *state, *self.hyper)
        return loss, aux, norm

    def __call__(self, *args: Any) -> tuple[torch.Tensor, Any, torch.Tensor]:
        leaves, spec = tree_flatten(args)
        key = (spec, tuple((x.shape, x.dtype, x.device) if isinstance(x, torch.Tensor) else x
                           for x in leaves))  # fmt: skip
        if key not in self.compiled:
            self.compiled[key] = self._compile(leaves, spec)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        return self.compiled[key](self.flat.detach(), *self.state(), *self.read_tensors, *tensors)

    def _compile(self, leaves: list[Any], spec: Any) -> Callable[..., Any]:
        """Trace the update for batches shaped like ``leaves`` and compile it; non-tensor leaves
        (None, numbers) are constants of the graph, and part of its key. The graph takes and
        returns flat lists of tensors; the returned function restores the output's structure."""
        n_state, n_read = len(self.state()), len(self.read_tensors)
        positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]
        structure: list[Any] = []  # the output's, found while tracing

        def update(flat: torch.Tensor, *inputs: torch.Tensor) -> list[torch.Tensor]:
            state, read = list(inputs[:n_state]), list(inputs[n_state : n_state + n_read])
            batch = list(leaves)
            for i, x in zip(positions, inputs[n_state + n_read :], strict=True):
                batch[i] = x
            out = self.update(flat, state, read, tree_unflatten(batch, spec))
            flat_out, out_spec = tree_flatten(out)
            structure[:] = [out_spec]
            return flat_out

        from torch._inductor import compile as inductor_compile  # TorchInductor on an FX graph
        from torch._inductor.exc import InvalidCxxCompiler
        from torch.fx.experimental.proxy_tensor import make_fx

        def example() -> list[torch.Tensor]:  # tracing runs the update: on copies
            inputs = [self.flat.detach(), *self.state(), *self.read_tensors]
            return [x.detach().clone() for x in inputs + [leaves[i] for i in positions]]

        graph = make_fx(update)(*example())
        try:
            with torch._inductor.config.patch(compile_threads=1):  # no pool of compile processes
                compiled = inductor_compile(graph, example())
        except InvalidCxxCompiler as e:
            raise ConfigError(
                "compiling the learner step (compile_step=true) needs a C++ compiler on a CPU "
                f"(TorchInductor found none: {e}); install g++ or leave compile_step off"
            ) from None
        return lambda *inputs: tree_unflatten(list(compiled(*inputs)), structure[0])


def copy_parameters(target: torch.nn.Module, source: torch.nn.Module) -> None:
    """``target.load_state_dict(source.state_dict())`` for two networks of one architecture, as
    one foreach copy of their parameters and buffers."""
    copy_tensors([*target.parameters(), *target.buffers()],
                 [*source.parameters(), *source.buffers()])  # fmt: skip


def polyak_average(targets: Iterable[torch.Tensor], sources: Iterable[torch.Tensor],
                   tau: float) -> None:
    """Move each target tensor ``tau`` of the way toward its source (Polyak averaging, SAC's and
    TD3's target networks), as one foreach call."""
    with torch.no_grad():
        torch._foreach_lerp_(list(targets), list(sources), tau)


class SupportPlacer:
    """Places a categorical critic's atoms (D4PG, DMPO) and watches whether they fit the task.

    With ``config.vmin`` / ``vmax`` unset, the support is derived at the first batch from the
    per-step rewards its n-step returns imply (``r_min <= r <= r_max``): it spans the discounted
    returns those rewards allow, ``[min(r_min, 0), max(r_max, 0)] / (1 - discount)``, widened by
    ``margin`` of that span on each side for rewards larger than the first batch saw (and unit
    rewards' span if they are all zero, as on a sparse task early on). Every ``check_period``
    learner steps the target mass that overflowed the support is looked at (one device sync),
    and a warning names the fix the first time it exceeds ``warn_above``. ``config`` has
    ``distributional``, ``vmin``, ``discount`` and ``n_step``; ``critics`` are the online and
    target critics, placed alike."""

    def __init__(self, config: Any, critics: Sequence[Any], check_period: int = 1000,
                 warn_above: float = 0.05, margin: float = 0.1):  # fmt: skip
        self.config, self.critics = config, critics
        self.check_period, self.warn_above, self.margin = check_period, warn_above, margin
        self.placed = config.vmin is not None or not config.distributional
        self.warned = False

    def place(self, reward: torch.Tensor) -> None:
        if self.placed:
            return
        c = self.config
        steps = sum(c.discount**k for k in range(c.n_step))
        low = min(float(reward.min()) / steps, 0.0) / (1.0 - c.discount)
        high = max(float(reward.max()) / steps, 0.0) / (1.0 - c.discount)
        if low == high:
            low, high = -1.0 / (1.0 - c.discount), 1.0 / (1.0 - c.discount)
        pad = self.margin * (high - low)
        for critic in self.critics:
            critic.set_support(low - pad, high + pad)
        self.placed = True

    def check(self, overflow: torch.Tensor, step: int) -> None:
        if not self.config.distributional or self.warned or step % self.check_period:
            return
        share = float(overflow)
        if share > self.warn_above:
            atoms = self.critics[0].atoms
            warnings.warn(
                f"{share:.0%} of the critic's target mass falls outside its support "
                f"[{float(atoms[0]):g}, {float(atoms[-1]):g}] at learner step {step}: the "
                "task's returns exceed it. Widen it with --set vmin=... vmax=... "
                "(metrics: support_overflow)",
                Notice,
                stacklevel=3,
            )
            self.warned = True

    def state_dict(self) -> dict[str, bool]:
        return dict(placed=self.placed, warned=self.warned)

    def load_state_dict(self, state: dict[str, bool]) -> None:
        self.placed, self.warned = state["placed"], state["warned"]
