"""Job ids are UUIDv7: unique and increasing, within a batch and across calls."""

from __future__ import annotations

import threading

from qforge.events.ids import new_id, new_ids


def test_ids_increase_within_and_across_batches_even_past_4096_per_millisecond():
    ids = new_ids(10_000) + [new_id() for _ in range(100)] + new_ids(3)
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert {i.version for i in ids} == {7}


def test_ids_from_many_threads_are_unique():
    found: list = []
    threads = [threading.Thread(target=lambda: found.extend(new_ids(2000))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(found)) == 16_000
