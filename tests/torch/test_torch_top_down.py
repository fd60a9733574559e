"""KernelConfig(top_down=True): the FINAL draw under the top-down noise (kernels/topdown.py) gives the tokens of
its NumPy oracle, flashspec.reference.verify_top_down, and a law-preserving change of the noise, not of the
step: the exactness suite's law is checked on that oracle (tests/core/test_exactness_suite.py).

Checked by hand that the parity test fails for a broken kernel: a block bound 4 below the true one (topdown.py,
``reach``), the floor taken as max(best key_p, best key_r) (since the seeds of v4, only the low-blocks residual
test below fails for it), the block's maximum left out (E'_{I_t} = E_j), the
list's last partial tile of blocks left out; with top_down_maxima="final", block maxima 3 too low and the blocks of
every step of ``store_block_maxima`` after the first left unread."""

import numpy as np
import pytest
import torch
from torch_helpers import Inputs, make_inputs

from flashspec import reference as oracle
from flashspec.reference import sample
from flashspec.config import SamplingConfig
from flashspec_torch import KernelConfig, verify_triton
from flashspec_torch.reference import verify_reference

TOP_DOWN = KernelConfig(block_b=1, block_v=256, sweep_v=32, num_chunks=3, sweep_chunks=4, top_down=True)
TOP_DOWN_4 = KernelConfig(block_b=1, block_v=256, num_chunks=3, sweep_chunks=2, top_down=True, top_down_blocks=4)
SEEDED = KernelConfig(block_b=1, block_v=256, num_chunks=3, sweep_chunks=1, top_down=True, top_down_seeds=4,
                      top_down_blocks=8)  # one program a row: 4 seed blocks, then its list 8 blocks at a time
OWN_MAXIMA = KernelConfig(block_b=1, block_v=256, num_chunks=3, sweep_chunks=4, top_down=True, top_down_seeds=2,
                          top_down_blocks=4, top_down_maxima="final")  # the final programs find row n's block maxima
OWN_ONE = KernelConfig(block_b=1, block_v=256, num_chunks=3, sweep_chunks=1, top_down=True, top_down_seeds=4,
                       top_down_maxima="final")  # ... one program a row: its 25 blocks read in two steps of 16


