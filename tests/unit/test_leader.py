"""Who may take the leader Lease, and when (the rule; the protocol against a real API server is in
tests/cluster/test_leader_election.py)."""

from __future__ import annotations

import copy
import json

import pytest
from kubernetes import client

from sovereignspec.operator.runtime.leader import (
    DECIDING,
    EXPIRY_MARGIN,
    LeaderElector,
    LeaseRecord,
    claim,
    inherited_from,
    micro_time,
)
from sovereignspec.operator.runtime.writer import NotLeaderError

NOW, BEFORE = "2026-12-04T09:00:00.000000Z", "2026-12-04T08:00:00.000000Z"
THEIRS = LeaseRecord("other_1", 15, BEFORE, BEFORE, 3)


@pytest.mark.parametrize(
    ("current", "unchanged_for", "want"),
    [
        (None, 0.0, LeaseRecord("me", 15, NOW, NOW, 0)),  # no Lease yet: create it
        (THEIRS, 0.0, None),  # another holder just renewed
        (THEIRS, 14.9, None),  # ... and its lease still runs on our clock
        (THEIRS, 15.0, LeaseRecord("me", 15, NOW, NOW, 4)),  # unrenewed for its duration: taken
        (LeaseRecord("", 1, BEFORE, BEFORE, 3), 0.0, LeaseRecord("me", 15, NOW, NOW, 4)),  # handed over
        (LeaseRecord("other_1", 0, BEFORE, BEFORE, 0), 0.5, None),  # no duration: a second, not none
        (LeaseRecord("other_1", 0, BEFORE, BEFORE, 0), 1.0, LeaseRecord("me", 15, NOW, NOW, 1)),
        # Our own: renewed, acquired when it was, no new transition, our duration now.
        (LeaseRecord("me", 30, BEFORE, BEFORE, 3), 100.0, LeaseRecord("me", 15, BEFORE, NOW, 3)),
    ],
)
def test_the_lease_is_taken_only_when_free_or_unrenewed_for_its_duration(current, unchanged_for, want):
    assert claim(current, unchanged_for, "me", NOW, 15) == want


def test_a_lease_reads_back_as_written():
    record = LeaseRecord("pod-a_1f2e", 15, BEFORE, NOW, 7)
    assert LeaseRecord.of({"spec": record.spec()}) == record
    assert LeaseRecord.of(None) is None
    # What another client may leave: fields missing or of the wrong type read as empty.
    assert LeaseRecord.of({"spec": {"leaseDurationSeconds": "15"}}) == LeaseRecord("", 0, "", "", 0)


def test_lease_times_are_microtimes_in_utc():
    assert micro_time(0.25) == "1970-01-01T00:00:00.250000Z"


@pytest.mark.parametrize(
    ("duration", "deadline", "retry"),
    [(10.0, 10.0, 2.0), (15.0, 10.0, 9.0), (15.0, 10.0, 0.0)],
)
def test_timings_that_would_let_a_standby_take_over_under_a_writing_leader_are_refused(
    duration, deadline, retry
):
    with pytest.raises(ValueError, match=r"lease duration > renew deadline > 1\.2 x retry period"):
        LeaderElector(client.ApiClient(), "ns", "lease", "me", duration, deadline, retry)


def test_leader_election_outside_a_pod_without_a_namespace_says_what_to_give(monkeypatch, tmp_path):
    import argparse

    from sovereignspec.operator.roles import process

    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    monkeypatch.setattr(process, "IN_CLUSTER_NAMESPACE", tmp_path / "absent")
    args = argparse.Namespace(leader_elect=True, leader_election_namespace=None, leader_election_id=None,
                              lease_duration=15.0, renew_deadline=10.0, retry_period=2.0)  # fmt: skip
    with pytest.raises(SystemExit, match="--leader-elect needs --leader-election-namespace"):
        process.elector(client.ApiClient(), args, "sovereignspec-controller", "me_1")
    monkeypatch.setenv("POD_NAMESPACE", "sovereignspec-system")
    made = process.elector(client.ApiClient(), args, "sovereignspec-controller", "me_1")
    assert made is not None and (made.namespace, made.name, made.identity) == (
        "sovereignspec-system",
        "sovereignspec-controller",
        "me_1",
    )
    assert process.elector(client.ApiClient(), argparse.Namespace(leader_elect=False), "x", "me_1") is None


