"""The Arm backends (``arm_tosa``, ``ethos_u55``, ``ethos_u85``) hosted by a server in their own
environment (``make venv-arm``: tosa-tools and Vela pin numpy and flatbuffers against the main
environment), against local lowering in that environment.

Each lowering runs in a fresh process (``tests/arm_flow.py``), as a user's script would:

* a client in the Arm environment with every Arm, TOSA and Vela module blocked from importing
  (the client without the toolchain) lowers float programs through the server, partitioner and
  preprocess both, and gets the local ``.pte`` bytes;
* a client in the main environment (no Arm package installed at all, a newer flatbuffers) gets
  the same program: equal after ExecuTorch's own deserializer reads both files (the flatbuffers
  envelope is written by the client's flatbuffers, as any local lowering there would write it);
* a client that quantizes with Arm's own quantizer lowers TOSA INT, Ethos-U55 and Ethos-U85
  programs through the server (Vela runs there) and gets the local bytes;
* what Vela prints (its network summary) stays out of the server's stdout and, at the default
  log level, out of its stderr.

Ethos-U's run step needs Arm's Corstone FVP, which no registry ships: the comparison stops at the
``.pte``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import launch, served

pytestmark = pytest.mark.slow  # fresh processes that import the Arm toolchain: minutes

ROOT = Path(__file__).resolve().parent.parent
ARM_PYTHON = Path(os.environ.get("ARM_PYTHON", ROOT / ".venv-arm" / "bin" / "python"))
FLOW = Path(__file__).with_name("arm_flow.py")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
FLOW_SECONDS = 900

#: ExecuTorch's suite flows' compile specs (executorch/backends/test/suite/flows/arm.py and
#: the Arm test helpers it calls), as the server's spec keys state them.
INT = {"tosa_spec": "TOSA-1.0+INT"}
U55 = {"extra_flags": "--arena-cache-size=2097152"}
U85 = {
    "memory_mode": "Shared_Sram",
    "extra_flags": "--output-format=raw --arena-cache-size=2097152",
}


@pytest.fixture(scope="module")
def arm_python() -> str:
    """The Arm environment's interpreter; outside CI, the tests skip when it is not built."""
    if not ARM_PYTHON.exists():
        if IN_CI:
            pytest.fail(f"CI=true but the Arm environment is missing: {ARM_PYTHON}")
        pytest.skip("the Arm environment is not built (make venv-arm)")
    return str(ARM_PYTHON)


@pytest.fixture(scope="module")
def arm_server(arm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server in the Arm environment hosting the Arm family only, on a free loopback port:
    (target, its Launched, its stderr log)."""
    log = tmp_path_factory.mktemp("arm-server") / "server.log"
    launched = launch(log, "--backends", "arm", python=arm_python)
    with served(launched) as (_, target, _):
        yield target, launched, log


def _flow(python: str, mode: str, jobs: list[dict[str, Any]], target: str = "") -> Any:
    """Run tests/arm_flow.py; its summary (Arm modules loaded, generator states)."""
    out = subprocess.run(
        [python, str(FLOW), mode, json.dumps(jobs), target],
        capture_output=True, text=True, timeout=FLOW_SECONDS,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.returncode == 0, f"{mode}: {out.stderr[-4000:]}"
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    summary["stdout"] = out.stdout
    return summary


def _jobs(tmp_path: Path, tag: str, cases: list[tuple[str, str, dict[str, Any], bool]]) -> Any:
    return [
        {"name": name, "spec": spec, "quantize": quantize, "model": model,
         "out": str(tmp_path / f"{tag}-{name}-{model}-{i}.pte")}
        for i, (name, model, spec, quantize) in enumerate(cases)
    ]


FLOAT = [("arm_tosa", "conv", {}, False), ("arm_tosa", "linear", {}, False)]


def test_float_lowering_without_the_arm_toolchain(
    arm_python: str, arm_server: Any, tmp_path: Path
) -> None:
    target = arm_server[0]
    local = _jobs(tmp_path, "local", FLOAT)
    remote = _jobs(tmp_path, "remote", FLOAT)
    want = _flow(arm_python, "local", local)
    got = _flow(arm_python, "remote", remote, target)
    assert got["arm_modules_loaded"] == []  # the client imported nothing of Arm's
    assert want["arm_modules_loaded"]  # (and the local one did: the block is what differs)
    for a, b in zip(local, remote, strict=True):
        assert Path(a["out"]).read_bytes() == Path(b["out"]).read_bytes(), a["model"]
    assert got["rng_after"] == want["rng_after"]

    # A client in the main environment, which has no Arm package at all.
    main = _jobs(tmp_path, "main", FLOAT)
    assert _flow(sys.executable, "remote", main, target)["arm_modules_loaded"] == []
    from executorch.exir._serialize._program import deserialize_pte_binary

    for a, b in zip(local, main, strict=True):
        local_bytes, main_bytes = Path(a["out"]).read_bytes(), Path(b["out"]).read_bytes()
        assert deserialize_pte_binary(local_bytes) == deserialize_pte_binary(main_bytes)


QUANTIZED = [
    ("arm_tosa", "conv", INT, True),
    ("arm_tosa", "linear", INT, True),
    ("ethos_u55", "conv", U55, True),
    ("ethos_u55", "linear", U55, True),
    ("ethos_u85", "conv", U85, True),
    ("ethos_u85", "linear", U85, True),
]


def test_quantized_programs_lower_on_the_server(
    arm_python: str, arm_server: Any, tmp_path: Path
) -> None:
    target, launched, log = arm_server
    local = _jobs(tmp_path, "local", QUANTIZED)
    remote = _jobs(tmp_path, "remote", QUANTIZED)
    want = _flow(arm_python, "local", local)
    got = _flow(arm_python, "remote-lowering", remote, target)
    for a, b in zip(local, remote, strict=True):
        assert Path(a["out"]).read_bytes() == Path(b["out"]).read_bytes(), (a["name"], a["model"])
    assert got["rng_after"] == want["rng_after"]
    # Ethos-U programs went through Vela on the server, which prints its network summary (as
    # it did in the local process): not to the server's stdout, and not to its stderr at the
    # default log level.
    assert "Network summary" in want["stdout"]
    printed = []
    while True:
        try:
            line = launched.lines.get_nowait()
        except queue.Empty:
            break
        if line is not None:
            printed.append(line)
    assert printed == []
    assert "Network summary" not in log.read_text(errors="replace")
