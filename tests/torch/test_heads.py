"""The EAGLE-style draft head (flashspec_torch.heads) and its training (head_train) on a tiny random
target: exact greedy speculation, the law of sampled tokens, training-time test == drafting, loss
falls, files and refusals."""

import numpy as np
import pytest
import torch

from flashspec.config import LlamaConfig, SamplingConfig
from flashspec.loop import SpecConfig, decode, speculate
from flashspec.testing import chi_square_test
from schedules import Cycle  # tests/schedules.py: the head lags and catches up

CFG = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_layers=3, num_heads=4, num_kv_heads=2,
                  head_dim=16, max_position_embeddings=512)


@pytest.fixture(scope="module")
def target():
    from flashspec_torch.model import Llama

    torch.manual_seed(0)
    m = Llama(CFG).eval().requires_grad_(False)
    for p in m.parameters():
        p.data.normal_(0, 0.3)
    return m


def random_head(target, layers=(0, 2), token_ids=None, scale=0.3, seed=1):
    from flashspec_torch.heads import DraftHead

    torch.manual_seed(seed)
    head = DraftHead(target.config, layers, token_ids)
    for p in head.parameters():
        p.data.normal_(0, scale)
    return head


@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("vocab", ["full", "reduced"])
def test_greedy_speculation_with_the_head_equals_greedy_decoding(target, graphs, vocab):
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.drafts import LookupDraft
    from flashspec_torch.heads import HeadDraft

    head = random_head(target, token_ids=None if vocab == "full" else torch.arange(0, 97, 2))
    stop_below = 0.0 if vocab == "full" else 0.1  # reduced: the dynamic draft length too (per-row lengths)
    backend = TorchBackend(target, [HeadDraft("head", head, target, stop_below), LookupDraft("ngram")], graphs=graphs)
    prompts, greedy = [[1, 2, 3, 4, 5], [7, 8, 9]], SamplingConfig(0.0)
    with torch.inference_mode():
        plain, _ = decode(backend, prompts, sampling=greedy, max_new_tokens=24)
        spec, records = speculate(backend, Cycle([0, 0, 1, 0, 1, 1, 0]), prompts, sampling=greedy,
                                  spec=SpecConfig(gamma=3, max_new_tokens=24))
    assert spec == plain
    assert sum(r.accepted for r in records if r.arm == 0) > 0  # the head's drafts were used


@pytest.mark.parametrize("graphs", [False, True])
def test_prepare_catches_the_model_drafts_up_over_the_prompt_and_changes_no_token(target, graphs):
    """``TorchBackend.prepare`` after ``prefill``: the head and a layer-skip draft have fed every prompt position but
    the last (``get_ready``) and are not lagging, so their first step does a step's work only; the steps after
    draft and accept exactly what they do when the first step catches up itself, and equal plain decoding."""
    from flashspec.loop import speculate_steps
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.drafts import LookupDraft, ModelDraft
    from flashspec_torch.heads import HeadDraft

    drafts = [HeadDraft("head", random_head(target), target), ModelDraft("skip", target, frozenset({1})),
              LookupDraft("ngram")]
    backend = TorchBackend(target, drafts, graphs=graphs)
    prompts, greedy, spec = [[1, 2, 3, 4, 5, 6, 7], [7, 8, 9]], SamplingConfig(0.0), SpecConfig(gamma=3, max_new_tokens=20)
    runs = {}
    with torch.inference_mode():
        plain, _ = decode(backend, prompts, sampling=greedy, max_new_tokens=20)
        for ready in (False, True):
            backend.prefill(prompts, spec.max_new_tokens)
            if ready:
                assert all(d.lagging(backend.seqs, 3) for d in drafts[:2])
                backend.prepare(3, greedy)
                fed = (backend.seqs.length - 1).tolist()
                assert [d.valid.tolist() for d in drafts[:2]] == [fed, fed]  # every prompt position but the last
                assert not any(d.lagging(backend.seqs, 3) for d in drafts[:2])
            records = []
            speculate_steps(backend, Cycle([0, 1, 0, 0, 1, 2]), sampling=greedy, spec=spec, seed=0, first_offset=0,
                            on_step=None, records=records)
            runs[ready] = backend.outputs(), [(r.arm, r.accepted) for r in records]
    assert runs[True] == runs[False]
    assert runs[True][0] == plain
    assert sum(acc for arm, acc in runs[True][1] if arm in (0, 1)) > 0  # the model drafts' tokens were accepted


