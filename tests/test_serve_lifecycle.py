"""`memory-service serve` owns its llama-server: it starts it, and never leaves it orphaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ServiceProcess

pytestmark = pytest.mark.process  # serve's start-up, SIGTERM and parent death

ROOT = Path(__file__).resolve().parents[1]


def _llama_children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == pid and b"llama-server" in cmdline:
            found.append(int(entry.name))
    return found


def _thread_niceness(pid: int) -> set[int]:
    """The niceness of every thread of a process (Linux keeps one per thread)."""
    out = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        out.add(int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pid: int, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("how, nice", [("sigterm", None), ("sigkill", "3")])
def test_serve_starts_its_own_llama_server_and_leaves_no_orphan(tmp_path, how, nice):
    """Also: every llama-server thread runs MEMORY_LLAMA_NICE (default 10) below the service's priority."""
    env = {k: v for k, v in os.environ.items() if k != "MEMORY_LLM_URL"}
    service = ServiceProcess(tmp_path / "data", None, {"MEMORY_MODEL": "tiny", "MEMORY_LLAMA_CTX": "2048"})
    service.env.pop("MEMORY_LLM_URL", None)
    service.env.pop("MEMORY_LLAMA_NICE", None)
    if nice is not None:
        service.env["MEMORY_LLAMA_NICE"] = nice
    service.env.update({k: v for k, v in env.items() if k.startswith("PATH")})
    service.start(timeout=180)
    try:
        children = _llama_children_of(service.proc.pid)
        assert len(children) == 1, children
        with service.client() as client:
            assert client.get("/ready").status_code == 200
        ours = os.getpriority(os.PRIO_PROCESS, service.proc.pid)
        expected = min(19, ours + int(nice or 10))
        threads = _thread_niceness(children[0])
        assert threads == {expected}, (threads, ours)
        if how == "sigterm":
            service.proc.send_signal(signal.SIGTERM)
            assert service.proc.wait(30) == 0
        else:
            service.proc.kill()
            service.proc.wait(10)
        assert _wait_gone(children[0]), f"llama-server {children[0]} outlived the service ({how})"
    finally:
        service.kill()


def test_refuses_to_listen_beyond_loopback_without_keys(tmp_path):
    env = {
        **os.environ,
        "MEMORY_HOST": "0.0.0.0",
        "MEMORY_API_KEYS": "",
        "MEMORY_DATA_DIR": str(tmp_path),
        "MEMORY_LLM_URL": "http://127.0.0.1:9",
    }
    result = subprocess.run(
        [sys.executable, "-m", "memory_service.cli.main", "serve"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "MEMORY_API_KEYS" in result.stderr and "0.0.0.0" in result.stderr


def test_bad_configuration_is_reported_not_a_traceback(tmp_path):
    env = {**os.environ, "MEMORY_PORT": "eighty", "MEMORY_DATA_DIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "memory_service.cli.main", "serve"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "MEMORY_PORT" in result.stderr and "Traceback" not in result.stderr


_RUNNER_PARENT = """
import sys, time
from pathlib import Path
from memory_service.testbed.service_runner import ServiceRunner
runner = ServiceRunner(Path(sys.argv[1]), api_keys={}, llm_url="http://127.0.0.1:9").start(timeout_s=180)
print(runner.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_eval_or_benchmark_takes_its_service_with_it(tmp_path):
    """The service an eval or a benchmark starts for itself gets SIGTERM when that parent dies, even by SIGKILL:
    an interrupted eval must not leave a service extracting in the background."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _RUNNER_PARENT, str(tmp_path / "data")], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    service_pid = None
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), f"the parent did not start its service: {line!r}"
        service_pid = int(line)
        assert _alive(service_pid)
        parent.kill()
        parent.wait(10)
        assert _wait_gone(service_pid, timeout=60), f"service {service_pid} outlived the process that started it"
    finally:
        parent.kill()
        if service_pid is not None and _alive(service_pid):
            os.killpg(service_pid, signal.SIGKILL)
