"""Serving in Python: a ``Service`` over an engine runs the continuous-batching scheduler on a
thread and hands out ``Stream``s of text deltas (per request: token groups turned into text,
stop strings cut, statistics at the end). ``flashspec serve`` is a thin HTTP layer over it.

    svc = Service(flashspec.engine.engine("torch"), max_batch=8)
    with svc:
        for delta in svc.stream(messages=[{"role": "user", "content": "Hi"}], max_tokens=32):
            print(delta.text, end="")

Detokenising and stop strings run on the consumer's side (the caller's thread, or the server's
event loop), never on the scheduler's thread, which only launches and reads steps.
"""

from __future__ import annotations

import asyncio
import numbers
import queue
from collections.abc import Sequence
from dataclasses import dataclass

from . import adaptive, adaptive_loop
from .config import SamplingConfig
from .scheduler import Scheduler, Submission, Ticket

MAX_STOP = 4  # as the OpenAI API


class BadRequest(ValueError):
    """A request field is invalid; ``param`` names it (the HTTP layer answers 400)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Delta:
    """One token group of a request as text; the last one has ``finish_reason`` and ``stats``."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" (EOS or a stop string), "length", "cancelled", "error"
    stats: dict | None = None
    error: str | None = None


@dataclass(frozen=True)
class Params:
    """A request's checked generation settings."""

    max_tokens: int
    sampling: SamplingConfig
    seed: int
    stop: tuple[str, ...]


