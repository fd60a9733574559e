"""The draft head's offline prompt corpus (flashspec.head_corpus): windows at offsets, the held-out
split (a file's docstring prose goes with its code), no held-out text among the training texts."""

from flashspec import head_corpus as hc

SOURCE = '''"""A module docstring that is long enough to be prose: it goes on about what the module does, why it
exists, how it is used, which functions matter, and what the reader should know before calling any of
them, for more than two hundred characters."""

import os


def f(x):
    return x + 1
''' + "\n".join(f"value_{i} = {i} * 2  # a line of code that is not blank" for i in range(60))


def test_code_windows_start_at_offsets_on_non_blank_lines_and_are_capped():
    got = hc.code_windows([("m.py", SOURCE)], every=6, lines=5, min_chars=40, max_chars=200)
    lines = SOURCE.splitlines()
    assert len(got) == len(range(0, len(lines), 6)) and all(p.group == "m.py" and p.domain == "code" for p in got)
    for p in got:
        first = p.text.splitlines()[0]
        assert first.strip() and first in lines and len(p.text) <= 201
    assert got[1].text.startswith("def f(x):")  # line 6 is blank: the window starts at line 7


def test_text_windows_cut_at_words():
    text = " ".join(f"word{i}" for i in range(300))
    got = hc.text_windows(text, chars=100, every=150)
    assert got and all(len(w) <= 100 and w.split()[0].startswith("word") for w in got)
    assert all(w in text for w in got) and not got[0].startswith("word0 ")  # the first window is left out
    assert hc.text_windows(text, chars=100, every=150, skip_first=False)[0].startswith("word0 ")


def test_docstring_prose_is_held_out_with_its_file():
    prose = [p for p in hc.prose_windows([("m.py", SOURCE)]) if p.group == "m.py"]
    assert prose and all(p.split == "code" for p in prose)
    for group in (f"g{i}.py" for i in range(40)):  # some held out, some not: each follows the code split
        p = hc.Prompt("prose", group, "text", split="code")
        assert p.held_out == hc.Prompt("code", group, "code").held_out == hc.is_held_out("code", group)


def test_the_corpus_keeps_its_first_prompts_first_and_no_held_out_text_is_trained_on():
    c = hc.corpus()
    first = hc.code_prompts() + hc.prose_prompts()
    texts = [p.text for p in c]
    assert len(set(texts)) == len(texts)
    unique = list(dict.fromkeys(p.text for p in first))  # texts repeated across files are listed once
    assert texts[: len(unique)] == unique and len(unique) >= 0.9 * len(first)
    train, held = hc.split(c)
    assert {p.text for p in train}.isdisjoint(p.text for p in held)
    chat = [p for p in c if p.domain == "chat"]
    assert len(chat) == len(hc.TEMPLATES) * len(hc.SUBJECTS) == 48 * 240
    assert [p.text for p in chat[:3]] == [t.format(s=hc.SUBJECTS[0]) for t in hc.TEMPLATES[:3]]
    assert {p.domain for p in held} == set(hc.DOMAINS) and any(p.split == "code" for p in held)
