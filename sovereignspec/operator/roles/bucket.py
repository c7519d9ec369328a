"""The sovereignty record in an S3-compatible bucket under Object Lock (write once, read many).

Segment N is the object `PREFIX/audit-N.json`, written with COMPLIANCE retention until now +
`retention_days`: for that long no one (the root account included) may delete or overwrite that
version. Object Lock keeps versioning on, so a second PUT of the same key adds a newer version and
leaves the first intact. The first version written is the segment: readers take the oldest version
of each key, and a writer that finds an older version than its own lost the race for that segment
(another replica wrote it first) and appends after it, as a 409 makes it do in the cluster store.
A newer version (a loser's, or a forger's) changes nothing a reader sees; `later_versions` hands
them to `audit verify`, which names each one that is not a whole chain from where the first began.

Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN,
AWS_REGION), as every S3 client reads them; the chart fills them from a Secret.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import os
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import urllib3
from minio import Minio
from minio.commonconfig import COMPLIANCE
from minio.credentials.providers import EnvAWSProvider
from minio.error import MinioException, S3Error
from minio.retention import Retention

from sovereignspec.errors import ConfigError
from sovereignspec.operator.roles.audit import SegmentTakenError, StoreRefusedError


@contextlib.contextmanager
def refusals() -> Iterator[None]:
    """The SDK's, the server's and the transport's errors as the store's refusal, each named (a
    ValueError is the SDK failing to parse what the server answered)."""
    try:
        yield
    except S3Error as exc:
        raise StoreRefusedError(f"{exc.code}: {exc.message}") from None
    except (MinioException, ValueError, urllib3.exceptions.HTTPError) as exc:
        raise StoreRefusedError(f"{type(exc).__name__}: {exc}") from None


@dataclass
class BucketStore:
    """Segments as objects of one bucket (see the module's docstring)."""

    endpoint: str  # http(s)://host:port
    bucket: str
    prefix: str = "sovereignspec/audit/"
    retention_days: int = 400
    client: Minio = field(init=False, repr=False)

    def __post_init__(self) -> None:
        url = urllib.parse.urlsplit(self.endpoint)
        if url.scheme not in ("http", "https") or not url.netloc or url.path not in ("", "/"):
            raise ConfigError(
                f"audit bucket endpoint: got {self.endpoint!r}; expected http(s)://HOST[:PORT] with no path"
            )
        if not 1 <= self.retention_days <= 36500:
            raise ConfigError(f"audit bucket retention: got {self.retention_days} days; expected 1 to 36500")
        missing = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not os.environ.get(k)]
        if missing:  # found at start-up, not as every later write's refusal
            raise ConfigError(
                f"audit bucket {self.bucket}: no credentials: {' and '.join(missing)} not set in the "
                "environment (the chart sets them from the Secret that audit.bucket.credentialsSecret names)"
            )
        if self.prefix and not self.prefix.endswith("/"):
            self.prefix += "/"
        # A store that does not answer fails the write in seconds (and the decision waits, or
        # the backlog does), never a tick held for minutes of retries.
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=3.0, read=20.0),
            retries=urllib3.Retry(total=2, backoff_factor=0.2, status_forcelist=(500, 502, 503, 504)),
        )
        self.client = Minio(
            url.netloc,
            credentials=EnvAWSProvider(),
            secure=url.scheme == "https",
            region=os.environ.get("AWS_REGION") or None,
            http_client=http,
        )

    def where(self) -> str:
        return f"s3 bucket {self.bucket} at {self.endpoint} (prefix {self.prefix!r})"

    def key(self, index: int) -> str:
        return f"{self.prefix}audit-{index:012d}.json"

    def create(self, index: int, spec: dict[str, Any]) -> None:
        """Write segment `index` under retention; SegmentTakenError if another writer's came first."""
        data = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
        until = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(days=self.retention_days)
        key = self.key(index)
        with refusals():
            mine = self.client.put_object(
                self.bucket, key, io.BytesIO(data), len(data), content_type="application/json",
                retention=Retention(COMPLIANCE, until),
            ).version_id  # fmt: skip
            versions = self._versions(key)
        if not mine:
            raise StoreRefusedError(f"bucket {self.bucket} did not version {key}: is Object Lock enabled?")
        if versions and versions[-1] != mine:  # an older version: another writer's segment
            raise SegmentTakenError(key)

    def _versions(self, key: str) -> list[str]:
        """The version ids of `key`, newest first (as S3 lists them)."""
        return [
            str(o.version_id)
            for o in self.client.list_objects(self.bucket, prefix=key, include_version=True)
            if o.object_name == key and not o.is_delete_marker
        ]

    def read_segments(self) -> list[dict[str, Any]]:
        """Every segment (the oldest version of each key) as {"name", **spec}, in key order."""
        with refusals():
            oldest: dict[str, str] = {}
            for o in self.client.list_objects(self.bucket, prefix=self.prefix, include_version=True):
                if not o.is_delete_marker and o.object_name and o.version_id:
                    oldest[o.object_name] = str(o.version_id)  # newest first: the last one stays
            out = []
            for key, version in sorted(oldest.items()):
                spec = json.loads(self._read(key, version))
                out.append({"name": key.rpartition("/")[2].removesuffix(".json"), **spec})
            return out

    def _read(self, key: str, version: str) -> bytes:
        """One version of an object, its connection given back."""
        response = self.client.get_object(self.bucket, key, version_id=version)
        try:
            return bytes(response.read())
        finally:
            response.close()
            response.release_conn()

    def later_versions(self) -> list[tuple[str, str, dict[str, Any]]]:
        """Every version of a segment's key but its first, as (segment name, version id, its content;
        {} where it is not a JSON object), in key order, oldest first: what `audit verify` checks
        against the first (`record.verify_rewrite`)."""
        with refusals():
            versions: dict[str, list[str]] = {}
            for o in self.client.list_objects(self.bucket, prefix=self.prefix, include_version=True):
                if not o.is_delete_marker and o.object_name and o.version_id:
                    versions.setdefault(o.object_name, []).append(str(o.version_id))  # newest first
            out = []
            for key, ids in sorted(versions.items()):
                for version in reversed(ids[:-1]):
                    try:
                        content = json.loads(self._read(key, version))
                    except ValueError:
                        content = {}
                    name = key.rpartition("/")[2].removesuffix(".json")
                    out.append((name, version, content if isinstance(content, dict) else {}))
            return out
