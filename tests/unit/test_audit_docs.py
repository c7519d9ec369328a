"""docs/audit.md shows a real export and what `audit verify --export` says of it: the page's own
export verifies as the page says, and the forgeries it describes are named as it says."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sovereignspec.cli import main
from sovereignspec.operator.roles import record

DOC = Path(__file__).resolve().parents[2] / "docs" / "audit.md"


def _block(kind: str, after: str = "") -> str:
    text = DOC.read_text()
    text = text[text.index(after) :] if after else text
    found = re.search(rf"```{kind}\n(.*?)```", text, re.S)
    assert found, f"no {kind} block in {DOC}"
    return found.group(1)


def _verify(tmp_path: Path, records: list[dict], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    path = tmp_path / "record.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    rc = main(["audit", "verify", "--export", str(path)])
    return rc, capsys.readouterr().out.replace(str(path), "record.jsonl").splitlines()


def test_the_pages_export_verifies_as_the_page_says(tmp_path, capsys) -> None:
    records = [json.loads(line) for line in _block("jsonl").splitlines()]
    assert [r["seq"] for r in records] == list(range(len(records)))
    said = _block("console", "The receiver checks it").splitlines()[1:]
    assert _verify(tmp_path, records, capsys) == (1, said)


def test_the_forgeries_the_page_describes_are_named_where_it_says(tmp_path, capsys) -> None:
    records = [json.loads(line) for line in _block("jsonl").splitlines()]
    records[1]["node"] = "somewhere-else"
    rc, out = _verify(tmp_path, records, capsys)
    assert rc == 1 and out[0] == (
        "audit verify: record 1 of segment record.jsonl: its digest is not its content's: "
        "edited after it was written"
    )
    records[1]["digest"] = record.digest_of(records[1])  # a careful forger
    rc, out = _verify(tmp_path, records, capsys)
    assert rc == 1 and out[0] == (
        "audit verify: record 2 of segment record.jsonl: it does not follow the record before it "
        "(removed, reordered or forked)"
    )
