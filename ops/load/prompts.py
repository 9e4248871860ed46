"""Prompt and output-length mixes for the load tools (locust users, the soak): what traffic
looks like, roughly.

Lengths are drawn per request from weighted buckets (a chat question, a paragraph to work on,
a document to answer from), with text made from a fixed corpus so runs are comparable. The
mix is a module constant so a run's report can name it. Imports the stdlib only.
"""

from __future__ import annotations

import random

SENTENCES = [
    "The committee reviewed the quarterly figures and found the shipping costs had doubled.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.",
    "She packed the telescope, two blankets and a thermos of tea before driving to the hills.",
    "A hash table keeps lookups fast by spreading keys across buckets.",
    "The river flooded twice that spring, and the bridge was closed for a month.",
    "Interest rates rose again, which made the new mortgage far more expensive.",
    "The recipe calls for three eggs, a cup of flour and a pinch of salt.",
    "Our service returns a 429 when it is overloaded, with a Retry-After header.",
    "The museum's new wing holds a collection of medieval maps and astrolabes.",
    "He trained for the marathon by running ten kilometres every other morning.",
]
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain recursion to a ten-year-old.",
    "Give me three ideas for a birthday party.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
    "Summarise the plot of Hamlet in two sentences.",
    "What are the benefits of unit tests?",
]

# (weight, approximate prompt words, max_tokens choices)
PROMPT_MIX = [
    (0.55, 0, (16, 32, 64)),  # a chat question
    (0.30, 150, (32, 64, 128)),  # a paragraph to summarise or rewrite
    (0.15, 700, (16, 32, 64)),  # a document to answer from
]


def draw(rng: random.Random) -> tuple[str, int]:
    """(prompt text, max_tokens) from PROMPT_MIX."""
    weights = [w for w, _, _ in PROMPT_MIX]
    _, words, max_tokens = rng.choices(PROMPT_MIX, weights)[0]
    question = rng.choice(QUESTIONS)
    if words == 0:
        return question, rng.choice(max_tokens)
    text: list[str] = []
    while sum(len(s.split()) for s in text) < words:
        text.append(rng.choice(SENTENCES))
    return " ".join(text) + "\n\nUsing the text above: " + question, rng.choice(max_tokens)


def embedding_inputs(rng: random.Random) -> list[str] | str:
    """One to eight short texts, as a batch embedding job sends them."""
    n = rng.choice((1, 1, 2, 4, 8))
    texts = [" ".join(rng.choice(SENTENCES) for _ in range(rng.randint(1, 4))) for _ in range(n)]
    return texts[0] if n == 1 else texts
