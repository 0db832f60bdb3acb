"""A study joins a Ray cluster that someone else started: a head and a second node on this machine, each with one
logical GPU, the driver outside both (no GPU, no Ray of its own). Answers come from the H200 recording.

Each `ray start --block` runs in a process group of its own and is stopped by signalling that group alone, so
the test never touches Ray processes it did not start (no `ray stop`, which stops every Ray on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "tests" / "data" / "transpose_h200.db"
SPACE = ROOT / "search_spaces" / "transpose.yaml"
RAY = Path(sys.executable).with_name("ray")

pytestmark = pytest.mark.skipif(not RAY.exists(), reason="the ray command is not installed beside this Python")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _node_ports() -> list[str]:
    """Every port a node listens on, free ones: other Rays on this machine keep their defaults."""
    names = (
        "--node-manager-port",
        "--object-manager-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--metrics-export-port",
        "--runtime-env-agent-port",
    )
    return [a for name, port in zip(names, _free_ports(len(names)), strict=True) for a in (name, str(port))]


class _Node:
    def __init__(self, args: list[str], env: dict[str, str], log: Path):
        self.log = log
        self.proc = subprocess.Popen(
            [str(RAY), "start", "--block", *args],
            cwd=ROOT,
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # `ray start --block` stops the processes it started
            try:
                # A worker node's is gone within a second; a head's outlasts 30 s (its GCS waits), so the group
                # it leads (every process of that node, nothing else) is killed after a short grace.
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _wait_for_nodes(address: str, env: dict[str, str], count: int, timeout: float = 120.0) -> None:
    probe = (
        "import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False); "
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    deadline = time.time() + timeout
    while time.time() < deadline:
        proc = subprocess.run(
            [sys.executable, "-c", probe, address], env=env, capture_output=True, text=True, timeout=120
        )
        if proc.returncode == 0 and proc.stdout.strip().splitlines()[-1:] == [str(count)]:
            return
        time.sleep(1.0)
    raise AssertionError(f"the cluster at {address} did not reach {count} nodes")


@pytest.fixture
def cluster():
    # A short temp dir: Ray's socket paths must fit in 107 bytes.
    temp = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    (gcs_port,) = _free_ports(1)
    address = f"127.0.0.1:{gcs_port}"
    nodes = []
    try:
        nodes.append(
            _Node(
                [
                    "--head",
                    "--node-ip-address",
                    "127.0.0.1",
                    "--port",
                    str(gcs_port),
                    "--num-cpus",
                    "1",
                    "--num-gpus",
                    "1",
                    "--resources",
                    '{"head": 1}',
                    "--include-dashboard",
                    "false",
                    "--disable-usage-stats",
                    "--temp-dir",
                    str(temp),
                    *_node_ports(),
                ],
                env,
                temp / "head.log",
            )
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", gcs_port), timeout=1).close()
                break
            except OSError:
                assert nodes[0].proc.poll() is None, (temp / "head.log").read_text()[-3000:]
                time.sleep(0.5)
        nodes.append(
            _Node(
                [
                    "--address",
                    address,
                    "--node-ip-address",
                    "127.0.0.1",
                    "--num-cpus",
                    "1",
                    "--num-gpus",
                    "1",
                    "--resources",
                    '{"second": 1}',
                    "--disable-usage-stats",
                    *_node_ports(),
                ],
                env,
                temp / "second.log",
            )
        )
        _wait_for_nodes(address, env, 2)
        yield address, env
    finally:
        for node in reversed(nodes):
            node.stop()
        shutil.rmtree(temp, ignore_errors=True)


def test_study_joins_a_two_node_cluster_and_runs_on_both(cluster, tmp_path):
    address, env = cluster
    url = f"sqlite:///{tmp_path}/c.db"
    driver_env = {**env, "CUDA_VISIBLE_DEVICES": ""}  # the driver's machine needs no GPU
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tuner",
            "study",
            "transpose",
            "--space",
            str(SPACE),
            "--trials",
            "40",
            "--ray-address",
            address,
            "--replay",
            str(RECORDING),
            "--replay-delay",
            "0.05",
            "--gpus",
            "2",
            "--storage",
            url,
            "--seed",
            "2",
            "--json",
        ],
        cwd=ROOT,
        env=driver_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["trials"] == 40 and summary["startup"]["engine"] == "ray"
    study = optuna.load_study(study_name=summary["study"], storage=url)
    states = Counter(t.state.name for t in study.trials)
    evaluated = [t for t in study.trials if "screened" not in t.user_attrs]  # proposals not evaluated: screened
    assert len(evaluated) == 40 and states["RUNNING"] == 0 and states["COMPLETE"] > 0
    workers = [t.user_attrs["worker"] for t in study.trials if "worker" in t.user_attrs]
    assert workers, "no trial records the worker that answered it"
    nodes = {w["node"] for w in workers}
    assert len(nodes) == 2, f"trials ran on {nodes}"
    assert all(w["pid"] != os.getpid() and w["host"] for w in workers)
    # The two workers were the actors of the two nodes, as the summary lists them.
    assert {g["node"] for g in summary["gpus"]} == nodes
