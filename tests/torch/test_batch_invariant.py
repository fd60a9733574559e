"""Batch-invariant mode (``Llama.batch_invariant``, ``Engine(batch_invariant=True)``) on a tiny random
Llama under the Triton interpreter, float32 and bfloat16: a prompt's logits are the same bits in
one pass, token by token (decoding), as a scoring pass of several tokens, and inside a batch of
prompts of other lengths; with a product that splits K by row count (the mutant) they are not, so
the check can fail; the engine gives a request the same tokens alone, in a batch of mixed
requests and through n-gram speculation, greedy and sampled with a fixed seed.
(tests/torch/test_invariant_matmul.py checks the product kernel alone; the GPU's tl.dot path runs in
benchmarks/batch_invariant_gpu.py.)"""

import pytest
import torch

from fault_helpers import CharTokenizer
from flashspec_torch import model as model_module
from flashspec_torch import invariant_matmul as I
from flashspec_torch import layers as L
from flashspec_torch.model import Llama, LlamaConfig
from flashspec_torch.weights import LoadedModel

CONFIG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                     head_dim=16, max_position_embeddings=128)  # few heads: the interpreter runs a program per token-head


def tiny(dtype: torch.dtype) -> Llama:
    torch.manual_seed(0)
    m = Llama(CONFIG).eval().requires_grad_(False)
    for p in m.parameters():
        p.data.normal_(0, 0.4)
    m = m.to(dtype)
    m.batch_invariant = True
    return m


def run(m: Llama, rows: list[list[int]], start: int, cache) -> torch.Tensor:  # [B, T, V]: rows right-padded
    t = max(len(r) for r in rows)
    tokens = torch.tensor([r + [0] * (t - len(r)) for r in rows])
    positions = torch.arange(start, start + t)[None].expand(len(rows), -1)
    return m(tokens, positions, cache, start + t)


PROMPT = [5, 9, 17, 33, 2, 41, 8, 60, 12, 3]  # 10 tokens; the last 3 are "scored"
OTHERS = [[7, 7, 1, 40, 22, 19, 50, 11, 4, 9, 30, 31, 2], [13, 6]]  # longer and shorter


def last_logits_four_ways(m: Llama, prompt=PROMPT, others=OTHERS) -> dict[str, torch.Tensor]:
    """The logits [3, V] of the prompt's last 3 positions: one pass; the rest then a 3-token scoring pass;
    the rest then token by token; in a batch with ``others`` (the rest's length then 3 each, padding
    past a short one)."""
    p, cut, out = prompt, len(prompt) - 3, {}
    cache = m.new_cache(1, 64)
    out["one pass"] = run(m, [p], 0, cache)[0, cut:]
    cache = m.new_cache(1, 64)
    run(m, [p[:cut]], 0, cache)
    out["scoring pass"] = run(m, [p[cut:]], cut, cache)[0]
    cache = m.new_cache(1, 64)
    run(m, [p[:cut]], 0, cache)
    out["decoding"] = torch.cat([run(m, [[x]], cut + i, cache)[0] for i, x in enumerate(p[cut:])])
    cache = m.new_cache(3, 64)
    run(m, [others[0][:cut], p[:cut], others[1]], 0, cache)
    out["in a batch"] = run(m, [others[0][cut : cut + 3], p[cut:], [1, 2, 3]], cut, cache)[1]
    return out


def differing(got: dict[str, torch.Tensor]) -> list[str]:
    return [name for name, z in got.items() if not torch.equal(z, got["decoding"])]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_prompts_logits_do_not_depend_on_the_pass_or_the_batch(dtype):
    got = last_logits_four_ways(tiny(dtype))
    assert differing(got) == []
    assert got["decoding"].isfinite().all() and got["decoding"].std() > 0.1


SMOLLM2 = LlamaConfig(vocab_size=1024, hidden_size=576, intermediate_size=1536, num_layers=1, num_heads=9,
                      num_kv_heads=3, head_dim=64, tie_word_embeddings=True, max_position_embeddings=128)
# SmolLM2-135M's dims but the vocabulary (the LM head's K, 576, is the model's): K = 4.5 chunks of 128 (the
# last chunk half masked), the down product's 12 slices, a query group of 3 (5 tokens per 16-row tile of
# invariant attention), add + RMSNorm with 2 rows per program; the batch's prefill is 3 x 27 = 81 rows
# (above 64: gate_up walks every slice in one program), the other passes are below 64 (one slice per program)


