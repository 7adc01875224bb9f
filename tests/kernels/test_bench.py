"""``python -m tests.benchmarks.bench_loss --breakdown``'s phase loop, on CPU under the Triton interpreter.

The breakdown times the fused path's chunk loop phase by phase. It once launched the row kernel with
an argument list of its own, which fell behind the kernel's signature (``TypeError: dynamic_func()
missing 1 required positional argument: 'ignore_index'`` on an H200); it now drives the same
``ChunkLoop`` as the loss. Tiny shapes: several chunks, several vocabulary blocks per row.
"""

import pytest
import torch
from flashfleet_kernels import triton_fused_linear_distill_loss

needs_triton = pytest.mark.skipif(triton_fused_linear_distill_loss is None, reason="triton not importable")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _streak_like(group):
    def f(ce, start, end):
        s = 0.5 * torch.exp(-ce.view(-1, group)) + 0.5
        return torch.cumprod(s, 1).flip(1).cumsum(1).flip(1).reshape(-1)
    return f


@needs_triton
@pytest.mark.parametrize("temperature, kl_weight", [(2.0, 0.7), (1.0, 0.0)])
def test_breakdown_runs_and_times_every_phase(temperature, kl_weight):
    from tests.benchmarks import bench_loss as bench

    inputs = bench.make_inputs(40, 1500, 16, dtype=torch.float32, device=DEVICE)
    chunk, phases = bench.breakdown(inputs, temperature, kl_weight, chunk_size=16, reps=1)
    assert chunk == 16
    assert len(phases) == 3 and all(ms >= 0.0 for ms in phases.values())
    assert sum(phases.values()) > 0.0
    assert inputs[0].grad is None  # timing leaves the inputs alone


@needs_triton
def test_breakdown_with_a_weight_function():
    """Callable weights (the trainer's streak weights): pass 1, the weights, pass 2 per chunk."""
    from tests.benchmarks import bench_loss as bench

    h_s, h_t, weight, labels, _ = bench.make_inputs(36, 700, 16, dtype=torch.float32, device=DEVICE)
    chunk, phases = bench.breakdown((h_s, h_t, weight, labels, _streak_like(4)), 2.0, 0.7, chunk_size=10,
                                    reps=1, row_group=4)
    assert chunk == 8  # rounded down to whole groups, as in the loss
    assert len(phases) == 3 and all(ms >= 0.0 for ms in phases.values())


@needs_triton
def test_fp8_numerics_and_peaked_scale():
    """The benchmark's FP8 numerics report (the loss's own ChunkLoop with and without teacher_fp8)."""
    from flashfleet_kernels import distill_loss as dl

    from tests.benchmarks import bench_loss as bench

    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    if dl.fp8_support_problem(torch.device(DEVICE), dtype) is not None:
        pytest.skip("no row-wise FP8 torch._scaled_mm here")
    inputs = bench.make_inputs(40, 1504, 32, dtype=dtype, device=DEVICE)
    alpha = bench.peaked_scale(inputs[1], inputs[2])
    z = inputs[1].float() * alpha @ inputs[2].float().t()
    assert abs(torch.softmax(z, -1).amax(-1).mean().item() - 0.5) < 1e-3
    r = bench.fp8_numerics(inputs, 2.0, 0.7, rows=16, chunk_size=16)
    assert 0 < r["loss_rel"] < 2e-2 and 0.99 < r["grad_cos"] <= 1.0 + 1e-6
    assert 0 < r["fp8_max_err"] < 0.5 * r["logit_std"] and r["head_gib"] > 0
    assert "grad cosine" in bench.format_fp8_numerics(r)
