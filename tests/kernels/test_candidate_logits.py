"""DFlash 2's candidate-logits kernel against the torch version (its oracle,
flashfleet_trainer.dflash2._CandidateLogits): values and the hidden rows' gradient, with row,
candidate and channel counts that leave every tile partly filled, and ids that repeat. Without
CUDA the kernels run under TRITON_INTERPRET=1 (conftest.py), in fp32; bf16 needs CUDA."""

import pytest
import torch
from flashfleet_trainer.dflash2 import _CandidateLogits

cl = pytest.importorskip("flashfleet_kernels.candidate_logits")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(r, h, k, vocab, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(r, h, generator=g)
    head = torch.randn(vocab, h, generator=g)
    ids = torch.randint(vocab, (r, k), generator=g)
    ids[::3, 0] = vocab - 1  # one id shared by a third of the rows: repeated reads of a row
    return hidden.to(DEVICE, dtype).requires_grad_(), head.to(DEVICE, dtype), ids.to(DEVICE)


@pytest.mark.parametrize("r,h,k,vocab", [
    (19, 100, 5, 37),  # partial row tile, K not a power of two, channels not a multiple of the step
    (8, 64, 16, 50),  # whole tiles: one row tile, one channel step, the published K
    (1, 3, 1, 4),  # one of everything
])
def test_kernel_matches_torch_values_and_gradient(r, h, k, vocab):
    hidden, head, ids = _inputs(r, h, k, vocab)
    dout = torch.randn(r, k, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    ours_h, theirs_h = hidden.detach().clone().requires_grad_(), hidden.detach().clone().requires_grad_()
    ours, theirs = cl.candidate_logits(ours_h, head, ids), _CandidateLogits.apply(theirs_h, head, ids)
    assert ours.dtype == torch.float32 and ours.shape == (r, k)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-5)
    (ours * dout).sum().backward()
    (theirs * dout).sum().backward()
    torch.testing.assert_close(ours_h.grad, theirs_h.grad, atol=1e-4, rtol=1e-5)


def test_no_rows():
    hidden, head, ids = _inputs(0, 16, 4, 10)
    out = cl.candidate_logits(hidden, head, ids)
    assert out.shape == (0, 4)
    out.sum().backward()
    assert hidden.grad.shape == (0, 16)


def test_refuses_what_it_cannot_run_and_names_the_torch_version():
    hidden, head, ids = _inputs(4, 8, 2, 10)
    with pytest.raises(ValueError, match="flashfleet_trainer.dflash2.candidate_logits"):
        cl.candidate_logits(hidden, head.t().contiguous().t(), ids)  # a transposed head
    with pytest.raises(ValueError, match=r"ids \(3, 2\)"):
        cl.candidate_logits(hidden, head, ids[:3])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 kernels need CUDA (the interpreter has no bf16)")
def test_bf16_at_the_27b_drafter_width_against_fp32():
    """The trainer's case: bf16 head and hidden rows at hidden 5120, top-16; fp32 accumulation
    keeps it within bf16 rounding of the fp32 product."""
    hidden, head, ids = _inputs(300, 5120, 16, 1000, dtype=torch.bfloat16)
    exact = torch.einsum("rh,rkh->rk", hidden.detach().float(), head.float()[ids])
    out = cl.candidate_logits(hidden, head, ids)
    torch.testing.assert_close(out, exact, atol=0.05, rtol=0.01)
    g = torch.randn_like(out)
    out.backward(g)
    torch.testing.assert_close(hidden.grad.float(), torch.einsum("rk,rkh->rh", g, head.float()[ids]),
                               atol=0.05, rtol=0.02)
