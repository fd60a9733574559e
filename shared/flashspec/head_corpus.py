"""The offline prompt corpus a draft head is trained and measured on (standard library only).

Three domains, every prompt a plain string, each with the group it is held out by:

* ``code``: the Python standard library's own sources (``sysconfig``'s stdlib path, tests, idlelib
  and site-packages left out): the first lines of each top-level ``def`` / ``class`` that has a
  docstring, up to ``per_file`` per file; group = the file.
* ``prose``: the ``pydoc_data.topics`` help texts, one prompt per paragraph of at least 200
  characters (its first 300 characters, cut at a word); group = the topic.
* ``chat``: instructions written here, TEMPLATES x SUBJECTS (24 x 120, meant for the chat template);
  group = the subject.

A group is held out when crc32(domain/group) % 10 == 0 (about a tenth: same split on every
machine and Python version that has the same files); training never sees a held-out group.
"""

from __future__ import annotations

import re
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

DOMAINS = ("code", "prose", "chat")

TEMPLATES = (
    "Explain {s} to a beginner in a few sentences.",
    "What are the main advantages and disadvantages of {s}?",
    "Write a short story that involves {s}.",
    "Give me three practical tips about {s}.",
    "Summarize the history of {s} in one paragraph.",
    "How would you teach {s} to a ten-year-old?",
    "Write a haiku about {s}.",
    "What are common misconceptions about {s}?",
    "Compare {s} with something similar and explain the difference.",
    "Draft a friendly email inviting a colleague to a talk about {s}.",
    "List five questions a curious student might ask about {s}.",
    "Why does {s} matter in everyday life?",
    "I have to give a two-minute talk on {s}. Can you outline it for me?",
    "Write a Python function related to {s}, with a docstring and a short example.",
    "Describe {s} using an analogy from cooking.",
    "Pretend you are a tour guide and introduce {s}.",
    "What would a skeptic say about {s}, and how would you answer?",
    "Create a short quiz with answers about {s}.",
    "Explain {s} in exactly three bullet points.",
    "Write a dialogue between a teacher and a student about {s}.",
    "What is a good first book or resource for learning about {s}, and why?",
    "Rewrite this sentence to be more formal: {s} is kind of cool and people like it a lot.",
    "Give a step-by-step plan for a weekend project about {s}.",
    "Tell me a fun fact about {s} and explain why it is true.",
)

SUBJECTS = (
    "photosynthesis", "the water cycle", "black holes", "climate change", "the French Revolution", "vaccines",
    "machine learning", "recursion", "binary search", "public transport", "coffee", "bread baking", "chess",
    "the Roman Empire", "volcanoes", "electric cars", "sleep", "meditation", "gardening", "the stock market",
    "inflation", "renewable energy", "the human heart", "plate tectonics", "honey bees", "the printing press",
    "jazz music", "the Olympic Games", "password security", "databases", "compilers", "the internet",
    "rainbows", "tides", "the moon landing", "penguins", "marathon training", "budgeting", "learning a language",
    "time zones", "origami", "the immune system", "earthquakes", "solar panels", "recycling", "bicycles",
    "libraries", "the periodic table", "dinosaurs", "coral reefs", "hash tables", "version control",
    "open source software", "remote work", "public speaking", "cooking pasta", "tea ceremonies", "glaciers",
    "the Renaissance", "sorting algorithms", "prime numbers", "probability", "weather forecasting", "deserts",
    "the Great Wall of China", "neural networks", "regular expressions", "unit testing", "cloud computing", "encryption",
    "the solar system", "rivers", "migration of birds", "ancient Egypt", "the Silk Road",
    "electricity", "magnets", "gravity", "the speed of light", "DNA", "evolution", "antibiotics", "nutrition",
    "running a small business", "negotiation", "writing a resume", "job interviews", "saving for retirement",
    "credit cards", "minimalism", "journaling", "houseplants", "composting", "beekeeping", "birdwatching",
    "knitting", "photography", "film editing", "podcasting", "video games", "board games", "football", "tennis",
    "swimming", "yoga", "first aid", "camping", "mountain climbing", "sailing", "airplanes", "trains",
    "city planning", "architecture", "museums", "poetry", "opera", "painting", "sculpture", "social media", "volunteering",
)


@dataclass(frozen=True)
class Prompt:
    domain: str  # one of DOMAINS
    group: str  # what it is held out by: a file, a topic, a subject
    text: str

    @property
    def held_out(self) -> bool:
        return is_held_out(self.domain, self.group)


def is_held_out(domain: str, group: str) -> bool:
    return zlib.crc32(f"{domain}/{group}".encode()) % 10 == 0


def code_prompts(per_file: int = 4, lines: int = 8) -> list[Prompt]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__"}
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if skip & set(rel.parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        src = text.splitlines()
        found = 0
        for i, line in enumerate(src):
            if found >= per_file:
                break
            if re.match(r"(def|class) \w+", line) and any('"""' in s for s in src[i + 1 : i + 3]):
                out.append(Prompt("code", str(rel), "\n".join(src[i : i + lines]) + "\n"))
                found += 1
    return out


def prose_prompts(min_chars: int = 200, chars: int = 300) -> list[Prompt]:
    from pydoc_data.topics import topics

    out = []
    for topic in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[topic]):
            para = " ".join(para.split())
            if len(para) >= min_chars and not para.startswith(("*", "=")):
                cut = para[:chars].rsplit(" ", 1)[0]
                out.append(Prompt("prose", topic, cut))
    return out


def chat_prompts() -> list[Prompt]:
    return [Prompt("chat", s, t.format(s=s)) for s in SUBJECTS for t in TEMPLATES]


def corpus() -> list[Prompt]:
    """Every prompt of every domain, in a fixed order."""
    return code_prompts() + prose_prompts() + chat_prompts()


def split(prompts: list[Prompt]) -> tuple[list[Prompt], list[Prompt]]:
    """(training prompts, held-out prompts)."""
    return [p for p in prompts if not p.held_out], [p for p in prompts if p.held_out]
