"""drafter.Linear and drafter.project: the drafter's linear layers. Under CUDA bf16 autocast with fp32
weights, each weight's gradient comes out of the GEMM in fp32 (no bf16 rounding, no cast kernel), and
layers that share an input run as one GEMM; everything else is nn.Linear's. The oracle is the same
product in fp64."""

import pytest
import torch
import torch.nn as nn
from flashfleet_trainer.drafter import DFlashDrafter, DrafterConfig, Linear, project

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: the bf16 autocast path")


def _pair(d_in, d_out, device):
    torch.manual_seed(0)
    ref = nn.Linear(d_in, d_out, bias=False, device=device)
    ours = Linear(d_in, d_out, bias=False, device=device)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def test_on_cpu_it_is_nn_linear():
    ref, ours = _pair(48, 80, "cpu")
    x = torch.randn(3, 7, 48, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    (ref(x) ** 2).sum().backward()
    (ours(x2) ** 2).sum().backward()
    assert torch.equal(ref.weight.grad, ours.weight.grad) and torch.equal(x.grad, x2.grad)


def test_the_drafter_state_dict_is_unchanged():
    """Checkpoints and exported drafters keep nn.Linear's keys and shapes."""
    c = DrafterConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                      num_hidden_layers=2, target_layer_ids=[1, 3], block_size=4, mask_token_id=9, vocab_size=10)
    m = DFlashDrafter(c)
    linears = [n for n, mod in m.named_modules() if isinstance(mod, nn.Linear)]
    assert len(linears) == 1 + 2 * 7 and all(type(m.get_submodule(n)) is Linear for n in linears), linears
    assert sorted(m.state_dict()) == sorted(
        [f"{n}.weight" for n in linears] + [n for n, _ in m.named_parameters() if "norm" in n]), sorted(m.state_dict())


@cuda
@pytest.mark.parametrize("shape", [(512, 256), (2, 300, 256)])
def test_under_autocast_the_weight_gradient_is_fp32_from_the_gemm(shape):
    ref, ours = _pair(256, 384, "cuda")
    x = torch.randn(*shape, device="cuda")
    dy = torch.randn(*shape[:-1], 384, device="cuda")
    outs, grads = [], []
    for mod in (ref, ours):
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = mod(xi)
        y.backward(dy.to(y.dtype))
        outs.append(y)
        grads.append((xi.grad, mod.weight.grad))
    assert outs[1].dtype == torch.bfloat16 and torch.equal(outs[0], outs[1])  # the forward is autocast's
    torch.testing.assert_close(grads[1][0], grads[0][0])  # the input's gradient too
    assert grads[1][1].dtype == torch.float32
    # the oracle: the same bf16 operands, multiplied in fp64
    xb, db = x.to(torch.bfloat16).double(), dy.to(torch.bfloat16).double()
    exact = (db.reshape(-1, 384).t() @ xb.reshape(-1, 256)).float()
    err_autocast = (grads[0][1] - exact).abs().max() / exact.abs().max()
    err_ours = (grads[1][1] - exact).abs().max() / exact.abs().max()
    assert err_ours < 1e-5 and err_ours < 0.1 * err_autocast, (err_ours, err_autocast)  # not rounded to bf16


def test_project_on_cpu_is_each_linear():
    mods = [_pair(48, d, "cpu")[1] for d in (80, 16)]
    x = torch.randn(5, 48)
    assert all(torch.equal(y, m(x)) for y, m in zip(project(x, *mods), mods, strict=True))
    assert torch.equal(project(x, *mods, packed=True), torch.cat([m(x) for m in mods], dim=-1))


@cuda
def test_project_runs_layers_that_share_an_input_as_one_gemm():
    """K and V (or gate and up): the outputs and the input's gradient as each layer's own under
    autocast, every weight's gradient within 1e-5 of the fp64 oracle, in fp32."""
    sizes = (384, 128, 128)
    refs = [nn.Linear(256, d, bias=False, device="cuda") for d in sizes]
    ours = [Linear(256, d, bias=False, device="cuda") for d in sizes]
    for r, o in zip(refs, ours, strict=True):
        o.load_state_dict(r.state_dict())
    x = torch.randn(600, 256, device="cuda")
    dys = [torch.randn(600, d, device="cuda") for d in sizes]
    got = {}
    for name, mods in (("ref", refs), ("ours", ours)):
        xi = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ys = [m(xi) for m in mods] if name == "ref" else project(xi, *mods)
            if name == "ours":  # packed: the same GEMM, one output
                assert torch.equal(project(xi, *mods, packed=True), torch.cat(ys, dim=-1))
        torch.autograd.backward(ys, [dy.to(y.dtype) for y, dy in zip(ys, dys, strict=True)])
        got[name] = ys, xi.grad, [m.weight.grad for m in mods]
    for a, b in zip(got["ref"][0], got["ours"][0], strict=True):
        assert b.dtype == torch.bfloat16 and b.shape == a.shape
        torch.testing.assert_close(b, a)
    # the input's gradient: one fp32-accumulated GEMM over all parts, rounded once, where autocast
    # rounds each layer's part to bf16 and sums them in bf16; both against fp64
    exact_dx = sum(dy.to(torch.bfloat16).double() @ m.weight.to(torch.bfloat16).double()
                   for dy, m in zip(dys, refs, strict=True))
    errs = [float((got[k][1].double() - exact_dx).abs().max() / exact_dx.abs().max()) for k in ("ref", "ours")]
    assert errs[1] < 1e-2 and errs[1] <= errs[0], errs
    xb = x.to(torch.bfloat16).double()
    for dy, g in zip(dys, got["ours"][2], strict=True):
        exact = (dy.to(torch.bfloat16).double().t() @ xb).float()
        assert g.dtype == torch.float32 and g.shape == exact.shape
        assert (g - exact).abs().max() / exact.abs().max() < 1e-5