@pytest.mark.parametrize("stop_below", [0.5, 0.999])
def test_proposals_stop_where_every_row_has_stopped_and_greedy_tokens_stay_plain(target, stop_below):
    """On the CPU's eager path a proposal ends once every row's dynamic length has (0.999: after the first token,
    every token is unsure; 0.5: some steps), so the scoring pass is shorter; greedy speculation still gives plain
    decoding's tokens. The graphed step always drafts G tokens (its shapes are fixed)."""
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.heads import HeadDraft

    draft = HeadDraft("head", random_head(target), target, stop_below)
    backend = TorchBackend(target, [draft], graphs=False)
    proposed, propose = [], draft.propose

    def counted(*args, **kwargs):
        p = propose(*args, **kwargs)
        proposed.append((p.tokens.shape[1], kwargs.get("graphed", False)))
        return p

    draft.propose = counted
    prompts, greedy = [[1, 2, 3, 4, 5], [7, 8, 9]], SamplingConfig(0.0)
    with torch.inference_mode():
        plain, _ = decode(backend, prompts, sampling=greedy, max_new_tokens=24)
        spec, _ = speculate(backend, Cycle([0]), prompts, sampling=greedy, spec=SpecConfig(gamma=4, max_new_tokens=24))
    assert spec == plain
    widths = [g for g, graphed in proposed if not graphed]
    assert widths and min(widths) < 4, proposed
    if stop_below == 0.999:
        assert set(widths) == {1}, proposed


def test_training_time_test_states_are_what_drafting_computes(target):
    """Pass k of ``ttt_states`` at position p == the head fed the target's features up to p - k,
    then k of its own states (what drafting the (k+1)-th token computes)."""
    from flashspec_torch.head_train import target_pass, ttt_states
    from flashspec_torch.model import KVCache

    head = random_head(target).attach(target)
    tokens = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(3))
    _, feats = target_pass(target, tokens, head.feature_layers)
    states = ttt_states(head, target, tokens, feats, 3)
    with torch.no_grad():
        for k in range(3):
            for p in (k, 5, 9):
                cache, n = KVCache(head.config, 2, 16, torch.float32, "cpu"), p - k + 1
                f = torch.cat([torch.zeros_like(feats[:, :1, :64]), head.fuse(feats[:, : n - 1])], 1)
                s, _ = head.run(target, tokens[:, :n], f, torch.arange(n)[None].expand(2, -1), cache, 16)
                s = s[:, -1]
                for j in range(1, k + 1):
                    q = p - k + j
                    s = head.run(target, tokens[:, q : q + 1], s[:, None], torch.full((2, 1), q), cache, 16)[0][:, 0]
                torch.testing.assert_close(s, states[k][:, p], rtol=1e-4, atol=1e-4)


def drop_unsure_token(w, j, stop_below):  # the wrong stop rule: the unsure token itself is not proposed
    log_q = w.gather(-1, j[..., None])[..., 0] - torch.logsumexp(w, -1)
    g = j.shape[1]
    return torch.where(log_q < np.log(stop_below), torch.arange(g), g).min(1).values


