"""The HTTP app in process (FastAPI's TestClient) over a tiny random model: a full queue answers 429
with OpenAI's error body, and a completion and a stream still work."""

import pytest

pytest.importorskip("fastapi")

from fault_helpers import tiny_target
from serving_checks import complete_and_stream

from flashspec.server.app import create_app
from flashspec.server.metrics import Metrics
from flashspec.serving import Service


def app_with(max_queue: int):
    from flashspec_torch.engine import Engine

    eng = Engine(tiny_target(seed=2), ("ngram",), policy="fixed", device="cpu")
    metrics = Metrics("tiny", ["ngram"], 2)
    service = Service(eng, max_batch=2, max_queue=max_queue, context=64, gamma=3, observer=metrics)
    return create_app(service, metrics, drain_timeout=1)


def test_a_full_queue_answers_429_and_requests_are_served():
    from fastapi.testclient import TestClient

    with TestClient(app_with(max_queue=0)) as client:
        r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 3})
        assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full", r.text
    with TestClient(app_with(max_queue=4)) as client:
        complete_and_stream(client)
        metrics = client.get("/metrics").text
        assert 'vllm:request_success_total{finished_reason="length",model_name="tiny"} 2.0' in metrics
