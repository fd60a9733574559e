"""Hypothesis fuzzing of ``flashspec_torch.verify``: valid results or a documented error, for
random shapes, dtypes and values (good and bad), tensors on another device, numpy inputs."""

import numpy as np
import pytest
import torch
from fuzz_cases import DOCUMENTED, check_result, verify_args
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashspec_torch import verify


def to_torch(a, device):
    if isinstance(a, np.ndarray):
        return torch.from_numpy(a.astype(np.float32) if a.dtype == np.float16 else a).to(device)
    return a


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(verify_args(), st.sampled_from(["cpu"] * 5 + ["meta", "numpy"]), st.sampled_from(["draft_tokens", "seed", "draft_logits"]))
def test_torch_verify(case, device, moved):
    """One argument (``moved``) sometimes lives elsewhere: on the meta device, or as a NumPy array."""
    (z, x), kw = case
    args = {"target_logits": z, "draft_tokens": x, **kw}
    args = {k: to_torch(v, "cpu") for k, v in args.items()}
    if moved in args and isinstance(args[moved], torch.Tensor):
        args[moved] = args[moved].to("meta") if device == "meta" else args[moved].numpy() if device == "numpy" else args[moved]
    try:
        res = verify(**args, impl="reference")
    except DOCUMENTED:
        return
    check_result(res, z, x)


def test_tensors_on_another_device_are_named():
    z, x = torch.zeros(2, 3, 5), torch.zeros(2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="draft_tokens is on meta but target_logits is on cpu"):
        verify(z, x.to("meta"))
    with pytest.raises(ValueError, match="seed is on meta"):
        verify(z, x, seed=torch.zeros(2, dtype=torch.int64, device="meta"))
    with pytest.raises(ValueError, match="seed is a ndarray; flashspec_torch.verify takes torch tensors"):
        verify(z, x, seed=np.zeros(2, np.int64))