@pytest.mark.parametrize("stop_below, rule", [(0.0, None), (0.03, None), (0.03, drop_unsure_token)])
def test_sampled_tokens_follow_the_target_with_the_head(target, monkeypatch, stop_below, rule):
    """T = 0.7, top-p 0.9: the first two emitted tokens' joint law is the target's own; with the dynamic
    draft length (stop after a token of q < 0.03: about 37% of the rows propose 1 token, the rest 2) too.
    The wrong rule, which drops the unsure token instead (its own draw decides whether it is verified),
    is caught (the first token's law: p ~ 1e-43 at 3000 rows, so 600 rows suffice)."""
    from flashspec_torch import heads
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.heads import HeadDraft
    from flashspec_torch.reference import log_probs

    if rule is not None:
        monkeypatch.setattr(heads, "confident_lengths", rule)
    sampling, prompt, n = SamplingConfig(0.7, 0, 0.9), [5, 6, 7], 3000 if rule is None else 600
    head = random_head(target, token_ids=torch.arange(0, 97, 3), scale=0.1)
    draft = HeadDraft("head", head, target, stop_below=stop_below)
    lengths, propose = [], draft.propose

    def recorded(*args, **kwargs):
        proposal = propose(*args, **kwargs)
        lengths.append(proposal.lengths)
        return proposal

    draft.propose = recorded
    backend = TorchBackend(target, [draft])
    with torch.inference_mode():
        out, records = speculate(backend, Cycle([0]), [prompt] * n, sampling=sampling,
                                 spec=SpecConfig(gamma=2, max_new_tokens=2), seed=torch.arange(n))
        cache = target.new_cache(1, 8)
        z1 = target(torch.tensor([prompt]), torch.arange(3)[None], cache, 3, logits_last=1)[0, 0]
        p1 = log_probs(z1, sampling).exp().double()
        seqs = torch.tensor([prompt + [t] for t in range(97)])
        z2 = target(seqs, torch.arange(4)[None].expand(97, -1), target.new_cache(97, 8), 4, logits_last=1)[:, 0]
        p2 = log_probs(z2, sampling).exp().double()
    joint = (p1[:, None] * p2).numpy()  # [first, second]
    counts = np.zeros_like(joint)
    for row in out:
        counts[row[0], row[1]] += 1
    _, p_value, note = chi_square_test(counts, joint)
    _, p_first, note_first = chi_square_test(counts.sum(1), joint.sum(1))
    assert sum(r.accepted for r in records) > 0.05 * sum(r.drafted for r in records)
    if stop_below:
        assert 0.2 < float((lengths[0] < 2).float().mean()) < 0.8  # both lengths are common
    assert (min(p_value, p_first) > 1e-3) == (rule is None), (note, note_first)


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (4, 1.0), (0, 0.9), (60, 0.8)])
def test_drafting_over_the_head_vocabulary_draws_what_the_full_row_draws(target, top_k, top_p):
    """The head samples over its V_d ids with the DRAFT noise at those ids: the same tokens and log q
    as ``sample`` over the full row (OUTSIDE elsewhere), at every draft position and per-row seed."""
    from flashspec_torch.sampling import draft_gumbel, sample, sample_gumbel

    head = random_head(target, token_ids=torch.arange(1, 97, 2))
    ids, cfg, b, gamma = head.token_ids, SamplingConfig(0.7, top_k, top_p), 64, 3
    torch.manual_seed(2)
    w = torch.randn(b, gamma, len(ids)) * 3  # [B, G, V_d]
    full = head.full_logits(w)  # [B, G, V]
    assert full.shape == (b, gamma, 97) and bool((full[..., 0] == -1e30).all())
    seed, offset = torch.arange(b) * 7919 + 3, torch.tensor(11)
    noise = draft_gumbel(seed, offset, b, gamma, ids)
    for i in range(gamma):
        want_x, want_lq = sample(full[:, i], cfg, seed, offset, position=i)
        j, lq = sample_gumbel(w[:, i], cfg, noise[:, i])
        assert torch.equal(ids[j], want_x)
        torch.testing.assert_close(lq, want_lq, rtol=1e-5, atol=1e-5)


