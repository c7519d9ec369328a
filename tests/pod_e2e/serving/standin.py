"""Print the SovereignSpec decision this Pod carries (downward API annotations file) as one JSON line."""

import json
import sys
import time
from pathlib import Path

PREFIX = "sovereignspec.io/"


def annotations(path: Path) -> dict[str, str]:
    # The downward API writes one `key="value"` per line, the value quoted as a Go string.
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        out[key] = json.loads(value)
    return out


def main() -> int:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else "/etc/podinfo/annotations")
    notes = {k[len(PREFIX) :]: v for k, v in annotations(path).items() if k.startswith(PREFIX)}
    config = notes.get("vllm-speculative-config")
    print("SOVEREIGNSPEC-DECISION " + json.dumps(notes, sort_keys=True), flush=True)
    if config:
        print("SOVEREIGNSPEC-VLLM " + json.dumps(json.loads(config), sort_keys=True), flush=True)
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
