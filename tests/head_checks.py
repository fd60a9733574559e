"""The draft head's engine-level checks, shared by the torch and JAX engine tests."""

import numpy as np

from flashspec.testing import chi_square_test


def check_greedy_equals_plain(engine, prompts, *, gamma: int = 4, max_new_tokens: int = 12) -> dict:
    """Greedy speculation's tokens == greedy plain decoding's, prompt by prompt; returns the speculative stats."""
    common = dict(temperature=0.0, max_new_tokens=max_new_tokens, chat=False)
    plain = engine.generate(prompts, speculation=False, **common)
    spec = engine.generate(prompts, speculation=True, gamma=gamma, **common)
    for prompt, a, b in zip(prompts, plain["tokens"], spec["tokens"]):
        assert a == b, f"{prompt!r}: head speculation {b} != plain {a}"
    return spec


def check_first_two_tokens(tokens, first: np.ndarray, p1: np.ndarray, p2: np.ndarray) -> None:
    """The first token's law and the first two tokens' joint law, chi-square against the target's
    p(t1) p(t2 | t1): ``first`` [F] the ids with p1 > 0, p1 [V], p2 [F, V] the law after each of them."""
    joint = p1[first][:, None] * p2  # [F, V]
    row = {int(t): i for i, t in enumerate(first)}
    counts = np.zeros_like(joint)
    for t1, t2 in (t[:2] for t in tokens):
        assert t1 in row, f"first token {t1} is outside the target's top-p nucleus"
        counts[row[t1], t2] += 1
    _, p_first, note_first = chi_square_test(counts.sum(1), joint.sum(1))
    _, p_joint, note_joint = chi_square_test(counts, joint)
    assert p_first > 1e-3, f"first token: {note_first}, p = {p_first:.2g}"
    assert p_joint > 1e-3, f"first two tokens: {note_joint}, p = {p_joint:.2g}"