def test_the_learning_rate_anneals_over_steps_or_seconds_whichever_ends_first():
    from flashspec_torch.head_train import TrainConfig, lr_scale

    by_steps = TrainConfig(steps=100, warmup=10)
    by_time = TrainConfig(steps=100, warmup=10, seconds=10.0)
    assert lr_scale(0, 0.0, by_steps) == pytest.approx(0.1)
    assert lr_scale(50, 9.0, by_steps) == pytest.approx(0.5)  # no time budget: steps alone
    assert lr_scale(20, 5.0, by_time) == pytest.approx(0.5)  # half the seconds spent, a fifth of the steps
    assert lr_scale(20, 10.0, by_time) == pytest.approx(0.0, abs=1e-12)  # the time budget is the run's end
    assert lr_scale(99, 1.0, by_time) == pytest.approx(0.5 * (1 + np.cos(np.pi * 0.99)))


def test_training_lowers_the_loss_and_the_file_round_trips(target, tmp_path):
    from flashspec.head_corpus import Prompt
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.head_train import TrainConfig, frequent_tokens, generate_sequences, train_head
    from flashspec_torch.heads import HeadDraft, load_head, save_head

    prompts = [Prompt("code", "f", bytes([i % 90 + 1, i % 7 + 1]).decode()) for i in range(24)]
    cfg = TrainConfig(new_tokens=16, gen_batch=24, batch=8, steps=16, lr=3e-3, warmup=2, vocab=64, passes=2)
    seqs = generate_sequences(target, prompts, lambda p: list(p.text.encode()), cfg)
    ids = frequent_tokens(seqs, 64, 97)
    head, hist = train_head(target, seqs, cfg, ids, log_every=1)
    assert np.mean(hist.loss[-4:]) < np.mean(hist.loss[:2]) - 0.15  # nats; the floor is the target's entropy
    path = save_head(head, tmp_path / "h" / "head.safetensors", target_name="tiny", dtype=torch.float32)
    again, meta = load_head(tmp_path / "h", target.config)
    assert meta["target_name"] == "tiny" and again.feature_layers == head.feature_layers
    for (k, a), (_, b) in zip(head.state_dict().items(), again.state_dict().items()):
        torch.testing.assert_close(a, b, msg=k)
    assert path.stat().st_size < 2**20
    TorchBackend(target, [HeadDraft("head", again, target)])  # loads as a draft
    with pytest.raises(ValueError, match="held-out"):
        train_head(target, [type(seqs[0])("code", True, [1, 2, 3], 1)], cfg)


def test_bad_heads_are_refused(target, tmp_path):
    from dataclasses import replace

    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.heads import DraftHead, HeadDraft, load_draft_head, load_head, save_head

    with pytest.raises(ValueError, match="feature_layers"):
        DraftHead(CFG, (0, 3))
    with pytest.raises(ValueError, match="token_ids"):
        DraftHead(CFG, (2,), torch.tensor([1, 1]))
    save_head(random_head(target), tmp_path / "head.safetensors", target_name="tiny")
    with pytest.raises(ValueError, match="hidden_size=64, but this target has 32"):
        load_head(tmp_path, replace(CFG, hidden_size=32, head_dim=8))
    with pytest.raises(FileNotFoundError, match="train-head"):
        load_head(tmp_path / "nothing", CFG)
    with pytest.raises(ValueError, match="different target layers"):
        TorchBackend(target, [HeadDraft("a", random_head(target, (0,)), target), HeadDraft("b", random_head(target, (1,)), target)])
    from flashspec.drafts import SHIPPED_HEAD

    if not SHIPPED_HEAD.is_file():
        with pytest.raises(ValueError, match="no trained head ships"):
            load_draft_head("head", "", target)


def test_stop_below_must_be_a_probability(target):
    from flashspec_torch.drafts import ModelDraft
    from flashspec_torch.heads import HeadDraft

    for bad in (1.0, -0.1, True, "0.5"):
        with pytest.raises(ValueError, match="stop_below"):
            HeadDraft("head", random_head(target), target, stop_below=bad)
        with pytest.raises(ValueError, match="stop_below"):
            ModelDraft("self", target, stop_below=bad)


