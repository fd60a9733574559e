"""CUDA graph replay of the verify step equals eager, with new seed / offset written in place."""

import pytest
import torch

from flashspec_torch import KernelConfig, verify

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SPLIT = KernelConfig(num_chunks=4, sweep_chunks=8, sweep_slots=4, pdl=True)  # its counters back at zero every replay


@pytest.mark.parametrize("impl,config", [("triton", None), ("triton", SPLIT), ("reference", None)],
                         ids=["triton", "triton-split", "reference"])
@pytest.mark.parametrize("b,g,v", [(1, 4, 32000), (8, 4, 4099), (64, 8, 1000)])
def test_graph_replay_matches_eager(impl, config, b, g, v):
    gen = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(b, g + 1, v, device="cuda", generator=gen) * 2
    w = z[:, :g] + torch.randn(b, g, v, device="cuda", generator=gen)
    x = torch.randint(0, v, (b, g), device="cuda", generator=gen)
    seed = torch.zeros(b, dtype=torch.int64, device="cuda")
    offset = torch.zeros((), dtype=torch.int64, device="cuda")
    kw = dict(temperature=0.8, impl=impl, config=config)
    verify(z, x, w, seed=seed, offset=offset, **kw)  # compile / warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = verify(z, x, w, seed=seed, offset=offset, **kw)
    for step in range(3):
        seed.copy_(torch.arange(b, device="cuda") + 100 * step)
        offset.fill_(step)
        graph.replay()
        eager = verify(z, x, w, seed=seed.clone(), offset=offset.clone(), **kw)
        torch.cuda.synchronize()
        assert torch.equal(out.tokens, eager.tokens) and torch.equal(out.num_accepted, eager.num_accepted)
