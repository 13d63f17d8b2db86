"""The buffer pool behind the reader's chunks and the rewriter's output buffers."""

from __future__ import annotations

from tiering.kafka.buffers import BufferPool


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