class _SlowAnswers(LeaderElector):
    """A candidate whose API server answers its GETs after `delay` seconds of its own clock; it
    records the writes it would send."""

    def __init__(self, lease: LeaseRecord) -> None:
        self.now = 0.0
        self.delay = 0.0
        self.lease = lease
        self.writes: list[dict[str, object]] = []
        super().__init__(client.ApiClient(), "ns", "lease", "me", 15.0, 10.0, 2.0, monotonic=lambda: self.now)

    def _call(self, method, path, body=None):  # type: ignore[no-untyped-def]
        if method == "GET":
            self.now += self.delay
            return 200, {"metadata": {"resourceVersion": "1"}, "spec": self.lease.spec()}
        self.writes.append(body)
        return 200, body


def test_a_lease_is_seen_when_its_answer_arrives_so_a_slow_answer_never_ages_it():
    # Asked at 0, answered at 3: the holder may have renewed just before the answer. Seen at 3, it
    # runs to 18 on our clock (client-go's observedTime); dated from the question, it would be
    # taken at 15, while the holder may still write.
    candidate = _SlowAnswers(THEIRS)
    candidate.delay = 3.0
    assert candidate.try_acquire_or_renew() is False
    candidate.delay, candidate.now = 0.0, 15.0
    assert candidate.try_acquire_or_renew() is False and candidate.writes == []
    candidate.now = 18.0
    assert candidate.try_acquire_or_renew() is True and len(candidate.writes) == 1


def test_the_fence_yields_what_is_left_of_the_claim():
    candidate = _SlowAnswers(LeaseRecord("", 1, BEFORE, BEFORE, 3))  # handed over: ours at once
    assert candidate.try_acquire_or_renew() is True
    candidate._leader = True  # as `run` sets it on a first success
    candidate.now = 4.0
    with candidate.fence() as left:
        assert left == pytest.approx(10.0 - 4.0)
    assert candidate.term() == "me (term 4)"


class _OneLease:
    """One Lease as the API server keeps it: a write guarded by a resourceVersion that is not the
    current one is refused (409), as the real one refuses it."""

    def __init__(self) -> None:
        self.obj: dict | None = None
        self.version = 0

    def call(self, method: str, body: dict | None) -> tuple[int, dict]:
        if method == "GET":
            return (404, {}) if self.obj is None else (200, copy.deepcopy(self.obj))
        assert body is not None
        if method == "POST" and self.obj is not None:
            return 409, {}
        if method == "PUT" and (
            self.obj is None or body["metadata"].get("resourceVersion") != str(self.version)
        ):
            return 409, {}
        self.version += 1
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = str(self.version)
        return 200, copy.deepcopy(self.obj)


class _Replica(LeaderElector):
    """A replica on its own clock, reaching `lease` as every replica reaches the one Lease."""

    def __init__(self, lease: _OneLease, identity: str) -> None:
        self.now, self.lease = 0.0, lease
        super().__init__(
            client.ApiClient(), "ns", "lease", identity, 15.0, 10.0, 2.0, monotonic=lambda: self.now
        )

    def _call(self, method, path, body=None):  # type: ignore[no-untyped-def]
        return self.lease.call(method, body)

    def lead(self) -> None:
        assert self.try_acquire_or_renew() is True
        self._leader = True  # as `run` sets it on a first success


def deciding(lease: _OneLease) -> list[str]:
    assert lease.obj is not None
    return json.loads(lease.obj["metadata"]["annotations"][DECIDING])


def test_a_successor_inherits_what_its_predecessor_announced_last_and_the_predecessor_announces_no_more():
    lease = _OneLease()
    a, b = _Replica(lease, "a"), _Replica(lease, "b")
    a.lead()
    assert a.inherited == frozenset()  # no Lease before it: nothing can be on its way
    a.announce(["ns/one", "ns/two"])
    a.now = 1.0
    assert a.try_acquire_or_renew() is True and deciding(lease) == ["ns/one", "ns/two"]  # kept by a renewal
    a.announce(["ns/slow"])  # then a pauses (SIGSTOP), its clock with it
    assert b.try_acquire_or_renew() is False  # a's record, seen now
    b.now = 15.0
    b.lead()  # unrenewed for the lease's duration on b's clock: taken
    assert b.inherited == frozenset({"ns/slow"}) and deciding(lease) == []
    with pytest.raises(NotLeaderError, match="changed under a"):
        a.announce(["ns/late"])  # a resumes sure it leads (its own clock stood still): refused
    assert deciding(lease) == []  # and nothing of a's batch was named, so none of it may be sent


