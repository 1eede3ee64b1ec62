"""The server's compute lock: granted in the order asked, never starving a waiter, and an
interrupted waiter does not block the threads behind it."""

from __future__ import annotations

import threading
import time

import pytest

from tev.util.fair_lock import FairLock


def _wait_until(condition, timeout: float = 5.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_waiters_get_the_lock_in_the_order_they_asked():
    lock, order, asked = FairLock(), [], []
    lock.acquire()

    def worker(name):
        asked.append(name)
        with lock:
            order.append(name)

    threads = []
    for name in range(5):
        thread = threading.Thread(target=worker, args=(name,))
        thread.start()
        threads.append(thread)
        _wait_until(lambda: len(asked) == name + 1)
        time.sleep(0.02)  # the thread is now waiting on its ticket
    lock.release()
    for thread in threads:
        thread.join(5)
    assert order == [0, 1, 2, 3, 4]
    assert not lock.locked()


def test_a_thread_that_asks_again_at_once_does_not_starve_a_waiter():
    """A fine-tune taking step after step, a user's round waiting: the round gets its turn next."""
    lock, log, stop = FairLock(), [], threading.Event()

    def trainer():
        while not stop.is_set():
            with lock:
                log.append("step")
                time.sleep(0.002)

    thread = threading.Thread(target=trainer)
    thread.start()
    _wait_until(lambda: len(log) >= 3)
    rounds = 0
    for _ in range(20):
        with lock:
            log.append("round")
            rounds += 1
    stop.set()
    thread.join(5)
    # between two of the user's rounds the trainer took at most one step
    runs = "".join("r" if x == "round" else "s" for x in log[log.index("round"):])
    assert rounds == 20 and "ss" not in runs.rstrip("s")


def test_an_interrupted_waiter_gives_up_its_turn():
    lock = FairLock()
    lock.acquire()
    interrupted = threading.Event()

    class Interrupt(Exception):
        pass

    real_wait = lock._condition.wait

    def wait_then_interrupt(*args, **kwargs):
        if threading.current_thread().name == "impatient":
            interrupted.set()
            raise Interrupt()
        return real_wait(*args, **kwargs)

    lock._condition.wait = wait_then_interrupt
    failed = []

    def impatient():
        try:
            lock.acquire()
        except Interrupt:
            failed.append(True)

    thread = threading.Thread(target=impatient, name="impatient")
    thread.start()
    thread.join(5)
    assert failed == [True] and interrupted.is_set()
    lock._condition.wait = real_wait
    later = threading.Thread(target=lambda: (lock.acquire(), lock.release()))
    later.start()
    lock.release()  # the impatient ticket is skipped: the later thread gets the lock
    later.join(5)
    assert not later.is_alive() and not lock.locked()


def test_it_is_a_context_manager_and_reusable():
    lock = FairLock()
    for _ in range(3):
        with lock:
            assert lock.locked()
    assert not lock.locked()
    with pytest.raises(ValueError):
        with lock:
            raise ValueError("released on an error too")
    assert not lock.locked()
