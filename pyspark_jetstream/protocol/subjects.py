"""NATS subject matching: which subjects a pattern covers, and whether two patterns share any.

Subjects are ``.``-separated tokens; in a pattern ``*`` matches exactly one
token and ``>`` (last token only) matches one or more.  Pure functions.
"""

from __future__ import annotations


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether the concrete ``subject`` is delivered to a subscription on ``pattern``."""
    wanted, given = pattern.split("."), subject.split(".")
    for i, token in enumerate(wanted):
        if token == ">":
            return len(given) > i
        if i >= len(given) or (token != "*" and token != given[i]):
            return False
    return len(given) == len(wanted)


def subjects_overlap(a: str, b: str) -> bool:
    """Whether some concrete subject matches both patterns ``a`` and ``b``."""
    left, right = a.split("."), b.split(".")
    for i in range(max(len(left), len(right))):
        x = left[i] if i < len(left) else None
        y = right[i] if i < len(right) else None
        if x == ">" or y == ">":
            # The other still needs at least one token here (or is '>' itself).
            return x is not None and y is not None
        if x is None or y is None:
            return False
        if "*" not in (x, y) and x != y:
            return False
    return True