def test_a_lease_handed_over_names_nothing_on_its_way_and_one_without_announcements_names_everything():
    lease = _OneLease()
    a, b = _Replica(lease, "a"), _Replica(lease, "b")
    a.lead()
    a.announce(["ns/one"])
    assert a.release() is True  # its writes ended: nothing on its way
    b.lead()
    assert b.inherited == frozenset()
    assert inherited_from({"metadata": {}, "spec": {}}) is None  # an older version's Lease: unknown
    assert inherited_from({"metadata": {"annotations": {DECIDING: "{not json"}}}) is None
    assert inherited_from({"metadata": {"annotations": {DECIDING: '[1, "x"]'}}}) is None
    assert inherited_from(None) == frozenset()


def test_a_replica_that_does_not_lead_may_not_announce():
    a = _Replica(_OneLease(), "a")
    with pytest.raises(NotLeaderError):
        a.announce(["ns/one"])


def test_a_standby_tries_again_when_the_lease_it_sees_runs_out_not_a_retry_period_later():
    lease = _OneLease()
    a, b = _Replica(lease, "a"), _Replica(lease, "b")
    a.lead()
    b.now = 0.5
    assert b.try_acquire_or_renew() is False  # a's record, seen at 0.5: it runs to 15.5 on b's clock
    assert 2.0 <= b.next_try() <= 2.4  # far from its end: a retry period, jittered
    b.now = 14.0
    assert b.next_try() == pytest.approx(1.5 + EXPIRY_MARGIN)
    b.now = 15.5 - EXPIRY_MARGIN  # never sooner than its end: not taken early
    assert b.try_acquire_or_renew() is False
    b.now = 15.5 + EXPIRY_MARGIN
    assert b.try_acquire_or_renew() is True  # taken the moment it ran out
    b._leader = True
    assert 2.0 <= b.next_try() <= 2.4  # a leader renews every retry period


def test_a_standby_whose_round_failed_after_the_lease_ran_out_waits_a_retry_period_not_a_busy_loop():
    lease = _OneLease()
    a, b = _Replica(lease, "a"), _Replica(lease, "b")
    a.lead()
    assert b.try_acquire_or_renew() is False
    b.now = 30.0  # the lease ran out at 15; this round failed (the API refused it, say)
    assert 2.0 <= b.next_try() <= 2.4


def test_a_standby_counts_the_lease_from_the_renewal_its_watch_saw_not_from_its_next_read():
    lease = _OneLease()
    a, b = _Replica(lease, "a"), _Replica(lease, "b")
    a.lead()
    assert b.try_acquire_or_renew() is False  # a's first record, read at 0
    a.now = b.now = 1.0
    assert a.try_acquire_or_renew() is True  # a renews at 1, and then dies
    assert b.observe("MODIFIED", copy.deepcopy(lease.obj)) is False  # b's watch brings it at once
    b.now = 3.0
    assert b.try_acquire_or_renew() is False  # b's next read finds the record its watch saw: from 1
    b.now = 10.0
    b.observe("MODIFIED", copy.deepcopy(lease.obj))  # the same record again (a resumed watch): still from 1
    b.now = 16.0 - EXPIRY_MARGIN
    assert b.try_acquire_or_renew() is False  # never before the lease's end
    b.now = 16.0 + EXPIRY_MARGIN
    assert b.try_acquire_or_renew() is True  # 15 s after the renewal seen, not after the read at 3


def test_a_leader_ignores_the_watch_and_a_deleted_lease_is_seen_as_none():
    lease = _OneLease()
    a, b = _Replica(lease, "a"), _Replica(lease, "b")
    a.lead()
    seen = a._observed
    a.now = 5.0
    a.observe("MODIFIED", {"spec": {"holderIdentity": "someone", "leaseDurationSeconds": 15}})
    assert a._observed == seen  # its own writes say what the Lease holds
    b.observe("ADDED", copy.deepcopy(lease.obj))
    assert b._observed is not None and b._observed.holder == "a"
    b.observe("DELETED", copy.deepcopy(lease.obj))
    assert b._observed is None


def test_the_election_goes_on_to_lead_when_stopping_its_standby_watch_fails():
    class Failing:
        def stop(self) -> None:
            raise OSError(9, "Bad file descriptor")  # as urllib3's shutdown of a closed socket

    a = _Replica(_OneLease(), "a")
    a._watch = Failing()  # type: ignore[assignment]
    led: list[bool] = []

    def leads() -> None:
        led.append(True)
        a._stop.set()  # one round is enough

    a.on_started_leading = leads
    a.run()  # returned, not raised
    assert led == [True] and a._leader
