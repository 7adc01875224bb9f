"""Position weights against hand-computed values; the loss against a direct computation.

The loss itself lives in flashfleet_kernels (one torch reference, the kernel's oracle); the trainer
reaches it through `get_loss_fn`. flashfleet_kernels is imported inside the tests, never at module
level: tests/kernels/conftest.py must be the first to import its Triton module (interpreter mode).
"""

import math

import pytest
import torch
import torch.nn.functional as F
from flashfleet_trainer.loss import (
    IGNORE,
    acceptance_proxy,
    drafter_loss,
    get_loss_fn,
    position_weights,
    stats_to_host,
)


def _reference():
    """The one torch reference, as the trainer gets it (`get_loss_fn("torch")`)."""
    fn, name = get_loss_fn("torch")
    assert name == "torch"
    return fn


def test_decay_weights_by_hand():
    valid = torch.tensor([[False, True, True, True], [False, True, False, True]])
    w = position_weights("decay", valid, gamma=2.0)
    assert torch.allclose(w[0], torch.tensor([0.0, 1.0, math.exp(-0.5), math.exp(-1.0)]))
    assert torch.allclose(w[1], torch.tensor([0.0, 1.0, 0.0, math.exp(-1.0)]))


def test_streak_weights_by_hand():
    valid = torch.tensor([[False, True, True, True]])
    ce = torch.tensor([[0.0, math.log(2), math.log(4), 0.0]])  # q = 1/2, 1/4, 1
    w = position_weights("streak", valid, ce, alpha=0.5)
    s1, s2, s3 = 0.5 * 0.5 + 0.5, 0.5 * 0.25 + 0.5, 1.0  # smoothed: 0.75, 0.625, 1
    p1, p2, p3 = s1, s1 * s2, s1 * s2 * s3
    assert torch.allclose(w[0], torch.tensor([0.0, p1 + p2 + p3, p2 + p3, p3]))


def test_streak_with_alpha_one_counts_dependent_positions_and_stops_at_invalid():
    valid = torch.tensor([[False, True, True, True, True], [False, True, True, False, True]])
    w = position_weights("streak", valid, torch.rand(2, 5), alpha=1.0)
    assert w[0].tolist() == [0.0, 4.0, 3.0, 2.0, 1.0]
    assert w[1].tolist() == [0.0, 2.0, 1.0, 0.0, 0.0]  # an unsupervised position ends the streak


def test_acceptance_proxy():
    assert acceptance_proxy([0.5, 0.5, 1.0]) == pytest.approx(0.5 + 0.25 + 0.25)


def _direct(hs, ht, w_head, y, rw, t, kw):
    num = den = 0.0
    for i in range(hs.shape[0]):
        if y[i] == IGNORE:
            continue
        zs, zt = hs[i] @ w_head.T, ht[i] @ w_head.T
        ce = -F.log_softmax(zs, -1)[y[i]]
        p, logq = F.softmax(zt / t, -1), F.log_softmax(zs / t, -1)
        kl = (p * (p.log() - logq)).sum()
        num = num + rw[i] * (kw * t * t * kl + (1 - kw) * ce)
        den = den + rw[i]
    return num / den


@pytest.mark.parametrize("kw,t", [(0.0, 1.0), (0.7, 2.0), (1.0, 1.0)])
def test_reference_loss_equals_direct_computation(kw, t):
    g = torch.Generator().manual_seed(0)
    hs, ht = torch.randn(10, 8, generator=g, dtype=torch.float64), torch.randn(10, 8, generator=g, dtype=torch.float64)
    w_head = torch.randn(30, 8, generator=g, dtype=torch.float64)
    y = torch.randint(0, 30, (10,), generator=g)
    y[3] = IGNORE
    rw = torch.rand(10, generator=g, dtype=torch.float64)
    got = _reference()(hs, ht, w_head, y, rw, temperature=t, kl_weight=kw)
    assert got.dtype == torch.float64  # fp64 in, fp64 throughout
    assert got.item() == pytest.approx(_direct(hs, ht, w_head, y, rw, t, kw).item(), rel=1e-10)


