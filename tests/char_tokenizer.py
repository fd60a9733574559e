"""A character tokenizer for tiny random targets of 64 tokens (no torch, no JAX: both backends' tests use it)."""

VOCAB = 64


class CharTokenizer:
    """Just what Engine uses of a transformers tokenizer: ids 4..63 for printable characters."""

    chat_template = None

    def __call__(self, text: str) -> dict:
        return {"input_ids": [4 + (ord(c) - 32) % (VOCAB - 4) for c in text]}

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False) -> str:
        return "".join(chr(32 + (i - 4) % (VOCAB - 4)) for i in ids if i >= 4)
