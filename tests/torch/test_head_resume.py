"""Continuing a saved draft head (``TrainConfig.init``, ``flashspec train-head --init``) and the
bounded data generation, on a tiny random target."""

import pytest
import torch

from flashspec.config import LlamaConfig
from flashspec.head_corpus import Prompt

CFG = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=3, num_heads=2, num_kv_heads=1,
                  head_dim=16, max_position_embeddings=256)


def tiny_target(seed: int):
    from flashspec_torch.model import Llama

    torch.manual_seed(seed)
    m = Llama(CFG).eval().requires_grad_(False)
    for p in m.parameters():
        p.data.normal_(0, 0.3)
    return m


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(target, its training sequences, the config, a head trained 6 steps and saved, its history)."""
    from flashspec_torch.head_train import TrainConfig, frequent_tokens, generate_sequences, train_head
    from flashspec_torch.heads import save_head

    target = tiny_target(0)
    prompts = [Prompt("code", "f", bytes([i % 90 + 1, i % 7 + 1]).decode()) for i in range(16)]
    cfg = TrainConfig(new_tokens=12, gen_batch=16, batch=8, steps=6, lr=1e-2, warmup=2, vocab=48, passes=2)
    seqs = generate_sequences(target, prompts, lambda p: list(p.text.encode()), cfg)
    head, hist = train_head(target, seqs, cfg, frequent_tokens(seqs, 48, 97), log_every=1)
    path = save_head(head, tmp_path_factory.mktemp("h") / "head.safetensors", target_name="tiny", dtype=torch.float32,
                     extra={"fingerprint": __import__("flashspec_torch.heads").heads.fingerprint(target)})
    return target, seqs, cfg, path, hist


def test_a_resumed_head_starts_where_the_saved_one_ended(trained):
    """The first step of a run with ``init`` sees the saved head (its loss is the saved head's, far
    below a new head's first loss); the vocabulary and feature layers are the saved head's."""
    from dataclasses import replace

    from flashspec_torch.head_train import train_head
    from flashspec_torch.heads import load_head

    target, seqs, cfg, path, first = trained
    cont = replace(cfg, init=str(path.parent), steps=1, lr=1e-9)
    saved, _ = load_head(path, target.config)
    ids = saved.token_ids
    head, hist = train_head(target, seqs, cont, log_every=1)
    _, fresh = train_head(target, seqs, replace(cfg, steps=1, lr=1e-9), ids, log_every=1)
    assert fresh.loss[0] == pytest.approx(first.loss[0])  # a new head: the same batch and weights as the first run's
    assert hist.loss[0] < fresh.loss[0] - 0.05
    assert head.feature_layers == saved.feature_layers and torch.equal(head.token_ids, saved.token_ids)
    for (k, a), (_, b) in zip(head.state_dict().items(), saved.state_dict().items()):
        torch.testing.assert_close(a.cpu(), b, msg=k, atol=1e-6, rtol=0)  # lr 1e-9: one step moves nothing


def test_resuming_a_head_that_does_not_fit_is_refused_with_the_fix(trained):
    from dataclasses import replace

    from flashspec_torch.head_train import TrainConfig, train_head

    target, seqs, cfg, path, _ = trained
    cont = replace(cfg, init=str(path.parent), steps=1)
    with pytest.raises(ValueError, match=r"reads layers \(1, 2\): drop feature_layers"):
        train_head(target, seqs, replace(cont, feature_layers=(0,)))
    with pytest.raises(ValueError, match="has 48 tokens: pass vocab=48"):
        train_head(target, seqs, replace(cont, vocab=64))
    with pytest.raises(ValueError, match="token_ids differ"):
        train_head(target, seqs, cont, torch.arange(48))
    other = tiny_target(1)
    other.embed.weight.mul_(2)  # same shape, other weights (the fingerprint is the mean |embedding|)
    with pytest.raises(ValueError, match="drop init"):
        train_head(other, seqs, cont)
    with pytest.raises(FileNotFoundError, match="no draft head"):
        train_head(target, seqs, replace(cont, init=str(path.parent / "missing")))
    with pytest.raises(ValueError, match="init=''"):
        TrainConfig(init="")
    with pytest.raises(ValueError, match="both head and token_ids"):
        train_head(target, seqs, cfg, torch.arange(48), head=random_head(target))


def random_head(target):
    from flashspec_torch.head_train import TrainConfig, initial_head

    return initial_head(target, TrainConfig(vocab=48), torch.arange(48))


def test_the_train_head_job_reads_the_init_head_once_and_refuses_a_misfit_before_generating(trained, monkeypatch, tmp_path):
    """``run_train_head`` with ``init``: the head file is loaded once (checked before any data is
    generated, then trained), and a head that does not fit is refused before ``make_data`` runs."""
    from dataclasses import replace

    from flashspec_torch import head_job, head_train
    from flashspec_torch.weights import LoadedModel

    target, seqs, cfg, path, _ = trained
    loads, made = [], []
    real = head_train.load_head
    monkeypatch.setattr(head_train, "load_head", lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    held = [replace(s, held_out=True) for s in seqs[:2]]
    monkeypatch.setattr(head_job, "make_data", lambda *a: made.append(1) or (seqs, held))
    loaded = LoadedModel(target, object(), "tiny")
    cont = replace(cfg, init=str(path.parent), steps=1)
    with pytest.raises(ValueError, match="pass vocab=48"):
        head_job.run_train_head(tmp_path / "bad", replace(cont, vocab=64), target=loaded, device="cpu", log=lambda s: None)
    assert made == [] and len(loads) == 1
    loads.clear()
    report = head_job.run_train_head(tmp_path / "ok", cont, target=loaded, device="cpu", log=lambda s: None)
    assert made == [1] and len(loads) == 1 and report["init"] == str(path.parent) and report["head_vocab"] == 48


def test_generation_stops_at_its_deadline():
    import time

    from flashspec_torch.head_train import TrainConfig, generate_sequences

    target = tiny_target(0)
    prompts = [Prompt("code", "f", "\x05\x06")] * 3
    cfg = TrainConfig(new_tokens=2, gen_batch=1)
    enc = lambda p: list(p.text.encode())  # noqa: E731
    assert generate_sequences(target, prompts, enc, cfg, deadline=time.perf_counter() - 1) == []
    assert len(generate_sequences(target, prompts, enc, cfg, deadline=time.perf_counter() + 60)) == 3


def test_make_data_generates_held_out_then_greedy_then_sampled_within_gen_seconds(monkeypatch):
    """Held-out continuations first, without a deadline; then the greedy ones within 1 / (samples + 1)
    of ``gen_seconds``; then the sampled ones within the rest; training prompts of every domain mixed."""
    import time
    from types import SimpleNamespace

    from flashspec_torch import head_job
    from flashspec_torch.head_train import TrainConfig

    calls = []
    monkeypatch.setattr(head_job, "generate_sequences", lambda m, prompts, enc, cfg, eos, greedy=False, deadline=None:
                        calls.append((greedy, deadline, prompts)) or [])
    model = SimpleNamespace(config=SimpleNamespace(eos_token_ids=()))
    t0 = time.perf_counter()
    head_job.make_data(model, None, TrainConfig(samples=2, greedy=True, gen_seconds=30.0), 50, 4, lambda s: None)
    (held, g0, p0), (greedy, g1, p1), (sampled, g2, p2) = calls
    assert g0 is None and not held and all(p.held_out for p in p0) and len(p0) == 12
    assert greedy and t0 + 10 <= g1 <= time.perf_counter() + 10 and len(p1) == 150
    assert not sampled and t0 + 30 <= g2 <= time.perf_counter() + 30 and p2 == p1 * 2
    assert len({p.domain for p in p1[:20]}) == 3  # shuffled across domains
