"""drafter.gather_rows: x[i, j] as one index_select over x's flattened first two dimensions (the
drafter's context gather and the teacher rows' gather). The oracle is torch's own x[i, j]."""

import pytest
import torch
from flashfleet_trainer.drafter import gather_rows

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_equals_advanced_indexing(device, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 37, 24, generator=g).to(device, torch.bfloat16)
    i = torch.randint(0, 4, (300,), generator=g).to(device, dtype)
    j = torch.randint(0, 37, (300,), generator=g).to(device, dtype)
    got = gather_rows(x, i, j)
    assert got.dtype == x.dtype and torch.equal(got, x[i, j])


@pytest.mark.parametrize("device", DEVICES)
def test_broadcasts_the_indices_like_indexing(device):
    # the teacher rows: one sequence per block [N, 1], a position per block row [N, B]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 50, 8, generator=g).to(device)
    i = torch.randint(0, 3, (6, 1), generator=g).to(device)
    j = torch.randint(0, 50, (6, 16), generator=g).to(device)
    got = gather_rows(x, i, j)
    assert got.shape == (6, 16, 8) and torch.equal(got, x[i, j])


def test_a_row_index_past_the_sequences_reads_nothing():
    x = torch.zeros(2, 5, 3)
    with pytest.raises(IndexError):
        gather_rows(x, torch.tensor([2]), torch.tensor([0]))
