"""The allocator setting every CLI process starts with (sovereignspec.heap)."""

from __future__ import annotations

import platform

import pytest

from sovereignspec.heap import keep_heap_pad


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_heap_pad():
    assert keep_heap_pad() is True
