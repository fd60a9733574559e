"""benchmarks/serve_bench.py's load generator against the real HTTP app (uvicorn on 127.0.0.1, in a
thread) over a fake service that streams a few token groups: every request arrives on a connection
of its own. A kept-alive connection reused just as the server's keep-alive timer closes it is reset
with the request unread (httpx ``ReadError`` with an empty message, issue #34's two lost requests
at 256 streams), so the load generator must not reuse connections."""

import asyncio
import threading
import time
import types

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("sse_starlette")
httpx = pytest.importorskip("httpx")
uvicorn = pytest.importorskip("uvicorn")

from benchmark_modules import load_benchmark  # noqa: E402

from flashspec.server.app import create_app  # noqa: E402
from flashspec.server.metrics import Metrics  # noqa: E402
from flashspec.serving import Delta  # noqa: E402

GROUPS = 3


class FakeStream:
    """A request's deltas: GROUPS one-character groups, the last with finish_reason "length"."""

    def __init__(self):
        self.text, self.token_ids, self.finish_reason, self.stats, self.prompt_tokens = "", [], None, None, 1

    def cancel(self):
        self.finish_reason = self.finish_reason or "cancelled"

    async def __aiter__(self):
        for k in range(GROUPS):
            await asyncio.sleep(0.001)
            self.token_ids.append(k)
            self.text += "x"
            if k < GROUPS - 1:
                yield Delta("x", [k])
            else:
                self.finish_reason, self.stats = "length", {"completion_tokens": GROUPS}
                yield Delta("x", [k], "length", self.stats)


class FakeService:
    """What create_app calls on a Service, without a model."""

    model_name, context = "fake", 64
    scheduler = types.SimpleNamespace(counts=lambda: {})

    def start(self):
        return self

    def close(self, drain=True, timeout=0.0):
        pass

    def encode(self, prompt=None, messages=None):
        return [1]

    def submit(self, ids, params, loop=None):
        return FakeStream()


@pytest.fixture(scope="module")
def server():
    bench = load_benchmark("serve_bench")
    app = create_app(FakeService(), Metrics("fake", ["ngram"], 2), drain_timeout=1)
    peers = []

    async def recording(scope, receive, send):  # the client's (host, port) of every HTTP request
        if scope["type"] == "http":
            peers.append(scope["client"])
        await app(scope, receive, send)

    port = bench.free_port()
    srv = uvicorn.Server(uvicorn.Config(recording, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.02)
    yield bench, f"http://127.0.0.1:{port}", peers
    srv.should_exit = True
    thread.join(10)


@pytest.mark.parametrize("concurrency", [1, 3])
def test_every_request_of_a_level_gets_a_connection_of_its_own(server, concurrency):
    bench, url, peers = server
    peers.clear()
    level = asyncio.run(bench.run_level(url, "fake", ["a", "b"], concurrency=concurrency, rate=None, requests=8,
                                        max_tokens=GROUPS, temperature=0.0, timeout=30))
    assert level["ok"] == 8 and level["output_tokens"] == 8 * GROUPS, level
    assert len(peers) == 8 and len(set(peers)) == 8, f"connections reused: {len(set(peers))} for {len(peers)} requests"
