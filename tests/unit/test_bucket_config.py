"""The record's bucket, configured wrong: refused at start-up with what is wrong and what is
accepted, before any decision waits on a store that can never answer."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from sovereignspec.errors import ConfigError
from sovereignspec.operator.roles.bucket import BucketStore

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"}


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)


@pytest.mark.parametrize(
    ("endpoint", "days", "said"),
    [
        ("s3.example.internal:9000", 30, "expected http(s)://HOST[:PORT] with no path"),
        ("https://s3.example.internal/bucket", 30, "expected http(s)://HOST[:PORT] with no path"),
        ("https://s3.example.internal", 0, "got 0 days; expected 1 to 36500"),
    ],
)
def test_a_malformed_endpoint_or_retention_is_refused_naming_what_is_accepted(
    credentials: None, endpoint: str, days: int, said: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(said)):
        BucketStore(endpoint, "record", retention_days=days)


@pytest.mark.parametrize("missing", ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"])
def test_a_bucket_without_credentials_is_refused_naming_the_variable_and_the_charts_secret(
    credentials: None, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.delenv(missing)
    with pytest.raises(ConfigError) as refused:
        BucketStore("https://s3.example.internal", "record")
    assert f"no credentials: {missing} not set" in str(refused.value)
    assert "audit.bucket.credentialsSecret" in str(refused.value)


def test_the_audit_command_without_credentials_exits_2_saying_so() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run(
        [sys.executable, "-m", "sovereignspec.cli", "audit", "--audit-bucket", "record",
         "--audit-endpoint", "http://127.0.0.1:9", "export"],
        capture_output=True, text=True, check=False, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert "no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY not set" in done.stderr, done.stderr