def test_drafter_loss_matches_direct_and_reports_parts():
    g = torch.Generator().manual_seed(1)
    n, b, h, v = 3, 4, 8, 25
    hs, ht = torch.randn(n, b, h, generator=g), torch.randn(n, b, h, generator=g)
    w_head = torch.randn(v, h, generator=g)
    y = torch.randint(0, v, (n, b), generator=g)
    y[:, 0] = IGNORE
    y[2, 3] = IGNORE
    loss, st = drafter_loss(hs, ht, w_head, y, loss_fn=_reference(), weighting="decay",
                            decay_gamma=3.0, use_soft_labels=True, kl_temperature=2.0, kl_weight=0.6)
    wts = position_weights("decay", y != IGNORE, gamma=3.0)
    want = _direct(hs.reshape(-1, h).double(), ht.reshape(-1, h).double(), w_head.double(), y.reshape(-1),
                   wts.reshape(-1).double(), 2.0, 0.6)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    ce_direct = F.cross_entropy(hs.reshape(-1, h) @ w_head.T, y.reshape(-1).clamp_min(0), reduction="none")
    ce_w = (ce_direct * wts.reshape(-1)).sum() / wts.sum()
    assert st["ce"] == pytest.approx(ce_w.item(), rel=1e-5)
    pred = (hs @ w_head.T).argmax(-1)
    acc_pos3 = ((pred[:, 3] == y[:, 3]) & (y[:, 3] != IGNORE)).sum().item() / 2
    assert st["acc"][2] == pytest.approx(acc_pos3)
    assert st["kl"] > 0


def test_get_loss_fn_dispatches_to_the_kernels_package():
    """'torch' is the reference, bit for bit; 'auto' is too on CPU tensors (the Triton kernel on CUDA
    ones); 'triton' insists on the kernel; anything else is refused."""
    kernels = pytest.importorskip("flashfleet_kernels")
    g = torch.Generator().manual_seed(2)
    hs = torch.randn(3, 4, 16, generator=g)
    ht, w_head = torch.randn(3, 4, 16, generator=g), torch.randn(50, 16, generator=g)
    y, rw = torch.randint(0, 50, (3, 4), generator=g), torch.rand(3, 4, generator=g)
    y[0, 0] = IGNORE
    kw = dict(temperature=2.0, kl_weight=0.7, return_row_stats=True, row_group=4)
    want = kernels.reference_fused_linear_distill_loss(hs, ht, w_head, y, rw, **kw)
    has_triton = kernels.triton_fused_linear_distill_loss is not None
    for impl in ("torch", "auto"):
        fn, name = get_loss_fn(impl)
        assert name == ("triton" if impl == "auto" and has_triton else "torch")
        got = fn(hs, ht, w_head, y, rw, **kw)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), impl
    if has_triton:
        fn, name = get_loss_fn("triton")
        assert name == "triton" and fn.keywords == {"impl": "triton"}
    else:
        with pytest.raises(ImportError):
            get_loss_fn("triton")
    with pytest.raises(ValueError, match="impl"):
        get_loss_fn("cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (tests/kernels runs the kernel on CPU)")
@pytest.mark.parametrize("impl", ["auto", "triton"])
def test_fused_kernel_matches_reference_on_cuda(impl):
    kernels = pytest.importorskip("flashfleet_kernels")
    if kernels.triton_fused_linear_distill_loss is None:
        pytest.skip("triton not importable")
    g = torch.Generator().manual_seed(2)
    hs = torch.randn(12, 16, generator=g).cuda().requires_grad_()
    ht, w_head = torch.randn(12, 16, generator=g).cuda(), torch.randn(50, 16, generator=g).cuda()
    y, rw = torch.randint(0, 50, (12,), generator=g).cuda(), torch.rand(12, generator=g).cuda()
    y[0] = IGNORE
    a = get_loss_fn(impl)[0](hs, ht, w_head, y, rw, temperature=2.0, kl_weight=0.7)
    b = kernels.reference_fused_linear_distill_loss(hs, ht, w_head, y, rw, temperature=2.0, kl_weight=0.7)
    assert a.item() == pytest.approx(b.item(), rel=1e-4)
    ga, = torch.autograd.grad(a, hs)
    gb, = torch.autograd.grad(b, hs)
    assert torch.allclose(ga, gb, atol=1e-5)


