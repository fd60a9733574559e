"""``flashspec serve`` as a real subprocess on a free 127.0.0.1 port, with the embedded model on
the CPU, driven by the official ``openai`` client: completions, chat, streaming (chunks, [DONE],
include_usage), 16 concurrent streams each equal to the same request alone (fixed draft, same
seed), a client that disconnects mid-stream frees its slot, and 4xx answers after which the
server keeps serving. Every request is bounded in time; the server is killed at the end."""

import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("torch")

TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    argv = [sys.executable, "-m", "flashspec.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--device", "cpu", "--policy", "fixed", "--gamma", "3", "--max-batch", "16", "--context", "256",
            "--log-level", "warning"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the server exited ({proc.returncode}): {proc.stdout.read()}")
            try:
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("the server did not answer /health within 180 s")
            time.sleep(0.5)
        yield base, proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="none", timeout=TIMEOUT, max_retries=0)


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def metric(base: str, name: str, **labels) -> float:
    text = httpx.get(base + "/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^([^{\s]+)(\{[^}]*\})?\s+(\S+)$", line)
        if m and m.group(1) == name and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            total += float(m.group(3))
    return total


def test_completion_and_chat(client, model):
    out = client.completions.create(model=model, prompt="def fib(n):", max_tokens=6, temperature=0.0)
    assert out.choices[0].finish_reason in ("length", "stop") and out.choices[0].text
    assert out.usage.completion_tokens == 6 and out.usage.prompt_tokens > 0
    extra = out.model_extra["flashspec"]
    assert extra["steps"] >= 1 and extra["drafted"] == 3 * extra["steps"] and "ngram" in extra["arm_pulls"]
    chat = client.chat.completions.create(model=model, max_tokens=6, temperature=0.0, messages=[
        {"role": "system", "content": "You are brief."}, {"role": "user", "content": "Name a colour."}])
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content


def test_streaming_chunks_done_and_usage(server, client, model):
    chunks = list(client.chat.completions.create(model=model, max_tokens=6, temperature=0.0, stream=True,
                                                 stream_options={"include_usage": True},
                                                 messages=[{"role": "user", "content": "Say hi."}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text and chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    body = {"model": model, "prompt": "Once upon a time", "max_tokens": 4, "stream": True, "temperature": 0}
    with httpx.stream("POST", server[0] + "/v1/completions", json=body, timeout=TIMEOUT) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_sixteen_concurrent_streams_equal_each_alone(client, model, server):
    prompts = ["def fib(n):", "The capital of France is", "Roses are red,", "import numpy as np\n"]
    cases = [(prompts[i % 4], 100 + i) for i in range(16)]
    alone = [client.completions.create(model=model, prompt=p, max_tokens=5, temperature=0.8, seed=s).choices[0].text
             for p, s in cases]
    aclient = openai.AsyncOpenAI(base_url=server[0] + "/v1", api_key="none", timeout=TIMEOUT, max_retries=0)

    async def one(p, s):
        stream = await aclient.completions.create(model=model, prompt=p, max_tokens=5, temperature=0.8, seed=s,
                                                  stream=True)
        return "".join([c.choices[0].text async for c in stream if c.choices])

    async def all_of_them():
        return await asyncio.wait_for(asyncio.gather(*(one(p, s) for p, s in cases)), TIMEOUT)

    together = asyncio.run(all_of_them())
    assert together == alone
    assert len(set(alone[0::4])) > 1  # the seed matters: the test could fail


def test_a_client_that_disconnects_frees_its_slot(server, client, model):
    base = server[0]
    before = metric(base, "vllm:request_success_total", finished_reason="cancelled")
    body = {"model": model, "prompt": "1, 2, 3, 4, 5,", "max_tokens": 200, "stream": True, "temperature": 0}
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=TIMEOUT) as r:
        for line in r.iter_lines():
            assert line != "data: [DONE]", "the request ended before the client left"
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                break  # one token group arrived; leaving the block closes the connection
    deadline = time.monotonic() + 60
    while metric(base, "vllm:request_success_total", finished_reason="cancelled") < before + 1:
        assert time.monotonic() < deadline, "the disconnected request was not cancelled within 60 s"
        time.sleep(0.2)
    assert metric(base, "vllm:num_requests_running") == 0
    assert client.completions.create(model=model, prompt="Hi", max_tokens=2).choices[0].text is not None


@pytest.mark.parametrize("body,status,param", [
    ("{not json", 400, None),
    ({"model": "no-such-model", "prompt": "hi"}, 404, "model"),
    ({"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ({"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ({"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "hi", "n": 2}, 400, "n"),
    ({"prompt": "hi", "logprobs": 2}, 400, "logprobs"),
    ({"prompt": "hi " * 300, "max_tokens": 4}, 400, "prompt"),
    ({"prompt": "hi", "max_tokens": 300}, 400, "max_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "messages"),  # on /v1/completions
])
def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, client, model, body, status, param):
    data = body if isinstance(body, str) else json.dumps({"model": model, **body} if "model" not in body else body)
    r = httpx.post(server[0] + "/v1/completions", content=data, headers={"content-type": "application/json"},
                   timeout=TIMEOUT)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["message"] and error["param"] == param and error["type"]
    assert client.completions.create(model=model, prompt="Hi", max_tokens=1, temperature=0).choices[0].text is not None


def test_metrics_and_models(server, model):
    text = httpx.get(server[0] + "/metrics", timeout=10).text
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:spec_decode_num_drafts_total",
                 "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
                 "flashspec:draft_pulls_total", "flashspec:plain_steps_total", "flashspec:step_latency_seconds_bucket",
                 "vllm:time_to_first_token_seconds_bucket", "flashspec:slots_in_use"):
        assert name in text, name
    assert metric(server[0], "vllm:spec_decode_num_draft_tokens_total") > 0
    assert httpx.get(server[0] + "/v1/models", timeout=10).json()["data"][0]["id"] == model


def test_sigterm_drains_a_stream_in_flight(server, model):
    """Last in the file: it stops the server. SIGTERM mid-stream: the stream still ends with its
    finish_reason and [DONE], then the process exits (uvicorn re-raises the signal once shut down)."""
    base, proc = server
    body = {"model": model, "prompt": "Count to twenty:", "max_tokens": 12, "stream": True, "temperature": 0}
    lines = []
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=TIMEOUT) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line)
                if len(lines) == 1:
                    proc.send_signal(signal.SIGTERM)
    assert lines[-1] == "data: [DONE]"
    assert json.loads(lines[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert proc.wait(timeout=60) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal after its clean shutdown
