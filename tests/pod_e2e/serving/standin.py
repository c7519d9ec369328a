"""A stand-in serving engine: prints the arguments it was started with and the decision the Pod carries."""

import json
import sys
import time
from pathlib import Path

PREFIX = "sovereignspec.io/"
ANNOTATIONS = "/etc/podinfo/annotations"


def annotations(path: Path) -> dict[str, str]:
    # The downward API writes one `key="value"` per line, the value quoted as a Go string (`\x00`,
    # `\a`: not JSON). Only SovereignSpec's own values are read, and they are plain ASCII JSON
    # strings; a neighbour's annotation (the test gives one every control character) is skipped.
    out = {}
    for line in path.read_text().split("\n"):
        key, _, value = line.partition("=")
        if key.startswith(PREFIX):
            out[key] = json.loads(value)
    return out


def main() -> int:
    # Called as `standin.py [--seconds N] ENGINE-ARGS...` by `sovereignspec launch`, which appends
    # the decision's engine arguments: print them, and the annotations they came from.
    args = sys.argv[1:]
    seconds = 0.0
    if args[:1] == ["--seconds"]:
        seconds, args = float(args[1]), args[2:]
    notes = {k[len(PREFIX) :]: v for k, v in annotations(Path(ANNOTATIONS)).items() if k.startswith(PREFIX)}
    print("SOVEREIGNSPEC-DECISION " + json.dumps(notes, sort_keys=True), flush=True)
    print("ENGINE-ARGV " + json.dumps(args), flush=True)
    time.sleep(seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
