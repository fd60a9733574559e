"""Every config field of flashspec.families.GUARDS at its non-default value: FlashSpec either gives
transformers' logits (the row says "implemented") or refuses the config naming the field ("refused").
Plus the guards that need no model: unknown fields, unused weights, unsupported model types."""

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from flashspec.config import LlamaConfig  # noqa: E402
from flashspec.family_cases import CASES, hf_model  # noqa: E402
from flashspec.families import GUARDS  # noqa: E402
from flashspec.weights import convert_state_dict  # noqa: E402
from flashspec_torch.weights import from_transformers  # noqa: E402

IDS = torch.randint(0, 256, (2, 48), generator=torch.Generator().manual_seed(0))  # past the 16-token windows


def field_error(model_type: str, field: str, value) -> float:
    """Max |logits - transformers'| of the family's tiny case with ``field`` = ``value``."""
    fields = {field: value}
    if field == "use_sliding_window":
        fields.update(sliding_window=8, max_window_layers=1)  # layer 1 slides
    if field == "rope_parameters" and value.get("rope_type") in ("longrope",):
        fields["max_position_embeddings"] = 256  # factor 4 over the original 64
    hf = hf_model(model_type, seed=1, **fields)
    ours = from_transformers(hf).model
    t = IDS.shape[1]
    with torch.no_grad():
        want = hf(IDS).logits
        got = ours(IDS, torch.arange(t).expand(2, -1), ours.new_cache(2, t), t)
    return (got - want).abs().max().item()


@pytest.mark.parametrize("model_type,field,value,outcome", GUARDS, ids=[f"{m}-{f}-{o}" for m, f, _, o in GUARDS])
def test_each_field_is_implemented_or_refused(model_type, field, value, outcome):
    if outcome == "implemented":
        assert field_error(model_type, field, value) < 1e-4
    else:
        config = {**hf_model(model_type).config.to_dict(), field: value}
        with pytest.raises(ValueError, match=field):
            LlamaConfig.from_hf(config)


def test_the_guard_cases_change_the_model():
    """The implemented rows are not vacuous: each changes transformers' logits (so dropping it fails the test)."""
    base = {m: hf_model(m, seed=1)(IDS).logits for m in {m for m, *_ in GUARDS}}
    for model_type, field, value, outcome in GUARDS:
        if outcome != "implemented" or field == "rms_norm_eps":
            continue
        fields = {field: value, **({"sliding_window": 8, "max_window_layers": 1} if field == "use_sliding_window" else {})}
        if field == "rope_parameters" and value.get("rope_type") == "longrope":
            fields["max_position_embeddings"] = 256
        with torch.no_grad():
            changed = hf_model(model_type, seed=1, **fields)(IDS).logits
        if changed.shape == base[model_type].shape:
            assert (changed - base[model_type]).abs().max() > 1e-3, (model_type, field, value)


def test_every_family_reads():
    for model_type in CASES:
        LlamaConfig.from_hf(hf_model(model_type).config)


def test_unknown_fields_and_types_are_refused():
    config = hf_model("llama").config.to_dict()
    with pytest.raises(ValueError, match="use_new_trick=True"):
        LlamaConfig.from_hf({**config, "use_new_trick": True})
    with pytest.raises(ValueError, match="model_type='gpt2' is not supported"):
        LlamaConfig.from_hf({**config, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="gemma3_text"):
        LlamaConfig.from_hf({**config, "model_type": "gemma3"})


def test_weights_the_config_does_not_use_are_refused():
    """The issue's silent failure: a checkpoint with biases whose config.json says none."""
    hf = hf_model("qwen2")
    state = {k: v.numpy() for k, v in hf.state_dict().items()}
    config = LlamaConfig.from_hf({**hf.config.to_dict(), "model_type": "llama"})  # Llama: no biases
    with pytest.raises(ValueError, match="q_proj.bias"):
        convert_state_dict(state, config)
    assert np.isfinite(convert_state_dict(state, LlamaConfig.from_hf(hf.config))["layers.0.qkv.bias"]).all()


def test_gpu_kernels_are_not_asked_for_family_features():
    """A family feature the Triton layer kernels lack: the plain torch layers run the model, and
    asking for the kernels or the fused products is refused."""
    ours = from_transformers(hf_model("qwen3")).model
    assert ours.config.kernel_blockers == ("qk_norm",)
    assert ours.decode_settings(torch.device("cuda")) == ("reference", False, frozenset(), 1)
    ours.linear_impl = "fused"
    with pytest.raises(ValueError, match="qk_norm"):
        ours.decode_settings(torch.device("cuda"))
    ours.linear_impl, ours.impl = None, "triton"
    with pytest.raises(ValueError, match="qk_norm"):
        ours(IDS[:, :4], torch.arange(4).expand(2, -1), ours.new_cache(2, 4), 4)
