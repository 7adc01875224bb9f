"""A hybrid target's short convolution through flash-linear-attention's kernel (`short_conv`): the
adapter maps transformers' [B, C, T] call onto fla's [B, T, C] contract (CPU, against transformers'
own torch function, with a torch stand-in for the kernel); what falls back; where it is bound and
unbound; on CUDA the real kernel against the torch path, alone and inside a hybrid target."""

import sys
import types

import pytest
import torch
import torch.nn.functional as F
from flashfleet_trainer import short_conv
from flashfleet_trainer import target as ff_target

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def torch_fallback():
    from transformers.models.qwen3_5 import modeling_qwen3_5

    fn = modeling_qwen3_5.causal_conv1d_fn
    return getattr(fn, "fallback", fn)


def oracle_kernel(calls):
    """fla's causal_conv1d contract in plain torch (x [B, T, C], weight [C, W]), recording its inputs."""

    def causal_conv1d(x, weight, bias=None, activation=None, cu_seqlens=None, **_):
        calls.append((tuple(x.shape), x.is_contiguous(), activation, cu_seqlens))
        w = weight.shape[1]
        xp = F.pad(x.float(), (0, 0, w - 1, 0))  # zeros before the first position
        y = sum(xp[:, k:k + x.shape[1]] * weight[:, k].float() for k in range(w))
        y = y + (bias.float() if bias is not None else 0)
        return (F.silu(y) if activation in ("silu", "swish") else y).to(x.dtype), None

    return causal_conv1d


@pytest.fixture
def fake_fla(monkeypatch):
    """A stand-in `fla.modules.causal_conv1d` (the oracle above), the bindings undone afterwards."""
    torch_fallback()  # transformers' modules imported before the stand-in exists
    calls = []
    mod = types.ModuleType(short_conv.KERNEL_MODULE)
    mod.causal_conv1d = oracle_kernel(calls)
    for name in ("fla", "fla.modules"):
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name) or types.ModuleType(name))
    monkeypatch.setitem(sys.modules, short_conv.KERNEL_MODULE, mod)
    yield calls
    short_conv.unbind()


@pytest.mark.parametrize("activation,bias", [("silu", False), (None, True)])
def test_the_adapter_gives_transformers_torch_convolution(fake_fla, activation, bias):
    g = torch.Generator().manual_seed(0)
    projected = torch.randn(2, 37, 24, generator=g)  # the in-projection's [B, T, C]
    weight, b = torch.randn(24, 4, generator=g), (torch.randn(24, generator=g) if bias else None)
    fn = short_conv.conv1d_silu(torch_fallback(), short_conv.fla_kernel(), devices=("cpu",))
    got = fn(projected.transpose(1, 2), weight, b, activation=activation)
    want = torch_fallback()(projected.transpose(1, 2), weight, b, activation=activation)
    assert fake_fla == [((2, 37, 24), True, activation, None)]  # the kernel saw [B, T, C], no copy made
    assert got.shape == want.shape == (2, 24, 37)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_calls_it_does_not_take_go_to_the_fallback(fake_fla):
    seen = []

    def fallback(*a, **k):
        seen.append(k)
        return "fallback"

    x, w = torch.randn(1, 8, 5), torch.randn(8, 4)
    on_cpu = short_conv.conv1d_silu(fallback, short_conv.fla_kernel(), devices=("cpu",))
    assert short_conv.conv1d_silu(fallback, short_conv.fla_kernel())(x, w) == "fallback"  # CPU tensors
    assert on_cpu(x, w, activation="gelu") == "fallback"
    assert on_cpu(x, w, activation="silu", seq_idx=torch.zeros(1, 5)) == "fallback"
    assert len(seen) == 3 and fake_fla == []


