"""The model shapes the torch backend's Triton kernels take, checked once when a model is built (``Llama``).

Every kernel takes any head_dim, hidden and intermediate width and vocabulary: blocks are padded to the next
power of two with masked loads and stores, or the dimension is walked in chunks. What remains are two bounds,
both far beyond today's models: add + RMSNorm holds a whole row of the residual stream in one block (compiled
for sm_90 up to 65536 columns), and vocabulary indices are int32 (``flashspec.contract.MAX_VOCAB``). head_dim
must be even (RoPE), which ``LlamaConfig`` checks itself; the attention kernel serves head_dim <= 256 and SDPA
the rest.
"""

from __future__ import annotations

from flashspec.contract import check_vocab

MAX_HIDDEN = 1 << 16


def check_shapes(config) -> None:  # config: a LlamaConfig
    """A ValueError naming the field and the supported values for a model shape the kernels cannot run."""
    if config.hidden_size > MAX_HIDDEN:
        raise ValueError(f"hidden_size={config.hidden_size} is not supported: the fused add + RMSNorm kernel holds a "
                         f"row in one block, hidden_size <= {MAX_HIDDEN}")
    check_vocab(config.vocab_size)
