"""The offline prompt corpus a draft head is trained and measured on (standard library only).

Three domains, every prompt a plain string, each with the group it is held out by:

* ``code``: the Python standard library's own sources (``sysconfig``'s stdlib path, tests, idlelib
  and site-packages left out): the first lines of each top-level ``def`` / ``class`` that has a
  docstring, up to ``per_file`` per file, then (``code_windows``) windows of lines starting every
  ``every`` lines anywhere in each file; group = the file.
* ``prose``: the ``pydoc_data.topics`` help texts, one prompt per paragraph of at least 200
  characters (its first 300 characters, cut at a word), then (``prose_windows``) 300-character
  windows at offsets inside the topics' long paragraphs (group = the topic) and inside the stdlib's
  docstrings (group = the file, held out with the file's code: ``Prompt.split``).
* ``chat``: instructions written here, TEMPLATES x SUBJECTS (48 x 240, meant for the chat template);
  group = the subject.

A group is held out when crc32(split/group) % 10 == 0, split being the domain (the file for the
docstring prose, so that a held-out file's code and docstrings are both held out): about a tenth,
the same on every machine and Python version that has the same files; training never sees a held-out
group. ``corpus()`` lists the first prompts of each domain first (the ones the shipped head was
trained and measured on), then the windows and the later templates and subjects.
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
    # the later 24 (``chat_prompts``: after the first 24 x 120)
    "Write a limerick about {s}.",
    "What are the key terms someone should know about {s}? Define each briefly.",
    "Explain {s} as if you were a pirate.",
    "Give me a one-sentence definition of {s}, then expand it into a paragraph.",
    "What careers are connected to {s}?",
    "Write a product description for a board game about {s}.",
    "How has {s} changed over the last fifty years?",
    "Describe a typical day for someone who works with {s}.",
    "What ethical questions does {s} raise?",
    "Write a short news headline and lead paragraph about a discovery in {s}.",
    "Explain the difference between a beginner's and an expert's view of {s}.",
    "Write a motivational speech for a team working on {s}.",
    "Summarize {s} in a tweet of at most 280 characters.",
    "What would the world look like without {s}?",
    "Create a simple lesson plan for a one-hour class on {s}.",
    "Write a JSON object describing {s} with a few fields.",
    "Answer briefly: what is the single most important thing to understand about {s}?",
    "Write a short poem in free verse about {s}.",
    "What mistakes do beginners usually make with {s}?",
    "Explain {s} with a metaphor from sports.",
    "Write a thank-you note to a scientist who studies {s}.",
    "Give a pros and cons table for {s} in Markdown.",
    "What are three open questions about {s} today?",
    "Translate the idea of {s} into a simple rule of thumb and explain it.",
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
    # the later 120
    "quantum computing", "the French language", "wind turbines", "ocean currents", "the Amazon rainforest",
    "the Industrial Revolution", "ancient Greece", "the Cold War", "the Byzantine Empire", "the Maya civilization",
    "spreadsheets", "operating systems", "garbage collection", "functional programming", "type systems",
    "web browsers", "computer networks", "linked lists", "graph algorithms", "dynamic programming", "cryptocurrency",
    "data visualization", "statistics", "calculus", "geometry", "fractions", "logic puzzles", "game theory",
    "supply and demand", "taxes", "insurance", "mortgages", "international trade", "small talk", "friendship",
    "parenting", "pets", "dog training", "cats", "horses", "whales", "octopuses", "ants", "mushrooms", "forests",
    "wetlands", "soil", "rain", "snowflakes", "thunderstorms", "hurricanes", "the ozone layer", "air pollution",
    "water purification", "nuclear power", "batteries", "3D printing", "robots", "drones", "satellites",
    "the International Space Station", "Mars exploration", "telescopes", "microscopes", "lasers", "sound waves",
    "color theory", "typography", "graphic design", "fashion", "perfume", "chocolate", "cheese making",
    "fermentation", "spices", "vegetarian cooking", "street food", "table manners",
    "handwriting", "calligraphy", "storytelling", "comic books", "theater", "ballet", "hip hop", "the piano",
    "the guitar", "choirs", "film history", "animation", "radio", "newspapers", "advertising", "branding",
    "customer service", "project management", "teamwork", "leadership", "time management", "procrastination",
    "habits", "memory", "dreams", "emotions", "stress", "happiness", "the placebo effect", "vision", "the brain",
    "bones", "the digestive system", "allergies", "hand washing", "hiking", "skiing", "surfing",
    "cycling races", "basketball", "cricket", "lighthouses",
)


@dataclass(frozen=True)
class Prompt:
    domain: str  # one of DOMAINS
    group: str  # what it is held out by: a file, a topic, a subject
    text: str
    split: str = ""  # the domain whose split holds the group ("": its own)

    @property
    def held_out(self) -> bool:
        return is_held_out(self.split or self.domain, self.group)


def is_held_out(domain: str, group: str) -> bool:
    return zlib.crc32(f"{domain}/{group}".encode()) % 10 == 0


FIRST_TEMPLATES, FIRST_SUBJECTS = 24, 120  # the chat prompts listed first (the shipped head's)


def stdlib_sources() -> list[tuple[str, str]]:
    """(path relative to the stdlib, text) of every readable ``.py`` file of the standard library,
    tests, idlelib, lib2to3 and site-packages left out; sorted by path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__"}
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if skip & set(rel.parts):
            continue
        try:
            out.append((str(rel), path.read_text(encoding="utf-8")))
        except (UnicodeDecodeError, OSError):
            continue
    return out