def test_bind_replaces_only_the_torch_fallback_and_unbind_restores_it(fake_fla, monkeypatch):
    from transformers.models.qwen3_5 import modeling_qwen3_5

    before = modeling_qwen3_5.causal_conv1d_fn
    assert ff_target.linear_attention_kernels()["causal_conv1d_fn"] == "torch"
    assert ff_target.torch_conv_modules() == list(ff_target.HYBRID_MODELING.values())
    assert short_conv.bind(ff_target.torch_conv_modules()) == list(ff_target.HYBRID_MODELING.values())
    bound = modeling_qwen3_5.causal_conv1d_fn
    assert bound is not before and bound.fallback is before
    assert ff_target.linear_attention_kernels()["causal_conv1d_fn"] == short_conv.KERNEL_MODULE
    assert ff_target.torch_conv_modules() == []
    short_conv.bind(list(ff_target.HYBRID_MODELING.values()))
    assert modeling_qwen3_5.causal_conv1d_fn is bound  # idempotent
    short_conv.unbind()
    assert modeling_qwen3_5.causal_conv1d_fn is before
    monkeypatch.setattr(ff_target, "linear_attention_kernels", lambda cfg=None: {"causal_conv1d_fn": "causal_conv1d"})
    assert ff_target.torch_conv_modules() == []  # transformers bound causal-conv1d: kept
    monkeypatch.setattr(short_conv, "fla_kernel", lambda: None)
    assert short_conv.bind(list(ff_target.HYBRID_MODELING.values())) == [] and modeling_qwen3_5.causal_conv1d_fn is before


def test_a_cpu_target_keeps_the_torch_path(monkeypatch):
    from flashfleet_trainer.tiny import make_hybrid_target

    monkeypatch.setattr(short_conv, "bind", lambda modules: pytest.fail("bound for a CPU target"))
    model = make_hybrid_target(64, 32, 4, seed=0)[0].eval()
    assert ff_target.fast_kernels(model) is model


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=CUDA)])
def test_flas_kernel_matches_the_torch_path_alone_and_in_a_hybrid_target(device):
    from flashfleet_trainer.tiny import make_hybrid_target

    if short_conv.fla_kernel() is None:
        pytest.skip("flash-linear-attention is not installed")
    g = torch.Generator(device=device).manual_seed(0)
    projected = torch.randn(2, 777, 384, device=device, generator=g, dtype=torch.bfloat16)
    weight = torch.randn(384, 4, device=device, generator=g, dtype=torch.bfloat16) * 0.5
    fn = short_conv.conv1d_silu(torch_fallback(), short_conv.fla_kernel())
    got = fn(projected.transpose(1, 2), weight, None, activation="silu").float()
    torch_bf16 = torch_fallback()(projected.transpose(1, 2), weight, None, activation="silu").float()
    exact = torch_fallback()(projected.transpose(1, 2).float(), weight.float(), None, activation="silu")
    err, torch_err = (got - exact).norm() / exact.norm(), (torch_bf16 - exact).norm() / exact.norm()
    assert err <= 4e-3 and err <= 1.1 * torch_err  # bf16 output, no further from fp32 than torch's own path

    model = make_hybrid_target(64, 128, 8, seed=3)[0].to(device, torch.bfloat16).eval().requires_grad_(False)
    ids = torch.randint(1, 63, (3, 48), generator=torch.Generator().manual_seed(5))
    lengths = torch.tensor([48, 20, 37])
    producer = ff_target.HiddenStateProducer(None, [device], [1, 3, 6], device, replicas=[(device, model)])
    short_conv.unbind()
    ref = producer.forward_batch(ids, lengths)
    try:
        assert ff_target.fast_kernels(model) is model
        assert ff_target.linear_attention_kernels()["causal_conv1d_fn"] == short_conv.KERNEL_MODULE
        out = producer.forward_batch(ids, lengths)
    finally:
        short_conv.unbind()
    for got, want in zip(out, ref, strict=True):  # bf16 through 8 layers, as in test_target_compile
        assert (got.float() - want.float()).norm() <= 2e-2 * want.float().norm()
