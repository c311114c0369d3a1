"""The Arm backends (``arm_tosa``, ``ethos_u55``, ``ethos_u85``) hosted by a server in their own
environment (``make venv-arm``: tosa-tools and Vela pin numpy and flatbuffers against the main
environment), against local lowering in that environment.

Each lowering runs in a fresh process (``tests/arm_flow.py``), as a user's script would:

* a client in the Arm environment with every Arm, TOSA and Vela module blocked from importing
  (the client without the toolchain) quantizes with ``RemoteQuantizer`` (Arm's quantizer on
  the server) and lowers with ``RemotePartitioner(remote_preprocess=True)`` (partitioner,
  TOSA serialization and Vela on the server), and gets the local ``.pte`` bytes and generator
  state, for TOSA FP, TOSA INT, Ethos-U55 and Ethos-U85;
* a client in the main environment (no Arm package installed at all, a newer flatbuffers) gets
  the same program: equal after ExecuTorch's own deserializer reads both files (the flatbuffers
  envelope is written by the client's flatbuffers, as any local lowering there would write it);
* through one address (the front door, deploy/k8s/overlays/environments/nginx.conf, before
  a main-environment server that lists the Arm server as its peer), the same: calls for Arm's
  partitioners and quantizer carry the environment header and reach the Arm server;
* the bias ``derive_qparams_fn`` the client runs in place of Arm's (it cannot import Arm's)
  computes Arm's bits;
* what Vela prints (its network summary) stays out of the server's stdout and, at the default
  log level, out of its stderr;
* Arm's partitioner orders its partitions by Python's string hash seed (executorch#19045): the
  server, started without ``PYTHONHASHSEED``, runs with seed 0, so a client at any seed gets
  the bytes of a local lowering at seed 0, which differ from those at another seed.

Local lowerings run with ``PYTHONHASHSEED=0`` (what docs/environments.md tells a user to do),
remote ones with another seed (:data:`CLIENT_SEED`): the client's seed does not matter.

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
from flows import run_flow
from servers import front_door, launch, serve_process, served

pytestmark = pytest.mark.slow  # fresh processes that import the Arm toolchain: minutes

ROOT = Path(__file__).resolve().parent.parent
ARM_PYTHON = Path(os.environ.get("ARM_PYTHON", ROOT / ".venv-arm" / "bin" / "python"))
FLOW = Path(__file__).with_name("arm_flow.py")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
FLOW_SECONDS = 900
#: The seed of the local lowerings (the server's), and one whose set of two partition tags
#: iterates the other way round (``{'tag0', 'tag1'}``: ``tag1`` first at 0, ``tag0`` at 3).
SERVER_SEED, CLIENT_SEED = "0", "3"

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
    # Without PYTHONHASHSEED, as a user starts it: it restarts itself with seed 0.
    launched = launch(log, "--backends", "arm", "--environment", "arm", python=arm_python,
                      env={"PYTHONHASHSEED": None})
    with served(launched) as (_, target, _):
        yield target, launched, log


def _flow(python: str, mode: str, jobs: list[dict[str, Any]], target: str = "",
          hash_seed: str | None = None) -> Any:
    """Run tests/arm_flow.py; its summary (Arm modules loaded, generator states, stdout).
    Local lowerings run at the server's seed, remote ones at another, unless ``hash_seed``."""
    if hash_seed is None:
        hash_seed = SERVER_SEED if mode == "local" else CLIENT_SEED
    return run_flow(python, FLOW, mode, jobs, target, hash_seed=hash_seed)


def _jobs(tmp_path: Path, tag: str, cases: list[tuple[str, str, dict[str, Any], bool]]) -> Any:
    return [
        {"name": name, "spec": spec, "quantize": quantize, "model": model,
         "out": str(tmp_path / f"{tag}-{name}-{model}-{i}.pte")}
        for i, (name, model, spec, quantize) in enumerate(cases)
    ]


CASES = [
    ("arm_tosa", "conv", {}, False),
    ("arm_tosa", "linear", {}, False),
    ("arm_tosa", "conv", INT, True),
    ("arm_tosa", "linear", INT, True),
    ("ethos_u55", "conv", U55, True),
    ("ethos_u55", "linear", U55, True),
    ("ethos_u85", "conv", U85, True),
    ("ethos_u85", "linear", U85, True),
]


def test_a_client_without_the_arm_toolchain_gets_the_local_pte(
    arm_python: str, arm_server: Any, tmp_path: Path
) -> None:
    target, launched, log = arm_server
    local = _jobs(tmp_path, "local", CASES)
    remote = _jobs(tmp_path, "remote", CASES)
    want = _flow(arm_python, "local", local)
    got = _flow(arm_python, "remote", remote, target)
    assert got["arm_modules_loaded"] == []  # the client imported nothing of Arm's
    assert want["arm_modules_loaded"]  # (and the local one did: the block is what differs)
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


