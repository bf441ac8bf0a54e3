"""TD errors against naive per-example reference code."""

import math

import pytest
import torch

from rlherd.losses.td import (
    double_q_learning_td,
    huber,
    q_learning_td,
    signed_hyperbolic,
    signed_parabolic,
    transformed_double_q_td,
)


def batch(seed=0, B=6, A=4):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, A, generator=g, requires_grad=True),
        torch.randint(A, (B,), generator=g),
        torch.randn(B, generator=g),
        torch.tensor([0.99, 0.0, 0.5, 0.99**3, 1.0, 0.9]),
        torch.randn(B, A, generator=g),
        torch.randn(B, A, generator=g),
    )


def test_q_learning_and_double_q_match_reference():
    q_tm1, a, r, d, q_value, q_select = batch()
    td = q_learning_td(q_tm1, a, r, d, q_value)
    dtd = double_q_learning_td(q_tm1, a, r, d, q_value, q_select)
    for i in range(len(r)):
        q_sa = q_tm1[i, a[i]].item()
        assert td[i].item() == pytest.approx(
            r[i].item() + d[i].item() * max(q_value[i].tolist()) - q_sa
        )
        best = max(range(4), key=lambda j, i=i: q_select[i, j].item())
        target = r[i].item() + d[i].item() * q_value[i, best].item()
        assert dtd[i].item() == pytest.approx(target - q_sa)
    dtd.sum().backward()  # gradients flow into q_tm1 only, through the taken actions
    assert (q_tm1.grad != 0).sum() == len(r)


def test_huber():
    x = torch.tensor([-3.0, -0.5, 0.0, 0.4, 2.0])
    expected = [0.5 * v * v if abs(v) <= 1 else abs(v) - 0.5 for v in x.tolist()]
    torch.testing.assert_close(huber(x), torch.tensor(expected))
    assert huber(torch.tensor(5.0), delta=2.0).item() == pytest.approx(2 * (5 - 1))


def test_value_rescaling_round_trip_and_transformed_target():
    x = torch.linspace(-500, 500, 101, dtype=torch.float64)
    torch.testing.assert_close(signed_parabolic(signed_hyperbolic(x)), x)
    h = lambda v: math.copysign(math.sqrt(abs(v) + 1) - 1, v) + 1e-3 * v  # noqa: E731
    assert signed_hyperbolic(torch.tensor(8.0)).item() == pytest.approx(h(8.0))
    q_tm1, a, r, d, q_value, q_select = batch(1)
    td = transformed_double_q_td(q_tm1, a, r, d, q_value, q_select)
    for i in range(len(r)):
        best = int(q_select[i].argmax())
        inner = r[i] + d[i] * signed_parabolic(q_value[i, best])
        assert td[i].item() == pytest.approx(h(inner.item()) - q_tm1[i, a[i]].item(), rel=1e-5)


def test_the_targets_carry_no_gradient():
    """A target is a fixed regression point: the loss must not move the target network's
    estimates toward the online ones (the learners build targets under no_grad, so only this
    test sees a target that is not detached)."""
    g = torch.Generator().manual_seed(0)
    q_tm1 = torch.randn(4, 3, generator=g, requires_grad=True)
    q_t = torch.randn(4, 3, generator=g, requires_grad=True)
    selector = torch.randn(4, 3, generator=g)
    a, r, d = torch.tensor([0, 1, 2, 0]), torch.ones(4), torch.full((4,), 0.9)
    for td in (q_learning_td(q_tm1, a, r, d, q_t),
               double_q_learning_td(q_tm1, a, r, d, q_t, selector),
               transformed_double_q_td(q_tm1, a, r, d, q_t, selector)):  # fmt: skip
        q_t.grad = None
        td.sum().backward()
        assert q_t.grad is None and q_tm1.grad is not None