@pytest.mark.slow  # about 6 min under the interpreter (each pass runs ~1500 programs of the products)
def test_a_prompts_logits_do_not_depend_on_the_pass_or_the_batch_at_smollm2s_dims():
    torch.manual_seed(0)
    m = Llama(SMOLLM2).to(torch.bfloat16).eval().requires_grad_(False)
    for p in m.parameters():
        if p.dim() == 2:  # the norms keep their ones: logits of std ~0.5
            p.data.normal_(0, 0.02)
    m.batch_invariant = True
    g = torch.Generator().manual_seed(1)
    prompt, longer, short = (torch.randint(0, 1024, (n,), generator=g).tolist() for n in (30, 33, 12))
    got = last_logits_four_ways(m, prompt, [longer, short])
    assert differing(got) == []
    assert got["decoding"].isfinite().all() and got["decoding"].float().std() > 0.1


def test_a_product_that_splits_k_by_rows_is_caught(monkeypatch):
    """The o projection by a mutant that splits K in two above one row (at a third: halves would
    reproduce the pairwise tree exactly): a scoring pass no longer gives decoding's bits, so the
    check above can fail."""
    def split_k(x, w, pdl=False):
        k = x.shape[-1]
        if x.numel() // k == 1:
            return I.invariant_matmul(x, w)
        h = k // 3
        halves = [I.invariant_matmul(x[..., s].contiguous(), w[:, s].contiguous()).float()
                  for s in (slice(0, h), slice(h, k))]
        return (halves[0] + halves[1]).to(x.dtype)

    monkeypatch.setattr(model_module, "invariant_matmul", split_k)
    assert "scoring pass" in differing(last_logits_four_ways(tiny(torch.float32)))


def unfused_rope_kv(x, w, r: I.RopeKV, pdl=False):  # the product, then rope_kv
    return L.rope_kv(I.invariant_matmul(x, w, pdl), r.cos, r.sin, r.positions, r.k_cache, r.v_cache, r.heads, r.kv_heads,
                     "triton", pdl)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_products_epilogues_give_the_unfused_logits(dtype, monkeypatch):
    """The model's batch-invariant forward runs qkv with RoPE + KV write and gate_up with SwiGLU as their
    epilogues, and no ``rope_kv`` or ``silu_mul`` kernel; its logits (which read the K and V the epilogue
    wrote) are the bits of the unfused path (the product, then ``rope_kv`` / ``silu_mul``), every way they
    are computed."""
    m = tiny(dtype)

    def refuse(*args, **kwargs):
        raise AssertionError("forward_invariant ran an unfused kernel")

    monkeypatch.setattr(model_module, "silu_mul", refuse)
    monkeypatch.setattr(model_module, "rope_kv", refuse)
    fused = last_logits_four_ways(m)
    monkeypatch.setattr(model_module, "invariant_matmul_swiglu",
                        lambda x, w, pdl=False: L.silu_mul(I.invariant_matmul(x, w, pdl), "triton", pdl))
    monkeypatch.setattr(model_module, "invariant_matmul_rope_kv", unfused_rope_kv)
    unfused = last_logits_four_ways(m)
    assert [name for name in fused if not torch.equal(fused[name], unfused[name])] == []


def test_the_engine_gives_a_request_its_tokens_alone_in_a_batch_and_speculating():
    from flashspec_torch.engine import Engine

    loaded = LoadedModel(tiny(torch.float32), CharTokenizer(), "tiny")
    eng = Engine(loaded, ("ngram",), policy="fixed", device="cpu", batch_invariant=True)
    prompt, others = "abcabcab", ["zz", "a longer prompt, much"]
    for temperature in (0.0, 0.9):
        kw = dict(temperature=temperature, max_new_tokens=4, chat=False)
        alone = eng.generate(prompt, seed=3, speculation=False, **kw)["tokens"]
        batch = eng.generate([others[0], prompt, others[1]], seed=[8, 3, 9], speculation=True, gamma=3, **kw)
        assert batch["tokens"][1] == alone, f"T={temperature}"
        assert len(alone) == 4