def record_proposals(draft):
    """Wrap ``draft.propose`` to keep every Proposal it returns (a list)."""
    seen, propose = [], draft.propose

    def recorded(*args, **kwargs):
        seen.append(propose(*args, **kwargs))
        return seen[-1]

    draft.propose = recorded
    return seen


def test_a_head_truncated_to_its_top_n_tokens_drafts_inside_them_with_q_summing_to_1(target, tmp_path):
    """save_head(counts=) stores the vocabulary most frequent first; load_head(top=N) keeps the N most
    frequent (ties by lower id), the same weights; drafting at T = 0.8 then proposes only those N and
    q (the full row the verifier sees) sums to 1 over them, 0 elsewhere."""
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.heads import HeadDraft, load_draft_head, load_head, save_head

    head = random_head(target, token_ids=torch.arange(1, 97, 2))  # 48 odd ids
    counts = torch.zeros(97, dtype=torch.int64)
    counts[torch.arange(1, 97, 2)] = torch.tensor([(7 * i) % 13 for i in range(48)])  # many ties
    save_head(head, tmp_path / "head.safetensors", target_name="tiny", dtype=torch.float32, counts=counts)
    from safetensors.torch import load_file

    stored = load_file(str(tmp_path / "head.safetensors"))
    assert stored["token_counts"].tolist() == sorted(stored["token_counts"].tolist(), reverse=True)
    top, _ = load_head(tmp_path, target.config, top=10)
    want = sorted(range(1, 97, 2), key=lambda t: (-int(counts[t]), t))[:10]
    assert top.token_ids.tolist() == sorted(want)
    assert load_draft_head("head@10", str(tmp_path), target, 10).head.token_ids.tolist() == sorted(want)  # head:DIR@10
    whole, _ = load_head(tmp_path, target.config)  # without top: the head as trained
    assert torch.equal(whole.token_ids, head.token_ids) and torch.equal(whole.fc_in.weight, top.fc_in.weight)
    draft = HeadDraft("head", top, target)
    seen = record_proposals(draft)
    with torch.inference_mode():
        speculate(TorchBackend(target, [draft]), Cycle([0]), [[5, 6, 7], [9, 8]], sampling=SamplingConfig(0.8),
                  spec=SpecConfig(gamma=3, max_new_tokens=8), seed=torch.arange(2))
    inside = torch.zeros(97, dtype=torch.bool)
    inside[want] = True
    for p in seen:
        assert bool(inside[p.tokens].all())
        q = (p.logits / 0.8).softmax(-1)  # [B, G, V]
        torch.testing.assert_close(q.sum(-1), torch.ones(q.shape[:2]))
        assert float(q[..., ~inside].max()) == 0.0
    with pytest.raises(ValueError, match=r"top=49 must be in \[1, 48\]"):
        load_head(tmp_path, target.config, top=49)


def test_a_head_file_sorted_by_id_loads_and_drafts_as_before(target, tmp_path):
    """The first format (token_ids sorted by id, no counts: the shipped head's) loads unchanged and
    proposes what the head it was saved from proposes; top=N is refused for it, naming the fix."""
    from flashspec_torch.backend import TorchBackend
    from flashspec_torch.heads import HeadDraft, load_head, save_head

    head = random_head(target, token_ids=torch.arange(0, 97, 3))
    save_head(head, tmp_path / "head.safetensors", target_name="tiny", dtype=torch.float32)
    again, _ = load_head(tmp_path, target.config)
    runs = []
    for h in (head, again):
        draft = HeadDraft("head", h, target)
        runs.append(record_proposals(draft))
        with torch.inference_mode():
            speculate(TorchBackend(target, [draft]), Cycle([0]), [[5, 6, 7]], sampling=SamplingConfig(0.8),
                      spec=SpecConfig(gamma=3, max_new_tokens=9), seed=torch.arange(1))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    with pytest.raises(ValueError, match="sorted by id, not by frequency; retrain"):
        load_head(tmp_path, target.config, top=8)


