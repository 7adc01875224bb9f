"""model.Linear: the drafter's linear layers. Under CUDA bf16 autocast with an fp32 weight, the
weight's gradient comes out of the GEMM in fp32 (no bf16 rounding, no cast kernel); everything else
is nn.Linear's. The oracle is the same product in fp64."""

import pytest
import torch
import torch.nn as nn
from flashfleet_trainer.model import DFlashDrafter, DrafterConfig, Linear

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
