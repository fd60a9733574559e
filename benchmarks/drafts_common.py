"""What the drafts_* benchmarks share: the three domains' prompts and the machine description.

code  = the first half of functions from Python's standard library (generate_cpu's builder),
prose = the start of pydoc_data topics (generate_cpu's builder),
chat  = benchmarks/prompts/chat.txt, one request per line, sent through the chat template.
"""

from __future__ import annotations

import os
import platform
from datetime import date
from pathlib import Path

import torch

from generate_cpu import code_prompts, prose_prompts

CHAT_FILE = Path(__file__).parent / "prompts" / "chat.txt"
DOMAINS = ("code", "prose", "chat")


def chat_prompts(k: int | None = None) -> list[str]:  # the first k (None: all)
    lines = [line.strip() for line in CHAT_FILE.read_text().splitlines() if line.strip()]
    return lines[:k]


def prompts(domain: str, first: int, count: int) -> list[str]:
    """Prompts first .. first+count-1 of a domain (the search and the table use disjoint ranges)."""
    build = {"code": code_prompts, "prose": prose_prompts, "chat": chat_prompts}
    if domain not in build:
        raise ValueError(f"domain={domain!r} must be one of {DOMAINS}")
    got = build[domain](first + count)[first:]
    if len(got) < count:
        raise ValueError(f"domain {domain!r} has only {first + len(got)} prompts, asked for {first + count}")
    return got


def machine() -> dict:
    import transformers

    return {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {torch.get_num_threads()} torch threads, "
                   f"{platform.system()}, fp32 (shared with other jobs)",
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "date": str(date.today()),
        "model": "SmolLM2-135M-Instruct (embedded GGUF, de-quantized to fp32)",
    }
