"""A choice's text: decoded incrementally as its tokens stream, up to its first stop
sequence (one that ends past its first `min_tokens` tokens: vLLM lets a stop sequence be
drawn before min_tokens, it only does not end the choice there)."""

from __future__ import annotations

from collections.abc import Sequence

from rlrun.common.tokenizer import Tokenizer


def first_stop(text: str, stops: Sequence[str], start: int = 0, after: int = 0) -> int | None:
    """Where the earliest stop sequence in text[start:] that ends past text[:after] begins;
    None when there is none."""
    found = [at for at in (text.find(stop, max(start, after - len(stop) + 1)) for stop in stops) if at >= 0]
    return min(found) if found else None


def min_tokens_text(tokenizer: Tokenizer, token_ids: Sequence[int], min_tokens: int) -> int | None:
    """How many characters of text the first `min_tokens` tokens make, where a stop sequence
    may not end; None while there are fewer tokens than that (no stop sequence counts yet)."""
    if len(token_ids) < min_tokens:
        return None
    return len(tokenizer.decode(token_ids[:min_tokens])) if min_tokens else 0


def visible_text(
    tokenizer: Tokenizer, token_ids: Sequence[int], stops: Sequence[str], min_tokens: int = 0
) -> tuple[str, bool]:
    """A choice's text, ending before its first stop sequence (one that ends past its first
    `min_tokens` tokens), and whether one was found."""
    text = tokenizer.decode(token_ids)
    after = min_tokens_text(tokenizer, token_ids, min_tokens)
    cut = None if after is None else first_stop(text, stops, after=after)
    return (text, False) if cut is None else (text[:cut], True)


class TextStream:
    """Incremental detokenization of one sample: the text each new batch of tokens adds, up
    to the first stop sequence that ends past its first `min_tokens` tokens (then `stopped`).
    Holds back a trailing U+FFFD, the mark of a multi-byte character not yet complete, and
    the tail that could still begin a stop sequence; `finish` releases that tail once the
    sample has ended otherwise."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str] = (), min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.stops = list(stops)
        self.min_tokens = min_tokens
        self._after: int | None = None
        """`min_tokens_text` once the sample has min_tokens tokens (it does not change then)."""
        self.token_ids: list[int] = []
        self.emitted = ""
        self.stopped = False
        self._hold = max((len(stop) for stop in self.stops), default=1) - 1
        self._searched = 0

    def push(self, token_ids: Sequence[int]) -> str:
        if self.stopped:
            return ""
        self.token_ids += token_ids
        text = self.tokenizer.decode(self.token_ids)
        if text.endswith("\ufffd"):
            return ""
        if self._after is None:
            self._after = min_tokens_text(self.tokenizer, self.token_ids, self.min_tokens)
        cut = None
        if self._after is not None:
            cut = first_stop(text, self.stops, max(0, self._searched - self._hold), self._after)
        if cut is not None:
            self.stopped = True
            end = cut
        else:
            self._searched = len(text)
            end = len(text) - self._hold
        return self._emit(text, end)

    def finish(self) -> str:
        """The held-back tail, once the sample has ended without a stop sequence."""
        if self.stopped:
            return ""
        return self._emit(self.tokenizer.decode(self.token_ids), None)

    def _emit(self, text: str, end: int | None) -> str:
        start = len(self.emitted)
        if end is not None and end <= start:
            return ""
        self.emitted = text[:end]
        return self.emitted[start:]
