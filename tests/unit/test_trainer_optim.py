"""optim.clipped_step against its oracle, torch's clip_grad_norm_ then AdamW.step, on the fused AdamW
(CPU here, CUDA where there is one) and the foreach one; and a non-finite gradient, which the
fused update skips."""

import copy

import pytest
import torch
from flashfleet_trainer.optim import adamw, clipped_step

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _params(device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(device)) for s in ((64, 48), (48,), (7, 3, 5))]


def _grads(params, scale, seed):
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = (torch.randn(p.shape, generator=g) * scale).to(p.device)


def _oracle_step(params, opt, max_norm):
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    opt.step()
    return norm


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(("max_norm", "grad_scale"), [(1.0, 3.0), (1.0, 0.01), (float("inf"), 3.0)])
def test_clipped_step_is_clip_then_step(device, fused, max_norm, grad_scale):
    ours, ref = _params(device), _params(device)
    o_ours = adamw(ours, 1e-2, 0.01, device, fused=fused)
    o_ref = adamw(ref, 1e-2, 0.01, device, fused=fused)
    assert bool(o_ours.param_groups[0]["fused"]) == fused
    norms = []
    for step in range(4):
        _grads(ours, grad_scale, step)
        _grads(ref, grad_scale, step)
        n_ours, n_ref = clipped_step(o_ours, max_norm), _oracle_step(ref, o_ref, max_norm)
        torch.testing.assert_close(n_ours, n_ref)
        norms.append(float(n_ref))
        for p, q in zip(ours, ref, strict=True):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
            for k in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(o_ours.state[p][k], o_ref.state[q][k], rtol=1e-4, atol=1e-9)
    # the case is the one named: clipping active (every norm above max_norm) or not
    assert all(n > max_norm for n in norms) == (grad_scale == 3.0 and max_norm == 1.0)
    assert not hasattr(o_ours, "grad_scale") and not hasattr(o_ours, "found_inf")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_gradient_leaves_the_fused_update_undone(device, bad):
    params = _params(device)
    opt = adamw(params, 1e-2, 0.01, device, fused=True)
    _grads(params, 1.0, 0)
    clipped_step(opt, 1.0)  # one good step: moments and step counts exist
    before = copy.deepcopy(([p.detach().clone() for p in params], opt.state_dict()["state"]))
    _grads(params, 1.0, 1)
    params[1].grad[3] = bad
    norm = clipped_step(opt, 1.0)
    assert not torch.isfinite(norm)
    for p, q in zip(params, before[0], strict=True):
        assert torch.equal(p.detach(), q)
    for i, st in opt.state_dict()["state"].items():
        for k, v in st.items():
            assert torch.equal(v, before[1][i][k]), (i, k)
    # the next finite step goes on as if the bad one had not been
    _grads(params, 1.0, 2)
    assert torch.isfinite(clipped_step(opt, 1.0))
    assert all(torch.isfinite(p).all() for p in params)
    assert float(opt.state[params[0]]["step"]) == 2
