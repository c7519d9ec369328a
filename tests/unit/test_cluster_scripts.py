"""The process helpers of hack/cluster-lib.sh, driven with small stand-in processes (no cluster).

cluster-up.sh starts etcd, kube-apiserver and Kueue through `bring_up`; what it does when one of
them dies during start-up decides whether the user (and CI) sees why.
"""

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def drive(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    """Run BODY in bash with cluster-lib.sh sourced and a throwaway state directory."""
    state = tmp_path / "state"
    (state / "pids").mkdir(parents=True)
    (state / "logs").mkdir()
    script = f"""
set -euo pipefail
export SOVEREIGNSPEC_CLUSTER_DIR={state}
source {REPO}/hack/cluster-lib.sh
{body}
"""
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60, check=False)
    # Whatever the script left running (the stand-in `sleep`) goes with the test.
    for pid_file in (state / "pids").glob("*.pid"):
        subprocess.run(["pkill", "-KILL", "-s", pid_file.read_text().strip()], check=False)
    return proc


def test_a_component_killed_during_start_up_is_started_once_more_and_its_end_reported(tmp_path):
    proc = drive(
        tmp_path,
        """
attempts=0
launch() {
  attempts=$((attempts + 1))
  if ((attempts == 1)); then
    start demo /bin/sh -c 'echo first attempt says boom; kill -KILL $$'
  else
    start demo /bin/sleep 30
    touch "$STATE_DIR/ready"
  fi
}
bring_up demo launch 20 test -e "$STATE_DIR/ready"
alive demo && echo "up after $attempts attempts"
""",
    )
    assert proc.returncode == 0, proc.stderr
    assert "up after 2 attempts" in proc.stdout
    assert "demo exited before becoming ready (killed by signal 9, SIGKILL)" in proc.stderr
    assert "first attempt says boom" in proc.stderr
    assert "starting demo once more" in proc.stderr
    assert (tmp_path / "state/logs/demo.first-attempt.log").read_text().strip() == "first attempt says boom"


def test_a_component_that_exits_twice_fails_with_its_exit_status_and_log(tmp_path):
    proc = drive(
        tmp_path,
        """
launch() { start demo /bin/sh -c 'echo "bad flag --frobnicate" >&2; exit 3'; }
bring_up demo launch 20 false
echo "not reached"
""",
    )
    assert proc.returncode == 1
    assert "not reached" not in proc.stdout
    assert proc.stderr.count("exited before becoming ready (exit status 3)") == 2
    assert proc.stderr.count("bad flag --frobnicate") == 2


def test_a_slow_component_is_not_restarted_but_reported_not_ready(tmp_path):
    proc = drive(
        tmp_path,
        """
launch() { start demo /bin/sleep 30; }
bring_up demo launch 1 false
""",
    )
    assert proc.returncode == 1
    assert "demo: not ready after 1s" in proc.stderr
    assert "once more" not in proc.stderr


def test_a_running_component_stays_alive_when_its_binary_file_is_replaced(tmp_path):
    # Rebuilding the binary cache while a control plane runs turns /proc/PID/exe into "… (deleted)";
    # the process is still ours, and cluster-down must still stop it.
    proc = drive(
        tmp_path,
        f"""
cp /bin/sleep {tmp_path}/sleep-copy
start demo {tmp_path}/sleep-copy 30
# Replace the file only once the process runs it (before its exec, removing it would stop the
# start, not test a running process): a loaded machine may take a while to get there.
for _ in $(seq 600); do [[ $(readlink /proc/$(pid_of demo)/exe) == */sleep-copy ]] && break; sleep 0.05; done
rm {tmp_path}/sleep-copy && cp /bin/sleep {tmp_path}/sleep-copy
alive demo && echo "still alive"
""",
    )
    assert proc.returncode == 0, proc.stderr
    assert "still alive" in proc.stdout


def test_a_recorded_pid_now_used_by_another_process_is_not_alive(tmp_path):
    # A reused PID belongs to a process that started after ours ended, so its start time differs.
    # Stand in for it with this pytest process, which started long before `demo` (start times count
    # clock ticks, 10 ms apart: a process started in the same tick would be indistinguishable, which
    # is why the test shell's own PID cannot stand in).
    proc = drive(
        tmp_path,
        f"""
start demo /bin/sleep 30
ours=$(pid_of demo)
alive demo || {{ echo "not alive right after start"; exit 1; }}
[[ $(started_at {os.getpid()}) != $(cat "$STATE_DIR/pids/demo.start") ]] || {{ echo "same tick"; exit 1; }}
echo {os.getpid()} >"$STATE_DIR/pids/demo.pid"
alive demo && verdict="a foreign process counted as ours" || verdict=""
echo "$ours" >"$STATE_DIR/pids/demo.pid"   # restored before any exit: cleanup kills what it names
[[ -z $verdict ]] || {{ echo "$verdict"; exit 1; }}
alive demo || {{ echo "ours no longer alive"; exit 1; }}
echo ok
""",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ok" in proc.stdout


def _session_calls(monkeypatch, ready: bool, stop: bool | None, fail: bool = False) -> tuple[list[str], str]:
    """What `controlplane.session` did (up/down) around a benchmark, with the scripts stood in."""
    import contextlib
    import io

    from localdev import controlplane

    calls: list[str] = []
    monkeypatch.setattr(controlplane, "is_ready", lambda: ready)
    monkeypatch.setattr(controlplane, "up", lambda: calls.append("up"))
    monkeypatch.setattr(controlplane, "down", lambda: calls.append("down"))
    out = io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.suppress(RuntimeError),
        controlplane.session("bench-x", stop=stop),
    ):
        calls.append("bench")
        if fail:
            raise RuntimeError("the benchmark broke")
    return calls, out.getvalue().strip().splitlines()[-1]


def test_a_benchmark_stops_the_control_plane_it_started_and_says_so_last(monkeypatch) -> None:
    calls, last = _session_calls(monkeypatch, ready=False, stop=None)
    assert calls == ["up", "bench", "down"] and "stopped" in last


def test_a_benchmark_leaves_a_control_plane_that_was_up_before_and_says_how_to_stop_it(monkeypatch) -> None:
    calls, last = _session_calls(monkeypatch, ready=True, stop=None)
    assert calls == ["up", "bench"] and "make cluster-down" in last


def test_a_benchmark_that_breaks_still_stops_what_it_started(monkeypatch) -> None:
    calls, _ = _session_calls(monkeypatch, ready=False, stop=None, fail=True)
    assert calls == ["up", "bench", "down"]


def test_a_benchmark_that_restarted_the_control_plane_with_its_own_flags_stops_it_either_way(
    monkeypatch,
) -> None:
    calls, _ = _session_calls(monkeypatch, ready=True, stop=True)
    assert calls == ["up", "bench", "down"]
