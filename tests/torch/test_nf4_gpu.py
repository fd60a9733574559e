"""NF4 (bitsandbytes) on a CUDA GPU: its product against the dequantized weights, and the engine
with an NF4 self-draft and with the NF4 copy as the target, in CUDA graphs and eagerly."""

import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec.loop import SpecConfig, decode, speculate
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft, ModelDraft

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
bnb = pytest.importorskip("bitsandbytes")

from flashspec_torch.nf4 import NF4Linear, quantize_nf4  # noqa: E402
from test_backend_graphs import PROMPTS, Cycle, tiny_model  # noqa: E402

GREEDY = SamplingConfig(0.0)


@pytest.mark.parametrize("rows", [1, 5])
def test_nf4_linear_on_cuda_equals_its_dequantized_reference(rows):
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 192, bias=False, device="cuda", dtype=torch.bfloat16)
    q = NF4Linear(lin)
    x = torch.randn(1, rows, 256, device="cuda", dtype=torch.bfloat16)
    want = torch.nn.functional.linear(x.float(), q.dequantized().float())
    torch.testing.assert_close(q(x).float(), want, rtol=2e-2, atol=2e-2 * float(want.abs().max()))


def nf4_pair():
    m = tiny_model("cuda").to(torch.bfloat16)
    return m, quantize_nf4(m)


def test_nf4_draft_and_target_in_graphs_equal_eager_under_greedy():
    seed = torch.tensor([3, 1, 4, 1], device="cuda")
    spec = SpecConfig(gamma=3, max_new_tokens=16)
    m, q = nf4_pair()
    runs = {}
    for graphs in (False, True):
        with torch.inference_mode():
            b = TorchBackend(m, [ModelDraft("nf4", q), LookupDraft()], graphs=graphs)
            with_draft, _ = speculate(b, Cycle([0, 0, 1, 0]), PROMPTS, sampling=GREEDY, spec=spec, seed=seed)
            plain, _ = decode(b, PROMPTS, sampling=GREEDY, max_new_tokens=16, seed=seed)
            t = TorchBackend(q, [LookupDraft(), ModelDraft("self", q)], graphs=graphs)
            nf4_spec, _ = speculate(t, Cycle([0, 1]), PROMPTS, sampling=GREEDY, spec=spec, seed=seed)
            nf4_plain, _ = decode(t, PROMPTS, sampling=GREEDY, max_new_tokens=16, seed=seed)
        runs[graphs] = (with_draft, plain, nf4_spec, nf4_plain)
    assert runs[True] == runs[False]
    with_draft, plain, nf4_spec, nf4_plain = runs[True]
    assert with_draft == plain and nf4_spec == nf4_plain


def test_sampled_nf4_target_with_a_lookup_draft_in_graphs_equals_eager():
    """Sampled: the tokens equal when both paths compute the same logits. A model draft does not
    (eagerly it feeds its lagging tokens in one chunk, graphed two at a time, and bitsandbytes
    multiplies 1 row and several rows with different kernels), so only a lookup draft is compared."""
    seed = torch.tensor([3, 1, 4, 1], device="cuda")
    _, q = nf4_pair()
    sampling = SamplingConfig(0.8)
    outs = []
    for graphs in (False, True):
        with torch.inference_mode():
            t = TorchBackend(q, [LookupDraft()], graphs=graphs)
            outs.append(speculate(t, Cycle([0]), PROMPTS, sampling=sampling, spec=SpecConfig(gamma=3, max_new_tokens=16),
                                  seed=seed)[0])
    assert outs[0] == outs[1]
