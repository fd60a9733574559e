"""The OpenAI-compatible ASGI app: /v1/completions, /v1/chat/completions, /v1/models, /health,
/metrics. It parses and checks a request, hands it to the ``Service`` and streams (SSE) or
gathers its deltas. Errors are OpenAI's body ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette.sse import EventSourceResponse

from ..scheduler import Closed, QueueFull
from ..serving import BadRequest, Service, Stream, check_params
from .metrics import Metrics

# fields the OpenAI API has that this server does not implement: any value but the neutral one is refused
UNSUPPORTED = {"n": (None, 1), "best_of": (None, 1), "logprobs": (None, False), "top_logprobs": (None, 0),
               "echo": (None, False), "suffix": (None, ""), "presence_penalty": (None, 0, 0.0),
               "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}), "tools": (None, []),
               "tool_choice": (None, "none"), "functions": (None, []), "response_format": (None, {"type": "text"}),
               "parallel_tool_calls": (None,), "prediction": (None,), "audio": (None,),
               "modalities": (None, ["text"])}
KNOWN = {"model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed",
         "stop", "stream", "stream_options", "user", "store", "metadata", *UNSUPPORTED}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status)


def create_app(service: Service, metrics: Metrics, *, drain_timeout: float = 30.0) -> FastAPI:
    """The app over a (not yet started) service; its lifespan starts it and drains it at shutdown."""

    @asynccontextmanager
    async def lifespan(app):
        service.start()
        yield
        await asyncio.to_thread(service.close, True, drain_timeout)

    app = FastAPI(title="flashspec", lifespan=lifespan)
    model = service.model_name

    @app.exception_handler(ApiError)
    async def api_error(request, e: ApiError):
        return e.response()

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "flashspec"}]}

    @app.get("/metrics")
    async def prometheus():
        metrics.queues(service.scheduler.counts())
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answer(service, request, False, drain_timeout)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(service, request, True, drain_timeout)

    return app


async def read_body(request: Request) -> dict:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def check_fields(body: dict, model: str, chat: bool) -> None:
    for name, neutral in UNSUPPORTED.items():
        if name in body and body[name] not in neutral:
            raise ApiError(400, f"{name}={body[name]!r} is not supported by this server (only {neutral[-1]!r})", name)
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise ApiError(400, f"unknown field {unknown[0]!r}", unknown[0])
    need, other = ("messages", "prompt") if chat else ("prompt", "messages")
    if other in body:
        raise ApiError(400, f"{other} belongs to /v1/{'completions' if chat else 'chat/completions'}", other)
    if need not in body:
        raise ApiError(400, f"{need} is required", need)
    if body.get("model") not in (None, model):
        raise ApiError(404, f"the model {body.get('model')!r} does not exist; this server serves {model!r}", "model",
                       code="model_not_found")
    if not isinstance(body.get("stream", False), bool):
        raise ApiError(400, "stream must be true or false", "stream")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise ApiError(400, "stream_options must be an object with only include_usage", "stream_options")


async def answer(service: Service, request: Request, chat: bool, drain_timeout: float):
    body = await read_body(request)
    check_fields(body, service.model_name, chat)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    default = 16 if not chat else None
    try:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        ids = service.encode(messages=body["messages"]) if chat else service.encode(prompt=prompt)
        if max_tokens is None:
            max_tokens = default or max(1, service.context - len(ids))
        seed = body.get("seed")
        seed = secrets.randbelow(2**63) if seed is None else seed
        given = lambda name, default: default if body.get(name) is None else body[name]  # noqa: E731
        params = check_params(max_tokens, given("temperature", 1.0), given("top_p", 1.0), given("top_k", 0), seed,
                              body.get("stop"))
        stream = service.submit(ids, params, loop=asyncio.get_running_loop())
    except BadRequest as e:
        raise ApiError(400, str(e), e.param) from None
    except QueueFull as e:
        raise ApiError(429, f"the server is busy: {e}", kind="rate_limit_error", code="queue_full") from None
    except Closed as e:
        raise ApiError(503, str(e), kind="server_error", code="shutting_down") from None
    reply = Reply(service.model_name, chat, stream)
    if body.get("stream"):
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return EventSourceResponse(reply.events(request, usage), ping=0, sep="\n", shutdown_grace_period=drain_timeout)
    return await reply.whole(request)


class Reply:
    """One request's answer in OpenAI's objects, streamed or whole."""

    def __init__(self, model: str, chat: bool, stream: Stream):
        self.model, self.chat, self.stream = model, chat, stream
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.kind = "chat.completion" if chat else "text_completion"

    def usage(self) -> dict:
        s = self.stream.stats or {}
        prompt, completion = self.stream.prompt_tokens, s.get("completion_tokens", len(self.stream.token_ids))
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict:
        if self.chat:
            delta = ({"role": "assistant", "content": ""} if first else {}) if text is None else {"content": text}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        kind = self.kind + ".chunk" if self.chat else self.kind
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": [choice]}

    async def events(self, request: Request, include_usage: bool):
        """SSE data: one chunk per token group, the last with finish_reason and the speculation
        figures (``flashspec``), then usage (if asked), then [DONE]. A gone client cancels."""
        try:  # sse_starlette ends this generator when the client disconnects: finally cancels
            if self.chat:
                yield json.dumps(self.chunk(None, None, first=True))
            async for delta in self.stream:
                if delta.finish_reason == "error":
                    yield json.dumps({"error": {"message": delta.error, "type": "server_error", "param": None,
                                                "code": None}})
                    break
                if delta.text or delta.finish_reason is None:
                    yield json.dumps(self.chunk(delta.text, None))
                if delta.finish_reason is not None:
                    last = self.chunk(None if self.chat else "", finish_reason(delta.finish_reason))
                    yield json.dumps({**last, "flashspec": delta.stats})
            if include_usage and self.stream.finish_reason not in (None, "error"):
                yield json.dumps({**self.chunk(None, None), "choices": [], "usage": self.usage()})
            yield "[DONE]"
        finally:
            if self.stream.finish_reason is None:
                self.stream.cancel()

    async def whole(self, request: Request) -> dict:
        watch = asyncio.create_task(watch_disconnect(request, self.stream))
        try:
            async for delta in self.stream:
                if delta.finish_reason == "error":
                    raise ApiError(500, delta.error or "generation failed", kind="server_error")
        finally:
            watch.cancel()
            if self.stream.finish_reason is None:
                self.stream.cancel()
        reason = finish_reason(self.stream.finish_reason)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": self.stream.text}, "logprobs": None,
                      "finish_reason": reason}
        else:
            choice = {"index": 0, "text": self.stream.text, "logprobs": None, "finish_reason": reason}
        return {"id": self.id, "object": self.kind, "created": self.created, "model": self.model,
                "choices": [choice], "usage": self.usage(), "flashspec": self.stream.stats}


def finish_reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


async def watch_disconnect(request: Request, stream: Stream, every: float = 0.1) -> None:
    """Cancel the request when its client goes away (its slot is freed before the next step)."""
    while stream.finish_reason is None:
        if await request.is_disconnected():
            stream.cancel()
            return
        await asyncio.sleep(every)