def test_a_client_with_no_arm_package_gets_the_same_program(
    arm_python: str, arm_server: Any, tmp_path: Path
) -> None:
    cases = [CASES[0], CASES[4], CASES[7]]  # TOSA FP, Ethos-U55, Ethos-U85
    local = _jobs(tmp_path, "local", cases)
    main = _jobs(tmp_path, "main", cases)
    want = _flow(arm_python, "local", local)
    got = _flow(sys.executable, "remote", main, arm_server[0])
    assert got["arm_modules_loaded"] == []
    assert got["rng_after"] == want["rng_after"]
    from executorch.exir._serialize._program import deserialize_pte_binary

    for a, b in zip(local, main, strict=True):
        local_bytes, main_bytes = Path(a["out"]).read_bytes(), Path(b["out"]).read_bytes()
        assert deserialize_pte_binary(local_bytes) == deserialize_pte_binary(main_bytes)


def test_the_partition_order_is_the_servers_whatever_the_clients_hash_seed(
    arm_python: str, arm_server: Any, tmp_path: Path
) -> None:
    """An ``AdaptiveAvgPool2d`` that Arm lowers for Ethos-U55 as two partitions: local
    lowerings at seeds 0 and 3 differ (ExecuTorch lowers Arm's partitions in the order of a
    set of strings); the client at seed 3 gets the seed-0 bytes, the server's."""
    cases = [("ethos_u55", "avgpool", U55, True)]
    at_0, at_3, remote = (_jobs(tmp_path, tag, cases) for tag in ("local0", "local3", "remote"))
    _flow(arm_python, "local", at_0, hash_seed=SERVER_SEED)
    _flow(arm_python, "local", at_3, hash_seed=CLIENT_SEED)
    got = _flow(arm_python, "remote", remote, arm_server[0], hash_seed=CLIENT_SEED)
    assert got["arm_modules_loaded"] == []
    for a, b, c in zip(at_0, at_3, remote, strict=True):
        want = Path(a["out"]).read_bytes()
        assert Path(b["out"]).read_bytes() != want, f"{a['name']}: no longer seed-dependent?"
        assert Path(c["out"]).read_bytes() == want, a["name"]


DERIVE_CHECK = """
import json, torch
from torchao.quantization.pt2e.observer import MinMaxObserver, PerChannelMinMaxObserver
from executorch.backends.arm.quantizer import arm_quantizer_utils
from executorch.backends.arm.quantizer import get_symmetric_quantization_config
from remote_partitioner.proto.codec.annotations import ALLOWED_DERIVE_FUNCTIONS
from remote_partitioner.proto.codec.derive_functions import captures_nothing

def qualified(fn):
    return f"{fn.__module__}.{fn.__qualname__}"

# Arm's two bias functions, as its quantizer hands them to torchao.
graph = torch.fx.Graph()
x, w = graph.placeholder("x"), graph.placeholder("w")
conv = graph.call_function(torch.ops.aten.conv2d.default, (x, w))
arms = [arm_quantizer_utils._derive_bias_qparams_fn]
for per_channel in (True, False):
    config = get_symmetric_quantization_config(is_per_channel=per_channel)
    arms.append(config.get_bias_qspec(conv).derive_qparams_fn)
torch.manual_seed(0)
act = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric)
act(torch.randn(64) * 3)
results = []
for weight in (
    PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8, qscheme=torch.per_channel_symmetric),
    MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric),
):
    weight(torch.randn(8, 3, 3, 3))
    for fn in arms:
        ours = ALLOWED_DERIVE_FUNCTIONS[qualified(fn)]
        a, b = fn([act, weight]), ours([act, weight])
        results.append([qualified(fn), captures_nothing(fn), ours is not fn,
                        all(torch.equal(p, q) and p.dtype == q.dtype for p, q in zip(a, b))])
print(json.dumps(results))
"""


