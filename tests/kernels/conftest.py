"""Run the Triton kernels under the interpreter when there is no GPU, without leaking that mode.

``triton.jit`` decides between compiling and interpreting when a kernel is *decorated*, reading
``TRITON_INTERPRET``. So: set it, import our kernel module (decorating its kernels as interpreted),
and put the environment back, so that other test folders importing triton-based code in the same
session still compile normally. An autouse fixture sets it again around each test in this folder
only, for the parts of Triton that read it at launch time.
"""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
_ORIGINAL = os.environ.get("TRITON_INTERPRET")

if not HAS_CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import flashfleet_kernels.candidate_logits  # noqa: F401  (decorate the kernels as interpreted)
        import flashfleet_kernels.distill_loss  # noqa: F401
        import flashfleet_kernels.grouped_conv  # noqa: F401
        import flashfleet_kernels.norm_rope  # noqa: F401
        import flashfleet_kernels.swiglu  # noqa: F401
    except ImportError:  # no triton at all: the Triton tests skip themselves
        pass
    finally:
        if _ORIGINAL is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = _ORIGINAL


@pytest.fixture(autouse=True)
def _interpret_triton_here(monkeypatch):
    if not HAS_CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    yield
