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
        process.elector(client.ApiClient(), args, "sovereignspec-controller")
    monkeypatch.setenv("POD_NAMESPACE", "sovereignspec-system")
    made = process.elector(client.ApiClient(), args, "sovereignspec-controller")
    assert made is not None and (made.namespace, made.name) == (
        "sovereignspec-system",
        "sovereignspec-controller",
    )
    assert process.elector(client.ApiClient(), argparse.Namespace(leader_elect=False), "x") is None
