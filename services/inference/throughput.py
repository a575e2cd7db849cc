"""Tokens per second over a sliding window (the `tokens_per_s` of GetStatus)."""

from __future__ import annotations

from collections import deque


class ThroughputMeter:
    """Counts events in (now - window_s, now]; the caller supplies the clock readings."""

    def __init__(self, window_s: float = 10.0):
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, got {window_s}")
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0

    def add(self, now: float, count: int) -> None:
        self._events.append((now, count))
        self._total += count
        self._expire(now)

    def rate(self, now: float) -> float:
        self._expire(now)
        if not self._events:
            return 0.0
        span = max(now - self._events[0][0], 1e-3)
        # The oldest event's tokens were produced before the window's first reading.
        return (self._total - self._events[0][1]) / span if len(self._events) > 1 else 0.0

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self.window_s:
            self._total -= self._events.popleft()[1]
