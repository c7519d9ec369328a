"""`sovereignspec audit`: what cannot be read is one clear error naming the command and the place,
exit 2, for every subcommand alike (no cluster, a store that refuses)."""

from __future__ import annotations

import pytest

from sovereignspec.cli import main

# Port 1 on loopback: nothing listens there, so the S3 client's connection is refused at once.
UNREACHABLE = ["--audit-bucket", "records", "--audit-endpoint", "http://127.0.0.1:1"]


@pytest.fixture
def no_cluster(monkeypatch, tmp_path):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "reader")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    return ["audit", "--kubeconfig", str(tmp_path / "none")]


@pytest.mark.parametrize(
    ("extra", "command", "said"),
    [
        ([], "export", "audit: no cluster to read from"),
        ([], "verify", "audit: no cluster to read from"),
        (UNREACHABLE, "copy", "audit copy: no cluster to read from"),
        (UNREACHABLE, "export", "audit: reading the record in s3 bucket records at http://127.0.0.1:1"),
    ],
)
def test_an_audit_command_that_cannot_read_the_record_says_what_and_where(
    no_cluster, capsys, extra, command, said
) -> None:
    assert main([*no_cluster, *extra, command]) == 2
    assert said in capsys.readouterr().err