def _batch(seed=3, n=4, b=5, h=8, v=40):
    g = torch.Generator().manual_seed(seed)
    hs, ht = torch.randn(n, b, h, generator=g), torch.randn(n, b, h, generator=g)
    w_head = torch.randn(v, h, generator=g)
    y = torch.randint(0, v, (n, b), generator=g)
    y[:, 0] = IGNORE
    y[1, 2] = IGNORE
    y[3, 1:] = IGNORE  # a block with no supervised position
    return hs, ht, w_head, y


# (impl, device): the reference, and the Triton kernel where there is a GPU. Without one, the same
# route to the kernel runs under the Triton interpreter in tests/kernels/test_trainer_route.py.
LOSS_IMPLS = [
    ("torch", "cpu"),
    pytest.param("auto", "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")),
]


@pytest.mark.parametrize("impl, device", LOSS_IMPLS)
def test_streak_weights_come_from_the_loss_own_ce(impl, device):
    """Streak weights computed inside the loss (from its CE) equal those from a separate CE pass,
    and so do the loss, its gradient and the statistics."""
    hs, ht, w_head, y = _batch()
    n, b, h = hs.shape
    logits = hs.reshape(-1, h) @ w_head.T
    ce_direct = (F.cross_entropy(logits, y.reshape(-1).clamp_min(0), reduction="none") * (y.reshape(-1) != IGNORE))
    want_w = position_weights("streak", y != IGNORE, ce_direct.view(n, b), alpha=0.5)
    want = _direct(hs.reshape(-1, h).double(), ht.reshape(-1, h).double(), w_head.double(), y.reshape(-1),
                   want_w.reshape(-1).double(), 2.0, 0.6)
    fn, name = get_loss_fn(impl)
    if device == "cuda" and name != "triton":
        pytest.skip("triton not importable")
    x = hs.clone().to(device).requires_grad_()
    loss, st = drafter_loss(x, ht.to(device), w_head.to(device), y.to(device), loss_fn=fn, weighting="streak",
                            use_soft_labels=True, kl_temperature=2.0, kl_weight=0.6)
    assert torch.allclose(st["weights"].cpu(), want_w, atol=1e-5)
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert st["ce"] == pytest.approx(((ce_direct * want_w.reshape(-1)).sum() / want_w.sum()).item(), rel=1e-5)
    pred = logits.argmax(-1).view(n, b)
    for k in range(1, b):
        ok = y[:, k] != IGNORE
        want_acc = ((pred[:, k] == y[:, k]) & ok).sum().item() / max(ok.sum().item(), 1)
        assert st["acc"][k - 1] == pytest.approx(want_acc) if ok.any() else math.isnan(st["acc"][k - 1])
    loss.backward()
    ref = hs.clone().requires_grad_()
    _direct(ref.reshape(-1, h), ht.reshape(-1, h), w_head, y.reshape(-1), want_w.reshape(-1), 2.0, 0.6).backward()
    assert torch.allclose(x.grad.cpu(), ref.grad, atol=1e-5)


def test_device_stats_read_once_match_host_stats():
    hs, ht, w_head, y = _batch(seed=4)
    kw = dict(loss_fn=_reference(), weighting="streak", use_soft_labels=True,
              kl_temperature=1.0, kl_weight=0.5)
    _, host = drafter_loss(hs, ht, w_head, y, **kw)
    _, dev = drafter_loss(hs, ht, w_head, y, host_stats=False, **kw)
    for k in ("ce", "kl", "rows", "correct", "count"):
        assert isinstance(dev[k], torch.Tensor), k
    assert dev["ce"].dtype == torch.float64 and dev["kl"].dtype == torch.float64
    assert stats_to_host(dev)["acc"] == pytest.approx(host["acc"], nan_ok=True)
    assert {k: v for k, v in stats_to_host(dev).items() if k not in ("weights", "acc")} == \
        {k: v for k, v in host.items() if k not in ("weights", "acc")}
    assert host["rows"] == int((y != IGNORE).sum()) and math.isnan(host["acc"][-1]) is False


