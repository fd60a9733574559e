"""Each supported family as a JAX target against transformers (tiny random models saved by
transformers, flashspec.family_cases): fp32 logits within 1e-4, greedy 64 tokens identical, with
and without speculation (n-gram draft). Four families, which between them take every family path of
the Flax model (biases, q/k norms, sliding windows with their own RoPE, soft-capping, Gemma's norms and
scaled embeddings, GELU); Llama, Mistral and Phi-3 differ from them only in the core's conversion and RoPE
tables, tested through the torch engine (tests/torch/test_families.py) and shown for JAX in the README's
family table (benchmarks/families_table.py)."""

import pytest

pytest.importorskip("jax")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from flashspec.family_cases import parity, save_case  # noqa: E402

JAX_CASES = ("qwen2", "qwen3", "gemma2", "gemma3_text")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {m: (root / m, save_case(m, root / m)) for m in JAX_CASES}


@pytest.mark.parametrize("model_type", JAX_CASES)
def test_family_matches_transformers(saved, model_type):
    path, hf = saved[model_type]
    row = parity(model_type, "jax", path, hf)
    assert row["logits_max_error"] < 1e-4, row
    assert row["greedy_identical"] and row["speculation_identical"], row


def test_the_same_draft_names_as_torch(saved):
    """layerskip without layers works on JAX too; nf4 is refused with a message true for JAX; the
    shipped head is refused for a target it was not trained for."""
    from flashspec_jax.engine import Engine

    path, _ = saved["qwen3"]
    assert Engine(str(path), ("layerskip",), device="cpu").backend.draft_names == ["layerskip"]
    with pytest.raises(ValueError, match="builds ngram, layerskip, self, head, path drafts; use --backend torch"):
        Engine(str(path), ("nf4",), device="cpu")
    from flashspec.drafts import SHIPPED_HEAD

    if SHIPPED_HEAD.is_file():
        with pytest.raises(ValueError, match="trained for a target with .*train a head for it"):
            Engine(str(path), ("head",), device="cpu")
