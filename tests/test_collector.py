"""The server freezes its long-lived objects once after start-up, so a full garbage collection stops the rounds
only for what requests made since (tev/util/collector.py)."""

import gc

from tev.util.collector import freeze_long_lived


class _Node:
    def __init__(self):
        self.other = None


def _cycles(count: int) -> list[_Node]:
    nodes = [_Node() for _ in range(2 * count)]
    for a, b in zip(nodes[::2], nodes[1::2]):  # pairs that hold each other: only the collector frees them
        a.other, b.other = b, a
    return nodes


def test_what_lives_at_start_is_frozen_and_what_requests_leave_is_still_collected():
    kept = _cycles(5_000)  # the long-lived objects (the models, the page) alive at start-up
    try:
        frozen = freeze_long_lived()
        assert frozen >= len(kept) and gc.get_freeze_count() == frozen
        walked = {id(obj) for generation in range(3) for obj in gc.get_objects(generation=generation)}
        assert not walked & {id(node) for node in kept}  # out of every generation a collection walks
        garbage = _cycles(1_000)  # a request's cycles, dropped: still freed by a collection after the freeze
        del garbage
        assert gc.collect() >= 2_000
    finally:
        gc.unfreeze()  # the test process's other tests collect as before
    assert gc.get_freeze_count() == 0
