"""The OpenVINO backend (``openvino``: partitioner, NNCF quantizer, preprocess) hosted by a
server in its own environment (``make venv-openvino``: OpenVINO and NNCF pin numpy below the
main environment's), against local lowering in that environment.

Each lowering runs in a fresh process (``tests/openvino_flow.py``), as a user's script would, as
ExecuTorch's suite flows ``openvino`` and ``openvino_int8`` build it:

* a client in the OpenVINO environment with every OpenVINO and NNCF module blocked (the client
  without the toolchain) quantizes with ``RemoteQuantizer`` and lowers with
  ``RemotePartitioner(remote_preprocess=True)``, and gets the local program and generator
  state;
* a client in the main environment (no OpenVINO package at all) gets the same program;
* the server sends no telemetry: after quantizing and lowering, its home directory is empty
  and nothing tried to reach the network through the proxy its environment names; what
  OpenVINO's partitioner prints ("Op not supported: ...") stays out of its stdout.

"The same program" is compared after :func:`conformance.normalize_openvino`: OpenVINO names
nodes from a process-wide counter (``Constant_4994``), so a warm server's blob names differ from
a fresh client's; everything else is compared as it is.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flows import run_flow
from script_modules import conformance_script
from servers import launch, served

pytestmark = pytest.mark.slow  # fresh processes that import OpenVINO and NNCF

ROOT = Path(__file__).resolve().parent.parent
OPENVINO_PYTHON = Path(
    os.environ.get("OPENVINO_PYTHON", ROOT / ".venv-openvino" / "bin" / "python")
)
FLOW = Path(__file__).with_name("openvino_flow.py")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

CASES = [  # (model, quantize, spec)
    ("conv", False, {}),
    ("linear", False, {}),
    ("conv", True, {}),
    ("linear", True, {"mode": "int8_mixed"}),
    ("partial", False, {}),
]


class _Listener:
    """A loopback TCP listener standing in for the network (the server's proxy): records
    every connection it accepts until closed."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.accepted.append(conn.recv(200))
                except OSError:
                    self.accepted.append(b"")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture(scope="module")
def openvino_python() -> str:
    """The OpenVINO environment's interpreter; outside CI, the tests skip when it is not
    built."""
    if not OPENVINO_PYTHON.exists():
        if IN_CI:
            pytest.fail(f"CI=true but the OpenVINO environment is missing: {OPENVINO_PYTHON}")
        pytest.skip("the OpenVINO environment is not built (make venv-openvino)")
    return str(OPENVINO_PYTHON)


@pytest.fixture(scope="module")
def openvino_server(
    openvino_python: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A server in the OpenVINO environment hosting the OpenVINO family only, on a free
    loopback port, with an empty home directory of its own, outside CI as far as OpenVINO's
    telemetry can tell (``CI`` empty: it stays quiet in CI), and every proxy variable naming a
    loopback listener (the network, as the telemetry would reach it)."""
    home = tmp_path_factory.mktemp("openvino-home")
    log = tmp_path_factory.mktemp("openvino-server") / "server.log"
    network = _Listener()
    proxy = f"http://127.0.0.1:{network.port}"
    env = {"HOME": str(home), "CI": "", "https_proxy": proxy, "http_proxy": proxy,
           "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "no_proxy": "", "NO_PROXY": ""}
    launched = launch(log, "--backends", "openvino", "--environment", "openvino",
                      env=env, python=openvino_python)
    try:
        with served(launched) as (_, target, _):
            yield {"target": target, "launched": launched, "log": log, "home": home,
                   "network": network}
    finally:
        network.close()


def _flow(python: str, mode: str, jobs: list[dict[str, Any]], target: str = "") -> Any:
    """Run tests/openvino_flow.py; its summary (OpenVINO modules loaded, generator states,
    stdout)."""
    return run_flow(python, FLOW, mode, jobs, target)


def _jobs(tmp_path: Path, tag: str, cases: list[tuple[str, bool, dict[str, Any]]]) -> Any:
    return [
        {"model": model, "quantize": quantize, "spec": spec,
         "out": str(tmp_path / f"{tag}-{model}-{i}.pte")}
        for i, (model, quantize, spec) in enumerate(cases)
    ]


def _assert_same_programs(local: list[dict[str, Any]], remote: list[dict[str, Any]]) -> None:
    normalize = conformance_script().normalize_openvino
    for a, b in zip(local, remote, strict=True):
        want, got = (normalize(Path(j["out"]).read_bytes()) for j in (a, b))
        assert want == got, (a["model"], a["quantize"], a["spec"])
        delegates = [d.id for p in want.program.execution_plan for d in p.delegates]
        assert delegates and set(delegates) == {"OpenvinoBackend"}  # (compared something)


def test_a_client_without_openvino_gets_the_local_program(
    openvino_python: str, openvino_server: dict[str, Any], tmp_path: Path
) -> None:
    local, remote = _jobs(tmp_path, "local", CASES), _jobs(tmp_path, "remote", CASES)
    want = _flow(openvino_python, "local", local)
    got = _flow(openvino_python, "remote", remote, openvino_server["target"])
    assert got["openvino_modules_loaded"] == []  # the client imported nothing of OpenVINO's
    assert want["openvino_modules_loaded"]  # (and the local one did: the block is what differs)
    _assert_same_programs(local, remote)
    assert got["rng_after"] == want["rng_after"]
    # The partitioner prints each operator it does not support, on the server as locally: not
    # to the server's stdout.
    assert "Op not supported" in want["stdout"]
    printed = []
    while True:
        try:
            line = openvino_server["launched"].lines.get_nowait()
        except queue.Empty:
            break
        if line is not None:
            printed.append(line)
    assert printed == []


def test_a_client_with_no_openvino_package_gets_the_same_program(
    openvino_python: str, openvino_server: dict[str, Any], tmp_path: Path
) -> None:
    cases = [CASES[0], CASES[2]]
    local, main = _jobs(tmp_path, "local", cases), _jobs(tmp_path, "main", cases)
    want = _flow(openvino_python, "local", local)
    got = _flow(sys.executable, "remote", main, openvino_server["target"])
    assert got["openvino_modules_loaded"] == []
    assert got["rng_after"] == want["rng_after"]
    _assert_same_programs(local, main)


def test_the_server_sends_no_telemetry(
    openvino_python: str, openvino_server: dict[str, Any], tmp_path: Path
) -> None:
    """NNCF, imported by the hosted backend, would start OpenVINO's telemetry: a client id and
    statistics under ``~/intel``, events sent to Google Analytics (measured without the
    server's block: both happen during one quantization)."""
    _flow(openvino_python, "remote", _jobs(tmp_path, "telemetry", [CASES[2]]),
          openvino_server["target"])
    assert list(openvino_server["home"].iterdir()) == []
    assert openvino_server["network"].accepted == []


def test_conformance_subset_in_the_openvino_environment(
    openvino_python: str, tmp_path: Path
) -> None:
    """ExecuTorch's suite flows ``openvino`` and ``openvino_int8`` and their remote twins, with
    the quantizer remote too, on a few operator tests, run by ``scripts/conformance.py`` in the
    OpenVINO environment (``make conformance-openvino`` runs them all): every comparison
    identical (after ``normalize_openvino``), the programs run, and the twin quantized with
    ``RemoteQuantizer('openvino', {})``, the hosted quantizer that rebuilds the flow's."""
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [openvino_python, str(ROOT / "scripts" / "conformance.py"), "--suite", "operators",
         "--flows", "openvino_int8", "--remote-quantizer", "-k", "test_add or test_erfinv",
         "--json", str(out)],
        capture_output=True, text=True, timeout=1500, check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    compared = json.loads(out.read_text())["comparisons"]
    assert compared and {c["flow"] for c in compared} == {"openvino_int8+remote-quantizer"}
    assert [c for c in compared if not c["identical"]] == []
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert {c["local"]["result"] for c in compared} >= {"SUCCESS"}
    assert {c["remote"].get("quantizer") for c in compared} == {"RemoteQuantizer('openvino', {})"}
