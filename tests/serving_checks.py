"""Shared by the torch and JAX serving tests (no backend imported): the character tokenizer of
tests/char_tokenizer.py, and a completion plus a stream through the HTTP app in process."""

import json

from char_tokenizer import VOCAB, CharTokenizer  # noqa: F401  (re-exported for the serving tests)


def complete_and_stream(client) -> str:
    """A greedy 3-token completion of "abc", then the same streamed with usage (FastAPI's TestClient):
    both answered, the stream ending in usage and [DONE] with the completion's text. Returns the text."""
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text
    body = {"prompt": "abc", "max_tokens": 3, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=body) as s:
        data = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]" and json.loads(data[-2])["usage"]["completion_tokens"] == 3
    text = r.json()["choices"][0]["text"]
    assert "".join(json.loads(d)["choices"][0]["text"] for d in data[:-2]) == text
    return text
