"""training/cpu_math.py: negligible weights (< 1e-20) and optimizer state (< 1e-30) are zeroed, nothing else."""

from __future__ import annotations

import torch

from gnnscale.training.cpu_math import flush_subnormals


def test_flush_zeroes_only_negligible_weights_and_optimizer_state():
    w = torch.nn.Parameter(torch.tensor([1e-39, -1e-40, 1.2e-38, -3.0, 0.0, 1e-30, 1e-19, 2e-3]))
    opt = torch.optim.Adam([w], lr=0.1)
    w.grad = torch.tensor([1e-20, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1e-3])
    opt.step()
    state = opt.state[w]
    state["exp_avg"][1] = 5e-41  # a moment decayed below normal
    kept_w, kept_m = w.detach().clone(), state["exp_avg"].clone()
    flush_subnormals([w], opt)
    for before, after, below in ((kept_w, w.detach(), 1e-20), (kept_m, state["exp_avg"], 1e-30)):
        sub = (before.abs() < below) & (before != 0)
        assert sub.any()
        assert (after[sub] == 0).all()
        assert torch.equal(after[~sub], before[~sub])
    assert int(state["step"]) == 1  # the step counter (a 0-d tensor) is left alone
