"""The buffer pool behind the reader's chunks and the rewriter's output buffers; the collector's pause."""

from __future__ import annotations

import gc
import io
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tiering.errors import CorruptBatchError
from tiering.kafka.buffers import BufferPool, collector_paused
from tiering.kafka.codecs import Codec
from tiering.kafka.rewrite import RewriteOptions, rewrite_segment


def test_a_buffer_is_handed_out_again_once_no_view_of_it_is_alive() -> None:
    pool = BufferPool(64, keep=2)
    first = pool.take()
    view = memoryview(first)[8:16]  # a derived view holds the buffer
    second = pool.take()
    assert second is not first
    view.release()
    assert pool.take() is first


def test_oversized_buffers_are_fresh_and_not_kept() -> None:
    pool = BufferPool(64, keep=2)
    big = pool.take(100)
    assert len(big) == 100
    assert pool.spare == []
    assert pool.take(100) is not big
    assert len(pool.take(10)) == 64


def test_at_most_keep_buffers_are_kept() -> None:
    pool = BufferPool(16, keep=2)
    views = [memoryview(pool.take()) for _ in range(5)]  # all in use: five distinct buffers
    assert len({id(v.obj) for v in views}) == 5
    assert len(pool.spare) == 2


@pytest.fixture
def collector_on() -> Iterator[None]:
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.mark.usefixtures("collector_on")
def test_the_collector_is_paused_for_the_block_and_restored_by_the_last_one_out() -> None:
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block must not turn it back on under the outer one
    assert gc.isenabled()
    with pytest.raises(ValueError, match="in the block"), collector_paused():
        raise ValueError("in the block")
    assert gc.isenabled()


@pytest.mark.usefixtures("collector_on")
def test_concurrent_pauses_end_with_the_collector_as_the_first_found_it() -> None:
    """Two threads' blocks overlap, the first to enter leaves first: the collector stays off until the
    second leaves (as rewrites on a thread pool overlap)."""
    entered, leave_first = threading.Event(), threading.Event()
    states: list[bool] = []

    def first() -> None:
        with collector_paused():
            entered.set()
            leave_first.wait(5)
        states.append(gc.isenabled())  # the second block still runs

    worker = threading.Thread(target=first)
    worker.start()
    entered.wait(5)
    with collector_paused():
        leave_first.set()
        worker.join(5)
        states.append(gc.isenabled())
    assert states == [False, False]
    assert gc.isenabled()


def test_a_collector_found_off_stays_off() -> None:
    was = gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        if was:
            gc.enable()


@pytest.mark.usefixtures("collector_on")
def test_a_rewrite_runs_with_the_collector_paused_and_gives_it_back_even_when_it_fails() -> None:
    from tests.golden import SEGMENTS, log_path

    seen: list[bool] = []

    class Watched(io.BytesIO):
        def readinto(self, buffer: Any) -> int:
            seen.append(gc.isenabled())
            return super().readinto(buffer)

    data = log_path(SEGMENTS[0]).read_bytes()
    rewrite_segment(Watched(data), io.BytesIO(), base_offset=SEGMENTS[0]["base_offset"],
                    options=RewriteOptions(Codec.ZSTD, 3))
    assert seen
    assert not any(seen)
    assert gc.isenabled()
    with pytest.raises(CorruptBatchError):
        rewrite_segment(io.BytesIO(data[:-3]), io.BytesIO(), base_offset=SEGMENTS[0]["base_offset"],
                        options=RewriteOptions(Codec.ZSTD, 3))
    assert gc.isenabled()
