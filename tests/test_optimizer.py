"""tune_as.training.tools.FusedAdamW, the trials' optimizer, against torch.optim.AdamW(fused=True)."""

from __future__ import annotations

from typing import Any

import pytest
import torch


def _twin_models(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(seed)
    a = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    b = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.LayerNorm(5), torch.nn.Linear(5, 3))
    b.load_state_dict(a.state_dict())
    return a, b


def _groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    return [{"params": [p for p in model.parameters() if p.ndim >= 2], "weight_decay": 0.05},
            {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]


@pytest.mark.parametrize("scaled", [False, True], ids=["plain", "grad-scaler"])
def test_the_trials_adamw_is_torchs_fused_adamw_bit_for_bit(scaled: bool) -> None:
    """FusedAdamW (torch's functional fused kernel, without torch.optim's import of torch._dynamo) against
    torch.optim.AdamW(fused=True): the same weights after every step, with the learning rate changed between
    steps, a parameter without a gradient in some steps (the last layer frozen for two), and under GradScaler
    a step with an infinite gradient skipped by both; their states load into each other."""
    from tune_as.training.tools import FusedAdamW

    mine, ref = _twin_models()
    ours, theirs = FusedAdamW(_groups(mine), lr=0.01), torch.optim.AdamW(_groups(ref), lr=0.01, fused=True)
    scalers = [torch.amp.GradScaler("cpu", init_scale=8.0) for _ in range(2)] if scaled else [None, None]
    gen = torch.Generator().manual_seed(1)
    for step in range(8):
        x = torch.randn(4, 6, generator=gen)
        for model, opt, scaler in ((mine, ours, scalers[0]), (ref, theirs, scalers[1])):
            for group in opt.param_groups:
                group["lr"] = 0.01 * (step + 1) / 8
            loss = model(x).square().mean() * (float("inf") if step == 5 and scaled else 1.0)
            if step in (2, 3):  # the last layer gets no gradient: it must not move (nor its moments)
                model[2].requires_grad_(False)
            (scaler.scale(loss) if scaler else loss).backward()
            model[2].requires_grad_(True)
            if scaler:
                scaler.unscale_(opt)
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            opt.zero_grad(set_to_none=True)
        for a, b in zip(mine.parameters(), ref.parameters(), strict=True):
            assert torch.equal(a, b), f"step {step}: {a} != {b}"
    assert scaled or not torch.equal(mine[0].weight, _twin_models()[0][0].weight), "the steps moved nothing"
    # checkpoints: torch's state into ours and ours into torch's, then one more step each, still equal
    again, other = _twin_models()
    again.load_state_dict(mine.state_dict())
    other.load_state_dict(ref.state_dict())
    ours2, theirs2 = FusedAdamW(_groups(again), lr=0.01), \
        torch.optim.AdamW(_groups(other), lr=0.01, fused=True)
    ours2.load_state_dict(theirs.state_dict())
    theirs2.load_state_dict(ours.state_dict())
    assert all(g["fused"] is True for g in theirs2.param_groups), "ours loaded into torch's left it unfused"
    x = torch.randn(4, 6, generator=gen)
    for model, opt in ((again, ours2), (other, theirs2)):
        model(x).square().mean().backward()
        opt.step()
    for a, b in zip(again.parameters(), other.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="expected the parameter groups of this model"):
        FusedAdamW([{"params": list(again.parameters()), "weight_decay": 0.0}], lr=0.1).load_state_dict(
            theirs.state_dict())
