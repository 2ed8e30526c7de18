"""Four built-in prompt types for quick sweeps (chat-formatted user turns)."""

from __future__ import annotations

_ARTICLE = """\
The James Webb Space Telescope (JWST) is a space telescope designed to conduct infrared astronomy. \
Its high-resolution and high-sensitivity instruments allow it to view objects too old, distant, or \
faint for the Hubble Space Telescope. This enables investigations across many fields of astronomy \
and cosmology, such as observation of the first stars and the formation of the first galaxies, and \
detailed atmospheric characterization of potentially habitable exoplanets. The telescope was launched \
on 25 December 2021 on an Ariane 5 rocket from Kourou, French Guiana, and arrived at the Sun-Earth L2 \
Lagrange point in January 2022. Its primary mirror consists of 18 hexagonal mirror segments made of \
gold-plated beryllium, which combined create a 6.5-meter-diameter mirror, considerably larger than \
Hubble's 2.4 m. The telescope must be kept extremely cold, below 50 K, so that infrared light emitted \
by the telescope itself does not interfere with the collected light; a five-layer sunshield protects \
it from warming by the Sun, Earth, and Moon."""

_CODE = """\
def parse_records(lines):
    records = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, age, city = line.split(",")
        records.append({"name": name.strip(), "age": int(age), "city": city.strip()})
    return records


def average_age(records):
    if not records:
        return 0
    return sum(r["age"] for r in records) / len(records)"""

PROMPTS: dict[str, str] = {
    "code": "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring "
    "and a short usage example.",
    "chat": "I am planning a three-day trip to Kyoto in autumn. What should I see and how should I organise the days?",
    "summarization": f"{_ARTICLE}\n\nSummarize the article above in three sentences.",
    "code-edit": f"{_CODE}\n\nRewrite this code with type hints and docstrings, keeping the behaviour the same.",
}