def code_prompts(per_file: int = 4, lines: int = 8, sources=None) -> list[Prompt]:
    out = []
    for rel, text in stdlib_sources() if sources is None else sources:
        src = text.splitlines()
        found = 0
        for i, line in enumerate(src):
            if found >= per_file:
                break
            if re.match(r"(def|class) \w+", line) and any('"""' in s for s in src[i + 1 : i + 3]):
                out.append(Prompt("code", rel, "\n".join(src[i : i + lines]) + "\n"))
                found += 1
    return out


def code_windows(sources, every: int = 40, lines: int = 12, min_chars: int = 120, max_chars: int = 640) -> list[Prompt]:
    """``lines`` lines of each file starting at lines 0, every, 2 every, ... (a window starting on a
    blank line starts at the next non-blank one), cut to whole lines of at most ``max_chars``
    characters (the first line alone when it is longer); windows under ``min_chars`` are left out."""
    out = []
    for rel, text in sources:
        src = text.splitlines()
        for i in range(0, len(src), every):
            while i < len(src) and not src[i].strip():
                i += 1
            window = "\n".join(src[i : i + lines])
            if len(window) > max_chars:
                window = window[:max_chars].rsplit("\n", 1)[0]
            if len(window.strip()) >= min_chars:
                out.append(Prompt("code", rel, window + "\n"))
    return out


def text_windows(text: str, chars: int = 300, every: int = 400, skip_first: bool = True) -> list[str]:
    """``chars``-character windows of ``text`` (whitespace collapsed) starting every ``every``
    characters, each starting and ending at a word; the one at 0 left out with ``skip_first``."""
    text = " ".join(text.split())
    out = []
    for start in range(every if skip_first else 0, len(text) - chars // 2, every):
        begin = 0 if start == 0 else text.find(" ", start) + 1  # at a word
        if begin <= 0 and start:
            break
        cut = text[begin : begin + chars].rsplit(" ", 1)[0]
        if len(cut) >= chars // 2:
            out.append(cut)
    return out


DOCSTRING = re.compile(r'"""(.*?)"""', re.S)


def prose_windows(sources, min_chars: int = 200, every: int = 400) -> list[Prompt]:
    """Windows (``text_windows``) inside the pydoc topics' paragraphs past their first 300 characters
    (group: the topic), then inside every triple-quoted string of at least ``min_chars`` characters of
    the stdlib's sources, from its start (group: the file, held out by the code split)."""
    from pydoc_data.topics import topics

    out = []
    for topic in sorted(topics):
        for para in re.split(r"\n\s*\n", topics[topic]):
            if not para.lstrip().startswith(("*", "=")):
                out += [Prompt("prose", topic, w) for w in text_windows(para, every=every)]
    for rel, text in sources:
        for doc in DOCSTRING.findall(text):
            if len(doc.strip()) >= min_chars:
                out += [Prompt("prose", rel, w, split="code") for w in text_windows(doc, every=every, skip_first=False)]
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
    """The first FIRST_TEMPLATES x FIRST_SUBJECTS, then every other (template, subject) pair."""
    pairs = [(s, t) for s in SUBJECTS[:FIRST_SUBJECTS] for t in TEMPLATES[:FIRST_TEMPLATES]]
    first = set(pairs)
    pairs += [(s, t) for s in SUBJECTS for t in TEMPLATES if (s, t) not in first]
    return [Prompt("chat", s, t.format(s=s)) for s, t in pairs]


def corpus() -> list[Prompt]:
    """Every prompt of every domain, in a fixed order: each domain's first prompts (``code_prompts``,
    ``prose_prompts``, the first chat pairs), then the windows; a text already listed is left out
    (license headers repeat across files: no held-out text is also a training text)."""
    sources = stdlib_sources()
    out, seen = [], set()
    for p in code_prompts(sources=sources) + prose_prompts() + chat_prompts() + code_windows(sources) + prose_windows(sources):
        if p.text not in seen:
            seen.add(p.text)
            out.append(p)
    return out


def split(prompts: list[Prompt]) -> tuple[list[Prompt], list[Prompt]]:
    """(training prompts, held-out prompts)."""
    return [p for p in prompts if not p.held_out], [p for p in prompts if p.held_out]