def run(inp, cfg, config, *, logits=True, logprobs=False, seed=7, offset=3):
    w, lq = (inp.w if logits else None), (inp.lq if logprobs else None)
    t = [None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in (inp.z, inp.x, w, lq)]
    got = verify_triton(*t, cfg, seed, offset, config=config)
    np_seed = seed.numpy().astype(np.uint64) if isinstance(seed, torch.Tensor) else seed
    np_offset = offset.numpy().astype(np.uint64) if isinstance(offset, torch.Tensor) else offset
    kw = dict(seed=np_seed, offset=np_offset, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
    return got, oracle.verify_top_down(inp.z, inp.x, w, lq, **kw), oracle.verify(inp.z, inp.x, w, lq, **kw)


@pytest.mark.parametrize("spread", [1.0, 6.0])
def test_top_down_matches_its_oracle(spread):
    """Flat and peaked rows; draft logits, draft log-probs and one-hot drafts; scalar and per-row seeds and
    offsets; bonus and residual rows; a vocabulary that is not a multiple of 64 (a partial last block)."""
    rng = np.random.default_rng({1.0: 1, 6.0: 8}[spread])
    cfg = SamplingConfig(temperature=0.9)
    inp = make_inputs(rng, 6, 3, 1543, cfg, spread=spread)
    seeds = torch.tensor([11, 2**40 + 5, 3, 7, 2**33, 9])
    offsets = torch.tensor([3, 0, 2**31 + 1, 5, 8, 1])
    differs = 0
    cases = ((True, False, 7, 3, TOP_DOWN), (True, True, seeds, offsets, TOP_DOWN), (False, False, 7, 3, TOP_DOWN),
             (True, False, seeds, offsets, TOP_DOWN_4), (False, False, 7, 3, TOP_DOWN_4),  # 4 blocks drawn together
             (True, False, seeds, offsets, SEEDED), (True, True, 7, 3, SEEDED), (False, False, 7, 3, SEEDED),
             (True, False, seeds, offsets, OWN_MAXIMA), (True, True, 7, 3, OWN_MAXIMA), (False, False, 7, 3, OWN_MAXIMA),
             (True, False, seeds, offsets, OWN_ONE))
    for logits, logprobs, seed, offset, config in cases:
        got, want, default = run(inp, cfg, config, logits=logits, logprobs=logprobs, seed=seed, offset=offset)
        label = (f"logits={logits} logprobs={logprobs} seeds={type(seed).__name__} blocks={config.top_down_blocks} "
                 f"seed blocks={config.top_down_seeds} maxima={config.top_down_maxima}")
        np.testing.assert_array_equal(got.num_accepted.numpy(), want.num_accepted, err_msg=label)
        np.testing.assert_array_equal(got.tokens.numpy(), want.tokens, err_msg=label)
        differs += int((want.tokens != default.tokens).sum())
        if config is TOP_DOWN and logits and not logprobs:
            assert 0 < int((want.num_accepted == 3).sum()) < 6  # bonus rows and residual rows in the batch
    assert differs > 0  # another noise: the check above is not the default path's


def test_top_down_finds_a_residual_that_lives_in_low_blocks():
    """The draft puts more mass than the target on one block of high logits, so the residual max(p - q, 0) lives
    only in the other blocks, whose bounds lie far below p's best key: a floor above the residual's best key (say
    max(best key_p, best key_r) instead of their min) prunes the residual's winner and fails here."""
    rng = np.random.default_rng(12)
    cfg = SamplingConfig(temperature=0.9)
    b, g, v = 24, 3, 1543
    z = rng.normal(size=(b, g + 1, v)).astype(np.float32)
    z[:, :, 192:256] += 4.0  # block 3: about two thirds of p
    w = z[:, :g].copy()
    w[:, :, 192:256] += 3.0  # ... ~98% of q: r = 0 there
    xs, lqs = zip(*(sample(w[:, i], cfg, 11, 3, position=i) for i in range(g)))
    inp = Inputs(z, np.stack(xs, 1).astype(np.int64), w, np.stack(lqs, 1).astype(np.float32))
    for config in (TOP_DOWN, SEEDED, OWN_MAXIMA, OWN_ONE):
        got, want, _ = run(inp, cfg, config, seed=torch.arange(b) * 3 + 1, offset=torch.zeros(b, dtype=torch.int64))
        y = want.tokens[np.arange(b), want.num_accepted][want.num_accepted < g]  # the residual draws
        assert len(y) >= 3 and ((y < 192) | (y >= 256)).all()  # several, none from block 3
        np.testing.assert_array_equal(got.tokens.numpy(), want.tokens, err_msg=f"{config}")


@pytest.mark.parametrize("logits", [True, False])
def test_torch_reference_with_top_down_noise_matches_the_oracle(logits):
    """verify_reference(top_down=True), the torch reference the GPU benchmarks check the kernel against."""
    rng = np.random.default_rng(9)
    cfg = SamplingConfig(temperature=0.8)
    inp = make_inputs(rng, 16, 4, 3001, cfg, spread=3.0)
    w = inp.w if logits else None
    t = [None if a is None else torch.from_numpy(np.ascontiguousarray(a)) for a in (inp.z, inp.x, w)]
    for seed in (7, torch.arange(16) * 5 + 1):
        np_seed = seed.numpy().astype(np.uint64) if isinstance(seed, torch.Tensor) else seed
        got = verify_reference(*t, None, cfg, seed, 3, top_down=True)
        want = oracle.verify_top_down(inp.z, inp.x, w, None, seed=np_seed, offset=3, temperature=0.8)
        np.testing.assert_array_equal(got.tokens.numpy(), want.tokens)
        default = verify_reference(*t, None, cfg, seed, 3)
        np.testing.assert_array_equal(default.tokens.numpy(), oracle.verify(inp.z, inp.x, w, None, seed=np_seed, offset=3,
                                                                            temperature=0.8).tokens)


def test_top_down_one_sweep_program_per_row_and_a_short_vocabulary():
    """One final program per row (sweep_chunks=1, every block its own), and V = 100 (two chunks, the second
    a partial block)."""
    rng = np.random.default_rng(4)
    cfg = SamplingConfig(temperature=1.3)
    for b, g, v, config in ((5, 2, 700, KernelConfig(block_b=1, block_v=128, num_chunks=2, sweep_chunks=1,
                                                         top_down=True)),
                            (4, 3, 100, KernelConfig(block_b=1, block_v=64, num_chunks=2, top_down=True))):
        inp = make_inputs(rng, b, g, v, cfg)
        got, want, _ = run(inp, cfg, config)
        np.testing.assert_array_equal(got.tokens.numpy(), want.tokens, err_msg=f"V={v}")


def test_top_down_refuses_what_it_cannot_draw_and_greedy_needs_no_noise():
    """With top-k / top-p, or one chunk (the fused launch), it raises instead of drawing with the other noise;
    at T = 0 there is no noise: the default tokens."""
    rng = np.random.default_rng(5)
    inp = make_inputs(rng, 4, 3, 1000, SamplingConfig(temperature=0.9))
    with pytest.raises(ValueError, match="top_k"):
        run(inp, SamplingConfig(temperature=0.9, top_k=40), TOP_DOWN)
    with pytest.raises(ValueError, match="two launches"):
        run(inp, SamplingConfig(temperature=0.9), KernelConfig(block_b=1, block_v=1024, num_chunks=1, top_down=True))
    cfg = SamplingConfig(temperature=0.0)
    got, _, default = run(inp, cfg, TOP_DOWN)
    np.testing.assert_array_equal(got.tokens.numpy(), default.tokens)


def test_top_down_options_are_checked():
    with pytest.raises(ValueError, match="top_down"):
        KernelConfig(top_down=1)
    with pytest.raises(ValueError, match="top_down_blocks"):
        KernelConfig(top_down=True, top_down_blocks=3)
    with pytest.raises(ValueError, match="top_down_maxima"):
        KernelConfig(top_down=True, top_down_maxima="draft")
    with pytest.raises(ValueError, match="top_down_seeds"):
        KernelConfig(top_down=True, top_down_seeds=64)
