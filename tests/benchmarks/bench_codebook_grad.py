"""DFlash 2's selector codebooks: the gather of [R, K] candidate rows from a [vocab, rank] fp32
codebook, forward + backward, three ways, on one CUDA device: advanced indexing (autograd's index
backward: sort, then accumulate duplicates), F.embedding (its sort-and-segment backward) and
index_add_ into zeros (atomic adds: not deterministic). The ids are Zipf-distributed over the
vocabulary, as a trained drafter's candidates repeat common tokens; --zipf 0 draws them uniformly.

    python -m tests.benchmarks.bench_codebook_grad [--rows 7168] [--top-k 16] [--rank 256] [--zipf 1.1]

Prints the median of 20 timed passes after 3 warm-ups (CUDA events) per way, and its ratio to the
indexing one measured in the same process."""

import argparse

import torch
import torch.nn.functional as F

from tests.benchmarks.bench_grouped_conv import median_ms


def index_add_gather(codebook, ids):
    class Gather(torch.autograd.Function):
        @staticmethod
        def forward(ctx, w):
            return w[ids]

        @staticmethod
        def backward(ctx, grad):
            return torch.zeros_like(codebook).index_add_(0, ids.reshape(-1), grad.reshape(-1, grad.shape[-1]))
    return Gather.apply(codebook)


WAYS = {"indexing": lambda w, ids: w[ids], "F.embedding": lambda w, ids: F.embedding(ids, w),
        "index_add_": index_add_gather}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=7168)  # 512 anchors x 2 sequences x 7 predicted positions
    p.add_argument("--top-k", type=int, default=16)
    p.add_argument("--rank", type=int, default=256)
    p.add_argument("--vocab", type=int, default=248320)
    p.add_argument("--zipf", type=float, default=1.1)
    a = p.parse_args(argv)
    g = torch.Generator(device="cuda").manual_seed(0)
    if a.zipf:
        weights = torch.arange(1, a.vocab + 1, device="cuda", dtype=torch.float64) ** -a.zipf
        ids = torch.multinomial(weights.float(), a.rows * a.top_k, replacement=True, generator=g)
    else:
        ids = torch.randint(a.vocab, (a.rows * a.top_k,), device="cuda", generator=g)
    ids = ids.view(a.rows, a.top_k)
    print(f"{ids.numel()} ids, {ids.unique().numel()} distinct (zipf {a.zipf})", flush=True)
    codebook = (torch.randn(a.vocab, a.rank, device="cuda", generator=g) * 0.02).requires_grad_()
    grad = torch.randn(a.rows, a.top_k, a.rank, device="cuda", generator=g)
    anchor, expected = None, None
    for name, way in WAYS.items():
        def step(_=None, way=way):
            return torch.autograd.grad(way(codebook, ids), codebook, grad)[0]
        got = step()
        expected = got if expected is None else expected
        ms = median_ms(step)
        anchor = anchor or ms
        print(f"{name}: {ms:.3f} ms ({ms / anchor:.2f}x indexing; gradient's largest difference from indexing's "
              f"{(got - expected).abs().max().item():.2e})", flush=True)


if __name__ == "__main__":
    main()