def check_params(max_tokens, temperature, top_p, top_k, seed, stop) -> Params:
    """The request's settings, or BadRequest naming the field."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise BadRequest("max_tokens", f"max_tokens={max_tokens!r} must be an integer >= 1")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**63:
        raise BadRequest("seed", f"seed={seed!r} must be an integer in [0, 2**63)")
    if isinstance(stop, str):
        stop = [stop]
    if stop is None:
        stop = []
    if not isinstance(stop, (list, tuple)) or len(stop) > MAX_STOP or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("stop", f"stop={stop!r} must be a non-empty string or a list of at most {MAX_STOP} of them")
    for name, value in (("temperature", temperature), ("top_p", top_p), ("top_k", top_k)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BadRequest(name, f"{name}={value!r} must be a number")
    if top_k != int(top_k):
        raise BadRequest("top_k", f"top_k={top_k!r} must be an integer >= 0 (0: off)")
    try:
        sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
    except ValueError as e:
        param = next((n for n in ("temperature", "top_k", "top_p") if str(e).startswith(n)), "temperature")
        raise BadRequest(param, str(e)) from None
    return Params(max_tokens, sampling, int(seed), tuple(stop))


class Detokenizer:
    """Token ids -> text deltas, decoding only a short window (a multi-byte character split across
    tokens is held back until complete), with stop strings cut out (the text that could begin one
    is held back until it cannot)."""

    def __init__(self, tokenizer, stop: Sequence[str]):
        self.tok, self.stop = tokenizer, tuple(stop)
        self.ids: list[int] = []
        self.prefix = self.read = 0  # vLLM / transformers' incremental window
        self.text = ""  # decoded so far
        self.sent = 0  # characters of ``text`` handed out

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def feed(self, ids: list[int], final: bool) -> tuple[str, bool]:
        """(new text to send, whether a stop string ended the request)."""
        self.ids.extend(ids)
        before = self.decode(self.ids[self.prefix : self.read])
        now = self.decode(self.ids[self.prefix :])
        if len(now) > len(before) and (final or not now.endswith("\ufffd")):
            self.text += now[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
        longest = max(map(len, self.stop), default=0)
        hits = [i for i in (self.text.find(s, max(0, self.sent - longest)) for s in self.stop) if i >= 0]
        if hits:  # the held-back tail makes every hit start at or after ``sent``
            cut = min(hits)
            out, self.sent, self.text = self.text[self.sent : cut], cut, self.text[:cut]
            return out, True
        end = len(self.text) if final else max(self.sent, len(self.text) - max(longest - 1, 0))
        out, self.sent = self.text[self.sent : end], end
        return out, False


class Stream:
    """The deltas of one request, in order: iterate it (``for``; ``async for`` when made with an
    event loop). ``cancel()`` stops the request and frees its slot; ``text``, ``token_ids``,
    ``finish_reason`` and ``stats`` hold the result once finished."""

    def __init__(self, service: Service, ids: list[int], params: Params, loop: asyncio.AbstractEventLoop | None):
        self.service, self.params, self.prompt_tokens = service, params, len(ids)
        self.detok = Detokenizer(service.tokenizer, params.stop)
        self.loop = loop
        self.events: queue.SimpleQueue | asyncio.Queue = asyncio.Queue() if loop else queue.SimpleQueue()
        self.text, self.token_ids = "", []
        self.finish_reason: str | None = None
        self.stats: dict | None = None
        self.ticket = service.scheduler.submit(Submission(tuple(ids), params.max_tokens, params.sampling, params.seed),
                                               self.on_event)

    def on_event(self, ticket: Ticket, new: list[int]) -> None:  # the scheduler's thread
        item = (list(new), ticket.finish_reason, ticket.error)
        if self.loop is None:
            self.events.put(item)
        else:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)

    def cancel(self) -> None:
        self.service.scheduler.cancel(self.ticket)

    def handle(self, item) -> Delta | None:
        """A scheduler event -> the delta to hand out (None: nothing yet, or already finished)."""
        if self.finish_reason is not None:
            return None
        new, reason, error = item
        text, stopped = self.detok.feed(new, final=reason is not None)
        if not stopped:
            self.token_ids.extend(new)
        self.text += text
        if stopped:
            self.cancel()
            reason = "stop"
        if reason is None:
            return Delta(text, new) if text or new else None
        self.finish_reason = reason
        self.stats = {**self.ticket.stats(), "prompt_tokens": self.prompt_tokens,
                      "completion_tokens": len(self.token_ids)}
        return Delta(text, new if not stopped else [], reason, self.stats, error)

    def __iter__(self):
        if self.loop is not None:
            raise TypeError("this stream was made for an event loop: use async for")
        while self.finish_reason is None:
            delta = self.handle(self.events.get())
            if delta is not None:
                yield delta

    async def __aiter__(self):
        while self.finish_reason is None:
            delta = self.handle(await self.events.get())
            if delta is not None:
                yield delta


class Service:
    """An engine serving requests with continuous batching (``max_batch`` slots of ``context``
    tokens, at most ``max_queue`` waiting, at most ``prefill_chunk`` prompt tokens prefilled between
    two steps). The engine's policy chooses the drafts: ``adaptive`` (the engine's
    ``adaptive_policy``: plain decoding and every draft at ``gamma`` and ``gamma // 2``, chosen per
    step for the requests it serves, with full-information scoring where the backend offers it) or
    a draft bandit at ``gamma``. Start it with ``with`` (or ``start()`` / ``close()``)."""

    def __init__(self, engine, *, max_batch: int = 16, max_queue: int = 256, context: int | None = None,
                 gamma: int = 4, speculation: bool = True, prefill_chunk: int = 512, observer=None):
        backend = engine.backend
        self.engine, self.tokenizer = engine, engine.tokenizer
        limit = getattr(getattr(backend, "target", None), "config", None) or getattr(backend, "config", None)
        limit = limit.max_position_embeddings if limit is not None else 2048
        self.context = min(limit, 2048) if context is None else context
        policy = None
        if speculation and engine.policy_name == adaptive.NAME:
            policy = engine.adaptive_policy(gamma, 0)
            with engine.running():
                adaptive_loop.use_free_scoring(backend, policy)  # before prepare: the steps made ready score
        elif speculation:
            policy = engine.policy_for(gamma, 0)
        self.scheduler = Scheduler(backend, policy, slots=max_batch, context=self.context, gamma=gamma,
                                   speculation=speculation, max_queue=max_queue, prefill_chunk=prefill_chunk,
                                   observer=observer,
                                   running=engine.running)
        self.model_name = getattr(getattr(engine, "target", None), "name", "flashspec")

    def prepare(self, temperatures=(0.0, 1.0), top_k: int = 0, top_p: float = 1.0) -> int:
        """Make ready now the steps of requests with these settings, for every slot-count bucket
        (torch on a GPU: captures their CUDA graphs; JAX: compiles them), and run the prefill at
        every prompt-length class (``Scheduler.warm_prefill``), so that no request waits for a
        capture or a compile; call before ``start``. Adaptive: every arm's step kinds
        (``Scheduler.prepare_sampling``; the policy is then ``warm`` where any was made ready; other
        settings are made ready before their first step). Returns the step kinds made ready."""
        if self.scheduler.thread is not None:
            raise RuntimeError("prepare before start: the scheduler's thread owns the backend once started")
        scheduler = self.scheduler
        scheduler.warm_prefill()
        settings = [SamplingConfig(t, top_k, top_p) for t in temperatures]
        with self.engine.running():
            if scheduler.adaptive:  # every arm's length, and the plain step without scoring (the engine loop's call)
                return sum(scheduler.prepare_sampling(s) for s in settings)
            g = scheduler.gamma if scheduler.speculation else None  # None: plain decoding only
            return sum(scheduler.backend.prepare(g, s) for s in settings)

    def start(self) -> Service:
        self.scheduler.start()
        return self

    def close(self, drain: bool = True, timeout: float = 30.0) -> None:
        self.scheduler.stop(drain=drain, timeout=timeout)

    def __enter__(self) -> Service:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close(drain=False)

    def encode(self, prompt: str | None = None, messages: Sequence[dict] | None = None) -> list[int]:
        """A completion prompt as is, or chat messages through the tokenizer's chat template."""
        if (prompt is None) == (messages is None):
            raise BadRequest("prompt", "give either prompt (a completion) or messages (a chat), not both")
        if prompt is not None:
            if not isinstance(prompt, str) or not prompt:
                raise BadRequest("prompt", "prompt must be a non-empty string")
            return list(self.tokenizer(prompt)["input_ids"])
        return self.encode_chat(messages)

    def encode_chat(self, messages) -> list[int]:
        roles = ("system", "user", "assistant")
        if not isinstance(messages, (list, tuple)) or not messages or not all(
            isinstance(m, dict) and m.get("role") in roles and isinstance(m.get("content"), str) for m in messages
        ):
            raise BadRequest("messages", f"messages must be a non-empty list of {{'role': one of {roles}, "
                                         "'content': a string}")
        if not getattr(self.tokenizer, "chat_template", None):
            raise BadRequest("messages", "this model's tokenizer has no chat template: use /v1/completions")
        ids = self.tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                                 add_generation_prompt=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def submit(self, ids: list[int], params: Params, loop: asyncio.AbstractEventLoop | None = None) -> Stream:
        """Queue encoded prompt ``ids``; raises QueueFull, Closed, or BadRequest (too long)."""
        if len(ids) + params.max_tokens > self.context:
            raise BadRequest("max_tokens" if len(ids) < self.context else "prompt",
                             f"the prompt has {len(ids)} tokens and max_tokens is {params.max_tokens}: together more "
                             f"than the context of {self.context} tokens; shorten the prompt or lower max_tokens")
        return Stream(self, ids, params, loop)

    def stream(self, prompt: str | None = None, *, messages=None, max_tokens: int = 64, temperature: float = 0.7,
               top_p: float = 1.0, top_k: int = 0, seed: int = 0, stop=None) -> Stream:
        """Generate for a prompt (as is) or chat messages (chat template); iterate the result."""
        params = check_params(max_tokens, temperature, top_p, top_k, seed, stop)
        return self.submit(self.encode(prompt, messages), params)

    def complete(self, prompt: str | None = None, **kwargs) -> dict:
        """``stream`` run to the end: text, token_ids, finish_reason, stats."""
        s = self.stream(prompt, **kwargs)
        for _ in s:
            pass
        return {"text": s.text, "token_ids": s.token_ids, "finish_reason": s.finish_reason, "stats": s.stats}
