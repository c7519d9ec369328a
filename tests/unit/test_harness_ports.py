"""The harness binds no port in the kernel's ephemeral range, where a client connection can take it
between our check and our bind (a pod-e2e etcd once lost that race)."""

import re
from pathlib import Path

from localdev.ports import PORT_RANGE, free_port

REPO = Path(__file__).resolve().parents[2]
EPHEMERAL = (32768, 60999)
# A number set or passed as a port: `…PORT=33790`, `"…_PORT": "33790"`, `--…-port 33790`, `port: 33790`.
PORT_SETTING = re.compile(r"port\W{1,6}(\d{4,5})\b", re.IGNORECASE)


def _harness_files():
    for root in ("hack", "localdev", "tests", "benchmarks"):
        for path in (REPO / root).rglob("*"):
            if (
                path.suffix in {".sh", ".py", ".yaml", ".yml"}
                and path.is_file()
                and path.name != Path(__file__).name
            ):
                yield path


def test_no_fixed_port_of_the_harness_is_in_the_ephemeral_range():
    found = [
        f"{path.relative_to(REPO)}: {m.group(0)}"
        for path in _harness_files()
        for m in PORT_SETTING.finditer(path.read_text(errors="replace"))
        if EPHEMERAL[0] <= int(m.group(1)) <= EPHEMERAL[1]
    ]
    assert found == []


def test_the_port_pattern_finds_the_fixed_port_that_lost_a_bind_race():
    assert PORT_SETTING.search('"SOVEREIGNSPEC_ETCD_PORT": "33790",').group(1) == "33790"


def test_ports_the_harness_picks_lie_below_the_ephemeral_range():
    assert PORT_RANGE[1] < EPHEMERAL[0]
    ports = {free_port() for _ in range(50)}
    assert all(PORT_RANGE[0] <= p < PORT_RANGE[1] for p in ports)
    assert len(ports) == 50  # consecutive calls do not hand out the same port
