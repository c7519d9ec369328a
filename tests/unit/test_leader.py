"""Who may take the leader Lease, and when (the rule; the protocol against a real API server is in
tests/cluster/test_leader_election.py)."""

from __future__ import annotations

import pytest
from kubernetes import client

from sovereignspec.operator.leader import LeaderElector, LeaseRecord, claim, micro_time

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

    from sovereignspec.operator import process

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
