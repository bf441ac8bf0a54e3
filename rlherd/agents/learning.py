"""What learners share: optimisers that take few kernel calls per update, and target copies.

On a CPU, a small network's update (a CartPole MLP, MinAtar's one-conv network) is a hundred or
so small tensor operations, and PyTorch's per-operation overhead, not arithmetic, sets its
speed. So these helpers do each part of an update in as few calls as PyTorch allows:

- :func:`adam` uses Adam's fused kernel (CPU and CUDA): one pass over each parameter where the
  plain implementation makes seven;
- RMSprop has no fused kernel in PyTorch; :func:`compile_step` has ``torch.compile`` write one
  (one generated loop per parameter: about 6x faster than eager on the MinAtar network, for a
  compile of a few seconds at start-up, which needs a C++ compiler on a CPU);
- :func:`copy_parameters` copies a network into its target with one foreach call.

Learners also return their metrics as 0-d tensors, which the recorder reads once per log
interval (:func:`rlherd.run.recorder.mean_metrics`), so a step never waits on a device to report.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


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


def compile_step(optimizer: torch.optim.Optimizer) -> None:
    """Replace ``optimizer.step`` by a ``torch.compile``-d one, which gives the same numbers up
    to float rounding (tests/test_dqn.py). It specialises on the learning rate, so it is for
    constant rates; an Adam step is a fused kernel already and gains nothing."""
    optimizer.step = torch.compile(optimizer.step)  # type: ignore[method-assign]


def copy_parameters(target: torch.nn.Module, source: torch.nn.Module) -> None:
    """``target.load_state_dict(source.state_dict())`` for two networks of one architecture, as
    one foreach copy of their parameters and buffers."""
    dst = [*target.parameters(), *target.buffers()]
    src = [*source.parameters(), *source.buffers()]
    with torch.no_grad():
        torch._foreach_copy_(dst, src)