def test_recipe_options_greedy_continuations_decay_and_coverage(target):
    """TrainConfig.greedy adds one greedy continuation per prompt (plain greedy decoding's); pass k's
    loss weight is decay**k; data_stats' coverage of the top N counts the held-out continuation
    tokens inside the N most frequent; bad decay is refused by name."""
    from flashspec.head_corpus import Prompt
    from flashspec_torch.head_job import data_stats
    from flashspec_torch.head_train import (Sequence, TrainConfig, frequent_tokens, generate_sequences, head_loss,
                                            target_pass, ttt_states)

    prompts = [Prompt("code", "f", t) for t in ("\x05\x06", "\x07\x08\x09")]
    cfg = TrainConfig(new_tokens=6, gen_batch=2, greedy=True, decay=0.5)
    enc = lambda p: list(p.text.encode())  # noqa: E731
    greedy = generate_sequences(target, prompts, enc, cfg, greedy=True)
    with torch.inference_mode():
        from flashspec_torch.backend import TorchBackend

        plain, _ = decode(TorchBackend(target, []), [enc(p) for p in prompts], sampling=SamplingConfig(0.0), max_new_tokens=6)
    assert [s.tokens[s.prompt_len :] for s in greedy] == plain
    head = random_head(target, token_ids=frequent_tokens(greedy, 40, 97))
    from flashspec_torch.head_train import for_training

    head = for_training(head, target)
    tokens = torch.tensor([greedy[0].tokens])
    z, feats = target_pass(target, tokens, head.feature_layers)
    states = ttt_states(head, target, tokens, feats.float(), 3)
    total, per = head_loss(head, states, z, torch.tensor([tokens.shape[1]]), 0.5)
    torch.testing.assert_close(total, per[0] + 0.5 * per[1] + 0.25 * per[2])
    held = [Sequence("code", True, [1, 2, 3, 4, 5, 6], 2)]  # continuation 3, 4, 5, 6
    stats = data_stats(greedy, held, torch.tensor([4, 3, 9, 5] + list(range(10, 2100))), 2200)
    assert stats["held_out_coverage_by_top_n"] == {2048: 0.75}  # 4, 3, 5 among the top; 6 is not in the vocabulary
    for bad in (0.0, 1.5):
        with pytest.raises(ValueError, match="decay"):
            TrainConfig(decay=bad)


def test_train_head_cli_flags_are_the_train_config_fields(monkeypatch):
    from flashspec import cli
    from flashspec_torch import head_job

    got = {}
    monkeypatch.setattr(head_job, "run_train_head", lambda out, cfg, **kw: got.update(cfg=cfg, out=out))
    args = cli.build_parser().parse_args(["train-head", "--out", "d", "--greedy", "--decay", "0.6", "--warmup", "7",
                                          "--passes", "4", "--batch", "64", "--samples", "3", "--lr", "0.002",
                                          "--init", "shipped", "--gen-seconds", "90"])
    assert args.run(args) == 0
    c = got["cfg"]
    assert (c.greedy, c.decay, c.warmup, c.passes, c.batch, c.samples, c.lr) == (True, 0.6, 7, 4, 64, 3, 0.002)
    assert (c.init, c.gen_seconds) == ("shipped", 90.0)
    args = cli.build_parser().parse_args(["train-head", "--out", "d"])
    args.run(args)
    assert got["cfg"].greedy is False and got["cfg"].decay == 0.8 and got["cfg"].init is None


def test_the_gpu_scripts_verdict_compares_tokens_per_step_per_domain():
    from benchmark_modules import load_benchmark

    s = load_benchmark("train_head_gpu")
    assert s.expected_tokens_per_step([0.5, 0.5], 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)  # the last repeats
    acc = lambda a: {"greedy": a, "sampled": a}  # noqa: E731
    report = {"held_out_acceptance": {"code": acc([0.7, 0.6]), "chat": acc([0.4, 0.4])},
              "compare": {"baseline": {"code": acc([0.6, 0.6]), "chat": {"greedy": [0.5, 0.5], "sampled": [0.3, 0.3]}}}}
    cell = {"cells": {"head G=4": {"emitted_per_step": 2.5, "speedup": 1.3}}}
    v = s.verdict(report, {"new": {"code T=0.0": cell}})
    assert v["code"]["better"] == "new" and v["chat"]["better"] == "mixed"
    assert v["code"]["engine_new_T0.0"] == {"tokens_per_step": 2.5, "speedup": 1.3} and "engine_new_T0.7" not in v["code"]
    report.update(head_bytes=1, init=None)
    hist = {"loss": [10.0] * 5 + [8.0] * 5}
    assert not s.checks(report, hist, {})["loss_fell"]  # a new head must lose 30% of its start
    assert s.checks(dict(report, init="shipped"), hist, {})["loss_fell"]  # a continued one anything