@pytest.mark.parametrize("weighting", ["streak", "decay"])
def test_no_logits_pass_outside_the_loss(weighting):
    """The statistics cost no matmul of their own: inside drafter_loss, only the loss touches the head."""
    from torch.utils._python_dispatch import TorchDispatchMode

    hs, ht, w_head, y = _batch(seed=5)
    v = w_head.shape[0]

    class CountHeadMatmuls(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.__name__.split(".")[0] in ("mm", "addmm", "bmm", "matmul") and out.shape[-1] == v:
                CountHeadMatmuls.n += 1
            return out

    calls = []
    reference = _reference()

    def loss_fn(*a, **k):
        calls.append(1)
        with torch.utils._python_dispatch._disable_current_modes():
            return reference(*a, **k)

    with CountHeadMatmuls():
        drafter_loss(hs, ht, w_head, y, loss_fn=loss_fn, weighting=weighting, use_soft_labels=True, kl_weight=0.5)
    assert calls == [1] and CountHeadMatmuls.n == 0
    with CountHeadMatmuls():  # the counter does see the loss's own logits
        reference(hs, ht, w_head, y, torch.ones_like(y, dtype=torch.float32), kl_weight=0.5)
    assert CountHeadMatmuls.n == 2


@pytest.mark.parametrize("weighting", ["streak", "decay"])
def test_the_anchor_rows_never_reach_the_loss(weighting):
    """Position 0 of each block (the anchor, label always IGNORE) is left out of the loss's rows, and
    the loss, the statistics and the gradient are those of the whole blocks."""
    hs, ht, w_head, y = _batch(seed=6)
    n, b, h = hs.shape
    seen = []
    reference = _reference()

    def loss_fn(student, teacher, head, labels, rw, **k):
        seen.append((tuple(student.shape), tuple(teacher.shape), tuple(labels.shape), k["row_group"]))
        return reference(student, teacher, head, labels, rw, **k)

    kw = dict(weighting=weighting, use_soft_labels=True, kl_temperature=2.0, kl_weight=0.6)
    x = hs.clone().requires_grad_()
    loss, st = drafter_loss(x, ht, w_head, y, loss_fn=loss_fn, **kw)
    assert seen == [((n, b - 1, h), (n, b - 1, h), (n, b - 1), b - 1)]
    loss.backward()
    ce = F.cross_entropy((hs.reshape(-1, h) @ w_head.T), y.reshape(-1).clamp_min(0), reduction="none")
    wts = position_weights(weighting, y != IGNORE, (ce * (y.reshape(-1) != IGNORE)).view(n, b), gamma=None)
    ref = hs.clone().requires_grad_()
    want = _direct(ref.reshape(-1, h), ht.reshape(-1, h), w_head, y.reshape(-1), wts.reshape(-1), 2.0, 0.6)
    want.backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    assert torch.allclose(st["weights"], wts, atol=1e-6) and (st["weights"][:, 0] == 0).all()
    assert torch.allclose(x.grad, ref.grad, atol=1e-5) and (x.grad[:, 0] == 0).all()
    assert st["count"] == [float((y[:, k] != IGNORE).sum()) for k in range(1, b)]
    ce_only, _ = drafter_loss(hs, None, w_head, y, loss_fn=reference, weighting=weighting, use_soft_labels=True)
    assert torch.isfinite(ce_only)  # soft labels asked for with KL weight 0: no teacher needed
    with pytest.raises(ValueError, match="block size >= 2"):
        drafter_loss(hs[:, :1], ht[:, :1], w_head, y[:, :1], loss_fn=loss_fn, **kw)
