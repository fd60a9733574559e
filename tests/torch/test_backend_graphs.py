"""The graphed step (fixed shapes, attention over the whole cache, eager catch-up of lagging
drafts) gives the same tokens as the eager step with host-side bounds: on the CPU through the
capture-free runner, on a GPU through real CUDA-graph replays."""

import pytest
import torch

from flashspec.config import SamplingConfig
from flashspec.loop import SpecConfig, decode, speculate
from flashspec_torch.backend import TorchBackend
from flashspec_torch.drafts import LookupDraft, ModelDraft
from flashspec_torch.model import Llama, LlamaConfig
from schedules import Cycle  # tests/schedules.py

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def tiny_model(device, seed=0, vocab=61):
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=4,
                      num_kv_heads=2, head_dim=8, tie_word_embeddings=True, max_position_embeddings=512)
    torch.manual_seed(seed)
    m = Llama(cfg).to(device).eval()
    for p in m.parameters():
        p.data.normal_(0, 0.4)
    return m


def backends(device, graphs):
    target, small = tiny_model(device, 0), tiny_model(device, 1)
    drafts = [LookupDraft(), ModelDraft("skip", target, frozenset({1})), ModelDraft("small", small)]
    return TorchBackend(target, drafts, eos_ids=[3], graphs=graphs)


PROMPTS = [[5, 9, 11, 5, 9], [7, 1, 2, 3, 4, 5, 6, 7, 1, 2], [8], [13, 14, 13, 14, 13, 14, 13]]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sampling", [SamplingConfig(0.0), SamplingConfig(0.9), SamplingConfig(1.0, top_k=7, top_p=0.8)])
def test_graphed_steps_equal_eager_steps(device, sampling):
    seed = torch.tensor([3, 1, 4, 1], device=device)
    spec = SpecConfig(gamma=3, max_new_tokens=24)
    runs = {}
    for graphs in (False, True):
        b = backends(device, graphs)
        with torch.inference_mode():
            spec_out, records = speculate(b, Cycle([0, 1, 1, 2, 0, 2, 2, 1]), PROMPTS, sampling=sampling, spec=spec, seed=seed)
            plain_out, _ = decode(b, PROMPTS, sampling=sampling, max_new_tokens=24, seed=seed)
            again, _ = speculate(b, Cycle([2, 1]), PROMPTS[:3] + [[1]], sampling=sampling, spec=spec, seed=seed)
        runs[graphs] = (spec_out, [r.accepted for r in records], plain_out, again)
    assert runs[True] == runs[False]
    if sampling.greedy:
        assert runs[True][0] == runs[True][2]  # greedy speculation == greedy decoding


@pytest.mark.parametrize("device", DEVICES)
def test_buffers_are_reused_while_the_batch_fits(device):
    b = backends(device, True)
    with torch.inference_mode():
        b.prefill(PROMPTS, 16)
        tokens = b.seqs.tokens
        b.prefill([p[:1] for p in PROMPTS], 8)
        assert b.seqs.tokens is tokens  # same address: captured graphs stay valid
        b.prefill(PROMPTS[:2], 8)
        assert b.seqs.tokens is not tokens


@pytest.mark.parametrize("device", DEVICES)
def test_graphs_are_recaptured_when_the_buffers_grow(device):
    """A longer request re-allocates the buffers and drops the graphs; the next captures work."""
    b = backends(device, True)
    greedy = SamplingConfig(0.0)
    seed = torch.zeros(len(PROMPTS), dtype=torch.int64, device=device)
    with torch.inference_mode():
        short, _ = decode(b, PROMPTS, sampling=greedy, max_new_tokens=4, seed=seed)
        size = b.shape
        long, _ = decode(b, PROMPTS, sampling=greedy, max_new_tokens=480, seed=seed)
        assert b.shape != size
        again, _ = decode(b, PROMPTS, sampling=greedy, max_new_tokens=4, seed=seed)
    assert [s == l[:4] for s, l in zip(short, long)] == [True] * len(PROMPTS) and again == short


ALL = frozenset({"qkv", "o", "gate_up", "down", "lm_head"})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("linear_impl,pdl,fused", [
    ("reference", False, ALL), ("reference", True, ALL), ("triton", False, ALL), ("fused", False, ALL), ("fused", True, ALL),
    ("fused", True, frozenset({"qkv", "down"})), ("fused", True, frozenset({"o", "down", "lm_head"})), ("fused", True, frozenset()),
])
def test_bf16_graphs_with_every_kernel_equal_eager(linear_impl, pdl, fused):
    """bf16, head_dim 64 (the attention kernel), Triton, cuBLAS, fused or partly fused projections
    (with PDL launches inside the captured graphs too, also next to cuBLAS): graphs == eager."""
    cfg = LlamaConfig(vocab_size=501, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=64, tie_word_embeddings=False, max_position_embeddings=1024)
    torch.manual_seed(0)
    m = Llama(cfg).to("cuda", torch.bfloat16).eval()
    for p in m.parameters():
        p.data.normal_(0, 0.1)
    m.linear_impl, m.pdl, m.fused = linear_impl, pdl, fused
    seed = torch.arange(4, device="cuda")
    outs = {}
    for graphs in (False, True):
        b = TorchBackend(m, [LookupDraft(), ModelDraft("skip", m, frozenset({0}))], eos_ids=[], graphs=graphs)
        with torch.inference_mode():
            outs[graphs] = [speculate(b, Cycle([0, 1, 1]), PROMPTS, sampling=s, spec=SpecConfig(gamma=4, max_new_tokens=20), seed=seed)[0]
                            for s in (SamplingConfig(0.0), SamplingConfig(0.8, top_p=0.9))]
    assert outs[True] == outs[False]
