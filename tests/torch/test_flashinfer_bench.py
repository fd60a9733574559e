"""benchmarks/verify_kernels_flashinfer.py's guards, which run without a GPU or FlashInfer."""
import numpy as np
import pytest
import torch
from benchmark_modules import load_benchmark


def bench():
    return load_benchmark("verify_kernels_flashinfer")


def test_missing_library_says_how_to_build_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="scripts/flashinfer_build.sh"):
        bench().load(tmp_path / "libflashinfer_chain.so")


def test_chain_refuses_a_column_major_draft_before_the_kernel_reads_it():
    never_called = lambda *a: pytest.fail("the kernel was launched")  # noqa: E731
    b, g, v = 5, 4, 12
    # flashspec.testing.draft_step's one-hot drafts: astype keeps the broadcast's order ('K'), column-major
    x = torch.tensor(np.broadcast_to(np.array([4, 3, 9, 5]), (b, g)).astype(np.int64), dtype=torch.int32)
    assert x.stride() == (1, b)
    q, p = torch.full((b, g, v), 1 / v), torch.full((b, g + 1, v), 1 / v)
    with pytest.raises(ValueError, match=r"draft_tokens must be a contiguous .* strides \(1, 5\)"):
        bench().chain(never_called, q, x, p)


def test_chain_refuses_host_memory():
    b, g, v = 2, 1, 8
    with pytest.raises(ValueError, match="draft_probs is on cpu"):
        bench().chain(lambda *a: pytest.fail("the kernel was launched"), torch.full((b, g, v), 1 / v),
                      torch.zeros((b, g), dtype=torch.int32), torch.full((b, g + 1, v), 1 / v))
