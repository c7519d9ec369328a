"""One allocator setting for the placement hot path (glibc only; elsewhere nothing changes).

A decision over 2,000 GPUs allocates a few dozen arrays of about 140 KiB and frees them. glibc
gives the top of its heap back to the kernel whenever more than 128 KiB lies free there, so the
next decision faults the same pages in again: a fifth to a quarter of its time in `make bench`.
M_TOP_PAD makes the heap grow by a pad and keep that pad when it trims; 4 MiB covers one decision's
temporaries and costs at most that much resident memory."""

from __future__ import annotations

import ctypes

M_TOP_PAD = -2  # <malloc.h>
PAD_BYTES = 4 << 20


def keep_heap_pad(pad_bytes: int = PAD_BYTES) -> bool:
    """Ask glibc to keep `pad_bytes` at the top of the heap; False where there is no `mallopt`
    (musl, macOS) or it refused."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TOP_PAD, pad_bytes))