def test_what_the_mode_does_not_implement_is_refused():
    m = tiny(torch.float32)
    m.layers[0].o = torch.nn.Linear(32, 32, bias=True)
    with pytest.raises(ValueError, match="batch_invariant: .*without bias"):
        m.decode_settings(torch.device("cpu"))
    m = tiny(torch.float32)
    m.linear_impl = "fused"
    with pytest.raises(ValueError, match="batch_invariant: .*linear_impl='fused'"):
        m.decode_settings(torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_add_rms_norm_kernel_gives_a_row_the_same_bits_in_any_batch(dtype):
    """The standalone kernel (default mode): its row block follows the width, never the row count."""
    from flashspec_torch.layers import add_rms_norm

    g = torch.Generator().manual_seed(0)
    h, d, w = (torch.randn(*s, generator=g).to(dtype) for s in ((17, 96), (17, 96), (96,)))
    alone = torch.cat([add_rms_norm(h[i : i + 1].clone(), d[i : i + 1], w, 1e-5, "triton")[1] for i in range(17)])
    for m in (1, 3, 8, 17):
        assert torch.equal(add_rms_norm(h[:m].clone(), d[:m], w, 1e-5, "triton")[1], alone[:m]), m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_invariant_attention_gives_a_query_the_same_bits_as_decode_scoring_or_prefill_row(dtype):
    """A query at position p: alone (T = 1), among 5 scoring rows, among 40 prefill rows (pieces of
    64 / group tokens), inside a batch of 3: the same bits (the caches hold the same K/V)."""
    from flashspec_torch.layers import attention

    g = torch.Generator().manual_seed(1)
    heads, kv_heads, dim, s = 4, 2, 16, 48
    k, v = (torch.randn(3, kv_heads, s, dim, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(3, heads, 40, dim, generator=g).to(dtype)  # query t sits at position t
    pos = torch.arange(40)[None].expand(3, -1)

    def attend(rows, t0, t1):  # [len(rows), t1 - t0, H D]
        return attention(q[rows, :, t0:t1].contiguous(), k[rows], v[rows], pos[rows, t0:t1], None, kv_heads, "triton",
                         attend_len=s, invariant=True)

    prefill = attend([1], 0, 40)[0]
    for t in (0, 17, 33, 39):
        assert torch.equal(attend([1], t, t + 1)[0, 0], prefill[t]), t
    assert torch.equal(attend([1], 30, 35)[0], prefill[30:35])
    assert torch.equal(attend([0, 1, 2], 30, 35)[1], prefill[30:35])


def test_invariant_attention_split_over_the_slots_keeps_a_querys_bits(monkeypatch):
    """Splits of 16 slots (3 over the 48-slot cache, a program each, added in order): a query at
    position p alone == among scoring rows == in a prefill pass; and a query that sees only the first
    split gets the bits of the one-split (no merge) launch, however many splits the batch's length makes."""
    from flashspec_torch import layers

    monkeypatch.setattr(layers, "INVARIANT_KV_SPLIT", 16)
    g = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, s = 4, 2, 16, 48
    k, v = (torch.randn(1, kv_heads, s, dim, generator=g).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(1, heads, 40, dim, generator=g).to(torch.bfloat16)
    pos = torch.arange(40)[None]

    def attend(t0, t1, attend_len=s):
        return layers.attention(q[:, :, t0:t1].contiguous(), k, v, pos[:, t0:t1], None, kv_heads, "triton",
                                attend_len=attend_len, invariant=True)[0]

    prefill = attend(0, 40)
    for t in (5, 17, 39):
        assert torch.equal(attend(t, t + 1)[0], prefill[t]), t
    assert torch.equal(attend(30, 35), prefill[30:35])
    assert torch.equal(attend(5, 6, attend_len=16)[0], prefill[5])  # one split: no merge kernel

    def unsplit(t):  # the kernel without KV splits
        return layers.launch_attention(q[:, :, t : t + 1].contiguous(), k, v, pos[:, t : t + 1], kv_heads, False, s, 16,
                                       False, 8)[0, 0]

    assert torch.equal(unsplit(5), prefill[5])  # the merge of one split that saw slots is that split's acc / l
    assert not torch.equal(unsplit(39), prefill[39])  # 3 splits that saw slots: another sum
