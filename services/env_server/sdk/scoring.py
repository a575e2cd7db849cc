"""Reusable scorers for text answers. Pure functions, tested on hand-made cases."""

from __future__ import annotations


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of one character each)."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, start=1):
        current = [i]
        for j, cb in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def similarity(answer: str, target: str) -> float:
    """1 − levenshtein(answer, target) / max(len(answer), len(target)); 1.0 when both are empty.

    Normalising by the longer string keeps the score in [0, 1] whatever the model writes."""
    longest = max(len(answer), len(target))
    if longest == 0:
        return 1.0
    return 1.0 - levenshtein(answer, target) / longest


def exact_match(answer: str, target: str) -> float:
    """1.0 when the answers agree after stripping surrounding whitespace, else 0.0."""
    return 1.0 if answer.strip() == target.strip() else 0.0
