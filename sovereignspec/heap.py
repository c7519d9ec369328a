"""One allocator setting for the placement hot path (glibc only; elsewhere nothing changes).

A decision allocates a few dozen arrays of (draft lengths × GPUs) doubles and frees them: about
140 KiB each over 2,000 GPUs, 700 KiB over 10,000. Left alone, glibc gives the top of its heap back
to the kernel whenever more than 128 KiB lies free there, so the next decision faults the same
pages in again: a fifth to a quarter of its time in `make bench`. M_TOP_PAD makes the heap grow by a
pad and keep that pad when it trims. Setting it also freezes glibc's mmap threshold at 128 KiB (a
mallopt turns its dynamic threshold off), and every array above that is then mapped afresh and
faulted page by page: over 10,000 GPUs that was 720 page faults a decision, a quarter of its time.
So the threshold is set too, to glibc's own dynamic ceiling (32 MiB), and the pad covers one
10,000-GPU decision's temporaries. The pages the pad keeps are resident once touched: at most
PAD_BYTES of memory, about 15 MiB measured at 10,000 GPUs."""

from __future__ import annotations

import ctypes

M_TOP_PAD = -2  # <malloc.h>
M_MMAP_THRESHOLD = -3
PAD_BYTES = 32 << 20
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit


def keep_heap_pad(pad_bytes: int = PAD_BYTES, mmap_threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Ask glibc to keep `pad_bytes` at the top of the heap and to serve blocks under
    `mmap_threshold` from it; False where there is no `mallopt` (musl, macOS) or it refused."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_TOP_PAD, pad_bytes)) and bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold))
