"""Slot bookkeeping for continuous batching: which waiting samples get which KV-cache slots.

Pure: no torch, no threads. A request of n samples waits in FIFO order; whenever slots
are free, as many of its samples as fit are admitted together (they share one prefill),
the rest stay at the head of the queue. Finished or aborted samples hand their slot back
at once, so the next step can admit new work.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from rlrun.inference.engines.base import QueueFullError

Key = TypeVar("Key")


@dataclass
class Admission(Generic[Key]):
    """Samples first_index .. first_index + len(slots) - 1 of `key` go into `slots`."""

    key: Key
    first_index: int
    slots: list[int]


@dataclass
class _Waiting(Generic[Key]):
    key: Key
    next_index: int
    remaining: int


class SlotScheduler(Generic[Key]):
    def __init__(self, num_slots: int, max_waiting: int):
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        # Popped from the end: slot 0 goes first, which keeps tests readable.
        self._free = list(range(num_slots - 1, -1, -1))
        self._queue: deque[_Waiting[Key]] = deque()
        self.num_slots = num_slots
        self.max_waiting = max_waiting
        self.waiting_samples = 0

    @property
    def free_slots(self) -> int:
        return len(self._free)

    @property
    def waiting_requests(self) -> int:
        return len(self._queue)

    def enqueue(self, key: Key, samples: int) -> None:
        """Queues `samples` samples of `key`; raises QueueFullError past `max_waiting`."""
        if samples < 1:
            raise ValueError(f"samples must be >= 1, got {samples}")
        if self.waiting_samples + samples > self.max_waiting:
            raise QueueFullError(
                f"{self.waiting_samples} sequences are already waiting; {samples} more would exceed "
                f"inference.max_waiting = {self.max_waiting}"
            )
        self._queue.append(_Waiting(key, 0, samples))
        self.waiting_samples += samples

    def admit(self) -> list[Admission[Key]]:
        """Hands free slots to waiting samples, oldest request first."""
        admitted: list[Admission[Key]] = []
        while self._queue and self._free:
            head = self._queue[0]
            take = min(head.remaining, len(self._free))
            slots = [self._free.pop() for _ in range(take)]
            admitted.append(Admission(head.key, head.next_index, slots))
            head.next_index += take
            head.remaining -= take
            self.waiting_samples -= take
            if head.remaining == 0:
                self._queue.popleft()
        return admitted

    def release(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots or slot in self._free:
            raise ValueError(f"slot {slot} is not in use")
        self._free.append(slot)

    def drop(self, key: Key) -> int:
        """Removes the not-yet-admitted samples of `key`; returns how many there were."""
        dropped = 0
        kept: deque[_Waiting[Key]] = deque()
        for item in self._queue:
            if item.key is key:
                dropped += item.remaining
            else:
                kept.append(item)
        self._queue = kept
        self.waiting_samples -= dropped
        return dropped

    def drain(self) -> list[Key]:
        """Removes every waiting request; returns their keys, oldest first."""
        keys = [item.key for item in self._queue]
        self._queue.clear()
        self.waiting_samples = 0
        return keys
