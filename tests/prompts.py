"""Twenty prompts of mixed kinds (code, prose, chat, lists), shared by the engine tests of both backends;
three for the draft head's engine tests."""

HEAD_PROMPTS = ["def mean(values):\n    \"\"\"Return the arithmetic mean of values.\"\"\"\n",
                "The garbage collector frees memory that is no longer reachable, and",
                "Explain tides to a beginner in a few sentences."]  # the draft head's engine tests (code, prose, chat)

PROMPTS = [
    "def fibonacci(n):",
    "import os\nimport sys\n\ndef main():",
    "class Stack:\n    def __init__(self):",
    "for i in range(10):",
    "SELECT name, age FROM users WHERE",
    "The capital of France is",
    "Once upon a time, in a small village,",
    "The theory of relativity states that",
    "Photosynthesis is the process by which",
    "In 1969, the first humans",
    "Write a haiku about the sea.",
    "What is the boiling point of water?",
    "Give me three tips for better sleep.",
    "Explain recursion to a child.",
    "Translate 'good morning' into French.",
    "1, 2, 3, 4, 5,",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Monday, Tuesday, Wednesday,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):",
    "Roses are red, violets are blue,",
]
