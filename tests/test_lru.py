"""The one least-recently-used store (tev/util/lru.py)."""

import pytest

from tev.util.lru import LRU


def test_a_put_past_the_capacity_drops_the_least_recently_used():
    store = LRU(2)
    store.put("a", 1)
    store.put("b", 2)
    assert store.get("a") == 1  # a is now the most recent
    store.put("c", 3)
    assert store.keys() == ["a", "c"] and store.peek("b") is None
    store.put("a", 4)  # a replaced, the most recent
    assert store.keys() == ["c", "a"] and store.values() == [3, 4] and len(store) == 2


def test_peek_leaves_the_order_and_get_or_put_makes_once():
    store = LRU(2)
    store.put("a", 1)
    store.put("b", 2)
    assert store.peek("a") == 1 and store.keys() == ["a", "b"]
    made = []
    assert store.get_or_put("a", lambda: made.append(1) or 9) == 1 and not made and store.keys() == ["b", "a"]
    assert store.get_or_put("c", lambda: 7) == 7 and store.keys() == ["a", "c"]
    assert store.get("missing", "none") == "none"
    with pytest.raises(ValueError, match="at least one entry"):
        LRU(0)
