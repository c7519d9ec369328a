"""A leader's writes in segments, each segment's placements named in the Lease before any of it is
sent (`Role.send`): what a successor seals, and nothing of a segment sent when naming it failed."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from sovereignspec.operator.roles import role
from sovereignspec.operator.roles.role import ANNOUNCE_KEYS, Role, _segments
from sovereignspec.operator.runtime.writer import NotLeaderError


def placing(item: str) -> str | None:
    return item if item.startswith("place") else None


@pytest.mark.parametrize(
    ("items", "cuts"),
    [
        ([], []),
        (["wait-1", "wait-2"], [(2, 0)]),  # nothing placed: one segment, nothing to name
        ([f"place-{i}" for i in range(ANNOUNCE_KEYS)], [(ANNOUNCE_KEYS, ANNOUNCE_KEYS)]),
        ([f"place-{i}" for i in range(ANNOUNCE_KEYS + 1)], [(ANNOUNCE_KEYS, ANNOUNCE_KEYS), (1, 1)]),
        # Writes that place nothing ride along without counting.
        (["wait-0", *(f"place-{i}" for i in range(ANNOUNCE_KEYS)), "wait-1", "place-x"],
         [(ANNOUNCE_KEYS + 2, ANNOUNCE_KEYS), (1, 1)]),
    ],
)  # fmt: skip
def test_writes_are_cut_into_segments_of_at_most_so_many_placements_in_order(items, cuts) -> None:
    segments = list(_segments(items, placing))
    assert [(len(s), len(k)) for s, k in segments] == cuts
    assert [i for s, _ in segments for i in s] == items
    assert all(k == [i for i in s if placing(i)] for s, k in segments)


class _Writer:
    def __init__(self, refuse_after: int) -> None:
        self.log: list[tuple[str, object]] = []
        self.refuse_after = refuse_after

    def announce(self, keys: list[str]) -> None:
        if sum(1 for what, _ in self.log if what == "announce") >= self.refuse_after:
            raise NotLeaderError("the Lease changed under me")
        self.log.append(("announce", list(keys)))


def _role(monkeypatch, refuse_after: int) -> Role:
    monkeypatch.setattr(role, "ANNOUNCE_KEYS", 2)
    r = Role.__new__(Role)  # only what `send` uses: the writer's announcement and the pool
    r.writer = _Writer(refuse_after=refuse_after)  # type: ignore[assignment]
    r._pool = ThreadPoolExecutor(2)
    return r


def test_a_segment_is_sent_only_after_its_placements_are_named_and_not_at_all_when_naming_fails(
    monkeypatch,
) -> None:
    r = _role(monkeypatch, refuse_after=2)

    def write(item: str) -> str:
        r.writer.log.append(("write", item))  # type: ignore[attr-defined]
        return "placed" if placing(item) else "waiting"

    items = ["place-a", "wait-b", "place-c", "place-d", "place-e", "wait-f", "place-g"]
    outcomes = r.send(items, placing, write)
    # Segments: a b c | d e f | g; the third's naming is refused.
    assert outcomes == ["placed", "waiting", "placed", "placed", "placed", "waiting", "error"]
    log = r.writer.log  # type: ignore[attr-defined]
    first = log.index(("announce", ["place-a", "place-c"]))
    second = log.index(("announce", ["place-d", "place-e"]))
    writes = {item: log.index(("write", item)) for what, item in log if what == "write"}
    assert first < writes["place-a"] and first < writes["wait-b"] and first < writes["place-c"]
    # The next segment named only once the last one's writes have ended.
    assert max(writes["place-a"], writes["wait-b"], writes["place-c"]) < second < writes["place-d"]
    assert "place-g" not in writes  # not named: not sent


def test_the_record_ahead_runs_beside_the_first_announcement_and_a_placement_it_holds_is_named_not_sent(
    monkeypatch,
) -> None:
    r = _role(monkeypatch, refuse_after=5)
    log = r.writer.log  # type: ignore[attr-defined]
    named = threading.Event()
    r.writer.announce = lambda keys: (log.append(("announce", list(keys))), named.set())  # type: ignore[method-assign]

    def ahead(items: list[str]) -> list[str]:
        # Waits for the announcement: were the two in turn (the record first), it would never come.
        assert named.wait(10), "the first announcement did not go out beside the record"
        log.append(("recorded", None))
        return [i.replace("place-c", "held-c") for i in items]  # c's record failed: held

    def write(item: str) -> str:
        log.append(("write", item))
        return "placed" if placing(item) else "waiting"

    sent, outcomes = r.send_recorded(["place-a", "wait-b", "place-c", "place-d"], placing, write, ahead)
    assert sent == ["place-a", "wait-b", "held-c", "place-d"]
    assert outcomes == ["placed", "waiting", "waiting", "placed"]
    # Named as they were before the record (c too); sent only after both the record and the name.
    assert log.index(("announce", ["place-a", "place-c"])) < log.index(("write", "place-a"))
    assert log.index(("recorded", None)) < min(
        log.index(("write", i)) for i in ("place-a", "wait-b", "held-c")
    )
    assert ("write", "place-c") not in log
    assert [k for what, k in log if what == "announce"] == [["place-a", "place-c"], ["place-d"]]  # each once
    assert (
        log.index(("write", "held-c"))
        < log.index(("announce", ["place-d"]))
        < log.index(("write", "place-d"))
    )


def test_a_first_segment_whose_naming_failed_is_not_sent_after_its_record(monkeypatch) -> None:
    r = _role(monkeypatch, refuse_after=0)
    sent, outcomes = r.send_recorded(["place-a", "wait-b"], placing, lambda _i: "placed", lambda items: items)
    assert sent == ["place-a", "wait-b"] and outcomes == ["error", "error"]
    with pytest.raises(ValueError, match="kept 1 of 2"):
        r.send_recorded(["place-a", "wait-b"], placing, lambda _i: "placed", lambda items: items[:1])
