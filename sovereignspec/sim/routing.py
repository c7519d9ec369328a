"""Where a tenant's arrivals go: the least busy of its replicas."""

from __future__ import annotations

import heapq

from sovereignspec.sim.state import Replica

_SLOT_BITS = 9  # a tenant has at most 256 replicas (scenario validation)
_SLOT_MASK = (1 << _SLOT_BITS) - 1
_ONE_BUSIER = 1 << _SLOT_BITS


class LeastBusy:
    """A tenant's replicas, by how busy they are (running + queued): the least busy one, ties to
    the first placed, without scanning them all on every arrival.

    A heap holds an entry `busy << SLOT_BITS | slot` (an int: cheaper to compare than a tuple) for
    each replica's current `busy`, and stale entries from earlier values, which are dropped when
    they surface (and all at once when they pile up)."""

    __slots__ = ("heap", "limit", "replicas")

    def __init__(self) -> None:
        self.replicas: list[Replica] = []
        self.heap: list[int] = []
        self.limit = 64

    def __bool__(self) -> bool:
        return bool(self.replicas)

    def add(self, r: Replica) -> None:
        if len(self.replicas) >= 1 << _SLOT_BITS:
            raise ValueError(f"a tenant has at most {1 << _SLOT_BITS} replicas here")
        r.slot = len(self.replicas)
        self.replicas.append(r)
        heapq.heappush(self.heap, r.busy << _SLOT_BITS | r.slot)
        self.limit = 4 * len(self.replicas) + 64

    def take(self) -> Replica:
        """The least busy replica, now one request busier."""
        heap, replicas = self.heap, self.replicas
        while True:
            entry = heap[0]
            r = replicas[entry & _SLOT_MASK]
            if r.busy == entry >> _SLOT_BITS:
                break
            heapq.heappop(heap)
        r.busy += 1
        heapq.heapreplace(heap, entry + _ONE_BUSIER)
        return r

    def release(self, r: Replica) -> None:
        """`r` finished a request."""
        r.busy -= 1
        heapq.heappush(self.heap, r.busy << _SLOT_BITS | r.slot)
        if len(self.heap) > self.limit:
            self.heap = [x.busy << _SLOT_BITS | x.slot for x in self.replicas]
            heapq.heapify(self.heap)