def test_train_head_job_writes_a_frequency_ordered_head_and_measures_it_against_another(tmp_path):
    """``run_train_head`` end to end on a tiny target with a character tokenizer: sampled and greedy
    continuations, the head saved most frequent first, its held-out acceptance whole and over its top
    N, another head's on the same sequences, throughput and coverage in report.json."""
    import json
    from dataclasses import replace

    from char_tokenizer import VOCAB, CharTokenizer
    from flashspec_torch.head_job import run_train_head
    from flashspec_torch.head_train import TrainConfig
    from flashspec_torch.heads import load_head, save_head
    from flashspec_torch.model import Llama
    from flashspec_torch.weights import LoadedModel

    torch.manual_seed(0)
    model = Llama(replace(CFG, vocab_size=VOCAB, max_position_embeddings=640)).eval().requires_grad_(False)
    other = save_head(random_head(model, layers=(0, 2)), tmp_path / "other" / "head.safetensors", target_name="tiny")
    cfg = TrainConfig(new_tokens=4, gen_batch=8, batch=2, steps=2, warmup=1, vocab=40, passes=2, greedy=True)
    report = run_train_head(tmp_path / "new", cfg, target=LoadedModel(model, CharTokenizer(), "tiny"), train_per_domain=1,
                            eval_per_domain=1, device="cpu", compare={"other": other}, tops=(16, 64), log=lambda s: None)
    assert report["data"]["train_sequences"] == {"code": 2, "prose": 2, "chat": 2}  # 1 sampled + 1 greedy each
    assert report["data"]["train_prompts"] == {"code": 1, "prose": 1, "chat": 1} and report["init"] is None
    assert 0 < report["generation"]["tokens"] <= 4 * (6 + 3) and report["generation"]["tokens_per_s"] > 0
    assert set(report["held_out_acceptance_top_n"]) == {16} and set(report["compare"]) == {"other"}
    for acc in (report["held_out_acceptance"], report["held_out_acceptance_top_n"][16], report["compare"]["other"]):
        assert set(acc) == {"code", "prose", "chat"} and all(len(a["greedy"]) == 2 for a in acc.values())
    assert report["throughput"]["tokens_per_s"] > 0 and set(report["data"]["held_out_coverage_by_top_n"]) == set()
    assert json.loads((tmp_path / "new" / "report.json").read_text())["steps_done"] == 2
    head, _ = load_head(tmp_path / "new", model.config, top=16)
    assert len(head.token_ids) == 16


def test_the_engines_default_dynamic_length_is_for_heads_on_the_cpu(target):
    """``Engine(stop_below=None)``: a draft head stops early on the CPU (where it shortens the scoring pass), never on
    a GPU (a graphed step has G + 1 positions anyway), and a model draft keeps G tokens."""
    from flashspec_torch.drafts import ModelDraft
    from flashspec_torch.engine import HEAD_STOP_BELOW_CPU, default_stop_below
    from flashspec_torch.heads import HeadDraft

    head = HeadDraft("head", random_head(target), target)
    assert 0 < default_stop_below(head, torch.device("cpu")) == HEAD_STOP_BELOW_CPU < 1
    assert default_stop_below(head, torch.device("cuda")) == 0.0
    assert default_stop_below(ModelDraft("model", target), torch.device("cpu")) == 0.0