def test_the_clients_bias_functions_compute_arms_bits(arm_python: str) -> None:
    out = subprocess.run([arm_python, "-c", DERIVE_CHECK], capture_output=True, text=True,
                         timeout=FLOW_SECONDS, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr[-4000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(results) == 6 and len({r[0] for r in results}) == 2
    assert all(r[1:] == [True, True, True] for r in results), results


def test_one_address_serves_the_arm_environment(
    arm_python: str, arm_server: Any, tmp_path: Path
) -> None:
    """A main-environment server (XNNPACK) that lists the Arm server as its peer, Debian's
    nginx with the project's front-door configuration before both, and the client without the
    toolchain pointed at the front door: the local bytes, as against the Arm server itself."""
    cases = [CASES[1], CASES[4]]  # TOSA FP (linear), Ethos-U55 quantized (conv)
    local = _jobs(tmp_path, "local", cases)
    front = _jobs(tmp_path, "front", cases)
    log = tmp_path / "main.log"
    peer = f"arm={arm_server[0]}"
    with serve_process(log, "--backends", "xnnpack", "--peer", peer) as (_, main_target, _), \
            front_door(tmp_path / "nginx",
                       {"default": main_target, "arm": arm_server[0]}) as target:
        listed = subprocess.run(
            [sys.executable, "-m", "remote_partitioner.cli", "list", "--target", target],
            capture_output=True, text=True, timeout=FLOW_SECONDS,
        )
        want = _flow(arm_python, "local", local)
        got = _flow(arm_python, "remote", front, target)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[1].startswith("environment arm: server ")
    for name in ("arm_tosa", "ethos_u55", "ethos_u85"):
        assert any(line.startswith(f"{name}  ") and line.endswith("[environment arm]")
                   for line in lines), name
    assert any(line.startswith("xnnpack  XnnpackBackend") for line in lines)
    assert got["arm_modules_loaded"] == []
    assert got["rng_after"] == want["rng_after"]
    for a, b in zip(local, front, strict=True):
        assert Path(a["out"]).read_bytes() == Path(b["out"]).read_bytes(), (a["name"], a["model"])


def test_conformance_subset_in_the_arm_environment(arm_python: str, tmp_path: Path) -> None:
    """ExecuTorch's suite flows ``arm_tosa_int``, ``arm_ethos_u55`` and ``arm_ethos_u85`` and
    their remote twins, the quantizer remote too, on two operator tests, run by
    ``scripts/conformance.py`` in the Arm environment (``make conformance-arm`` runs them
    all): every comparison identical (outcome, ``.pte`` bytes, generator state); the TOSA
    program runs on tosa-tools' reference model, the Ethos-U ones stop at the run step on both
    sides (no Corstone FVP) with the same ``.pte``; the twins quantized with the
    ``RemoteQuantizer`` that rebuilds each flow's quantizer, compile spec included. And
    ``test_floor_divide_values``, whose int64 divisor Arm's quantizer casts right after its
    placeholder (the module crosses with that input moved: ``UnliftTable.moved_inputs``)."""
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [arm_python, str(ROOT / "scripts" / "conformance.py"), "--suite", "operators",
         "--flows", "arm_tosa_int", "arm_ethos_u55", "arm_ethos_u85", "--remote-quantizer",
         "-k", "test_add_f32_bcast_first or test_floor_divide_values", "--json", str(out)],
        capture_output=True, text=True, timeout=FLOW_SECONDS, check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    comparisons = json.loads(out.read_text())["comparisons"]
    assert [c for c in comparisons if not c["identical"]] == []
    compared = {c["flow"]: c for c in comparisons if c["test"].startswith("test_add_")}
    assert sorted(compared) == [f"{f}+remote-quantizer" for f in
                                ("arm_ethos_u55", "arm_ethos_u85", "arm_tosa_int")]
    divided = [c for c in comparisons if c["test"].startswith("test_floor_divide_values")]
    assert len(divided) == 3 * 6, [(c["flow"], c["subtest"]) for c in divided]
    assert all(c["local"]["result"] == "SUCCESS" for c in divided
               if c["flow"].startswith("arm_tosa_int"))
    assert proc.returncode == 0, proc.stdout[-3000:]
    tosa, u55, u85 = (compared[f"{f}+remote-quantizer"]
                      for f in ("arm_tosa_int", "arm_ethos_u55", "arm_ethos_u85"))
    assert tosa["local"]["result"] == "SUCCESS"
    for c in (u55, u85):
        assert c["local"]["result"] == "PTE_RUN_FAIL" and "executor_runner" in c["local"]["error"]
    for c in (tosa, u55, u85):
        assert c["local"]["pte_sha256"] is not None
        assert c["local"]["pte_sha256"] == c["remote"]["pte_sha256"]
    assert tosa["remote"]["quantizer"] == (
        "RemoteQuantizer('arm_tosa', {'tosa_spec': 'TOSA-1.0+INT', 'is_per_channel': True})")
    assert u55["remote"]["quantizer"].startswith("RemoteQuantizer('ethos_u55', {'macs': 128, ")
    assert u85["remote"]["quantizer"].startswith("RemoteQuantizer('ethos_u85', {'macs': 128, ")
