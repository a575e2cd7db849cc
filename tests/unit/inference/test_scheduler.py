"""Slot bookkeeping: FIFO admission, shared admission of a request's samples, slot reuse."""

import pytest

from rlrun.inference.engines.base import QueueFullError
from rlrun.inference.engines.scheduler import SlotScheduler


def test_samples_of_a_request_are_admitted_together_and_in_order():
    scheduler = SlotScheduler(num_slots=4, max_waiting=100)
    scheduler.enqueue("a", 3)
    scheduler.enqueue("b", 2)
    first = scheduler.admit()
    assert [(a.key, a.first_index, a.slots) for a in first] == [("a", 0, [0, 1, 2]), ("b", 0, [3])]
    assert scheduler.waiting_samples == 1 and scheduler.waiting_requests == 1
    assert scheduler.admit() == []
    scheduler.release(1)
    [rest] = scheduler.admit()
    assert (rest.key, rest.first_index, rest.slots) == ("b", 1, [1])
    assert scheduler.waiting_requests == 0


def test_dropping_a_request_removes_only_its_waiting_samples():
    scheduler = SlotScheduler(num_slots=1, max_waiting=100)
    a, b = object(), object()
    scheduler.enqueue(a, 2)
    scheduler.enqueue(b, 1)
    scheduler.admit()
    assert scheduler.drop(a) == 1
    scheduler.release(0)
    [admitted] = scheduler.admit()
    assert admitted.key is b


def test_a_full_queue_refuses_more_samples():
    scheduler = SlotScheduler(num_slots=1, max_waiting=3)
    scheduler.enqueue("a", 2)
    with pytest.raises(QueueFullError, match="max_waiting"):
        scheduler.enqueue("b", 2)
    scheduler.enqueue("c", 1)


def test_releasing_a_free_slot_is_a_bug():
    scheduler = SlotScheduler(num_slots=2, max_waiting=3)
    with pytest.raises(ValueError, match="not in use"):
        scheduler.release(0)


def test_drain_returns_every_waiting_request():
    scheduler = SlotScheduler(num_slots=1, max_waiting=10)
    for key in "abc":
        scheduler.enqueue(key, 1)
    scheduler.admit()
    assert scheduler.drain() == ["b", "c"]
    assert scheduler.waiting_samples == 0
