"""flashfleet_kernels.swiglu: silu(gate) * up of a packed [gate | up] tensor in Triton, forward and
backward. The oracle is the trainer's torch version in fp64. Without a GPU the kernels run under
Triton's interpreter (conftest.py), which has no bf16: fp32 only there."""

import pytest
import torch
from flashfleet_kernels.swiglu import swiglu
from flashfleet_trainer.drafter import swiglu as swiglu_torch

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
cuda = pytest.mark.skipif(not HAS_CUDA, reason="CUDA: bf16, which Triton's interpreter lacks")


@pytest.mark.parametrize("shape", [(100, 2 * 1500), (2, 7, 2 * 1024), (0, 64), (5, 2)])
@pytest.mark.parametrize("dtype", [pytest.param(torch.bfloat16, marks=cuda), torch.float32])
def test_matches_torch_in_fp64(shape, dtype):
    g = torch.Generator(device=DEV).manual_seed(0)
    gu = (3 * torch.randn(shape, device=DEV, generator=g)).to(dtype).requires_grad_()
    dout = torch.randn(*shape[:-1], shape[-1] // 2, device=DEV, generator=g).to(dtype)
    out = swiglu(gu)
    out.backward(dout)
    ref_in = gu.detach().double().requires_grad_()
    ref = swiglu_torch(ref_in)
    ref.backward(dout.double())
    assert out.dtype == dtype and out.shape == ref.shape and gu.grad.shape == gu.shape
    # fp32 math rounded once: within one rounding of the output dtype of the exact values
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), ref, **tol)
    torch.testing.assert_close(gu.grad.double(), ref_in.grad, **tol)


def test_a_non_contiguous_input_and_gradient():
    gu = torch.randn(64, 2 * 96, device=DEV).t().contiguous().t().requires_grad_()  # column-major
    assert not gu.is_contiguous()
    out = swiglu(gu)
    out.t().sum().backward()  # a non-contiguous gradient
    ref_in = gu.detach().double().requires_grad_()
    ref = swiglu_torch(ref_in)
    ref.sum().backward()
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gu.grad.double(), ref_in.grad, rtol=1e-5, atol=1e-5)


def test_bad_input_is_refused_with_the_fix(monkeypatch):
    with pytest.raises(ValueError, match="even last dimension"):
        swiglu(torch.randn(4, 5, device=DEV))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a CPU tensor where Triton compiles for the GPU
    with pytest.raises(ValueError, match="CUDA tensor"):
        swiglu(torch.randn(4, 6))
