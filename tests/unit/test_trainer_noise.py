"""drafter.context_noise: the drafter's context noise comes from the micro-batch's generator. On the
CPU it is that generator's own randn (as before); on a GPU it is drawn on the device from a seed the
generator gives, so the same micro-batch gets the same noise and the host draws one number."""

import pytest
import torch
from flashfleet_trainer.drafter import context_noise


def test_on_cpu_it_is_the_generators_randn():
    a = context_noise((64, 48), torch.Generator().manual_seed(7), "cpu")
    assert torch.equal(a, torch.randn((64, 48), generator=torch.Generator().manual_seed(7)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA: the noise drawn on the device")
def test_on_a_gpu_it_is_drawn_there_from_the_micro_batchs_generator():
    shape = (1000, 2048)
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    a, b = context_noise(shape, g1, "cuda"), context_noise(shape, g2, "cuda")
    assert a.is_cuda and a.shape == shape and torch.equal(a, b)  # the same micro-batch, the same noise
    assert torch.equal(g1.get_state(), g2.get_state())  # and the generator left in the same state
    c = context_noise(shape, torch.Generator().manual_seed(8), "cuda")
    assert not torch.equal(a, c)
    assert abs(float(a.mean())) < 0.01 and abs(float(a.std()) - 1) < 0.01  # standard normal
