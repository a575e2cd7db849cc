"""The public channel of a member's message in a multi-agent episode.

A member may think in private inside `<think>...</think>`: the other members see only what
lies outside the think blocks. Markup that does not parse (an unclosed block, a stray close
tag, a nested open tag) is malformed: nothing of such a message is public, because there is
no telling which part of it was meant to stay private.
"""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def public_text(text: str) -> str | None:
    """The text outside the think blocks, stripped; None when the markup is malformed."""
    public: list[str] = []
    rest = text
    while True:
        opening, closing = rest.find(THINK_OPEN), rest.find(THINK_CLOSE)
        if opening < 0:
            if closing >= 0:
                return None
            public.append(rest)
            return "".join(public).strip()
        if 0 <= closing < opening:
            return None
        public.append(rest[:opening])
        rest = rest[opening + len(THINK_OPEN) :]
        closing = rest.find(THINK_CLOSE)
        if closing < 0 or THINK_OPEN in rest[:closing]:
            return None
        rest = rest[closing + len(THINK_CLOSE) :]
