"""A fixed, representative subset of ExecuTorch's backend conformance suite, each test run
with its flow and the flow's remote twin against a real server (``scripts/conformance.py``;
``make conformance`` runs all of it): the same outcome, ``.pte`` bytes and random generator
state after lowering, for XNNPACK (float and quantized), Core ML and Vulkan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: (flows, -k expression, more arguments): a few operator tests, the bidirectional LSTM among
#: them, and one with the backend's preprocess on the server too (Vulkan's draws from the
#: random generator). Core ML's quantized flow is left to `make conformance`: one of its
#: tests takes almost 3 minutes.
SUBSET: tuple[tuple[list[str], str, list[str]], ...] = (
    (["xnnpack"], "test_add_f32_alpha or test_lstm_bidirectional or test_conv2d_basic", []),
    (["xnnpack_static_int8_per_tensor"], "test_conv2d_basic", []),
    (["coreml"], "test_add_f32_alpha", []),
    (["vulkan"], "test_add_f32_alpha", []),
    (["vulkan_static_int8_per_channel"], "test_add_f32_alpha", []),
    (["vulkan"], "test_add_f32_alpha", ["--remote-preprocess"]),
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flows", "keyword", "more"), SUBSET,
    ids=[s[0][0] + ("-server-preprocess" if s[2] else "") for s in SUBSET],
)
def test_conformance_subset(
    flows: list[str], keyword: str, more: list[str], server_address: str, tmp_path: Path
) -> None:
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "conformance.py"), "--server", server_address,
         "--suite", "operators", "--flows", *flows, "-k", keyword, "--json", str(out), *more],
        capture_output=True, text=True, timeout=1500, check=False,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    compared = result["comparisons"]
    assert compared, proc.stdout[-3000:]
    differing = [c for c in compared if not c["identical"]]
    assert not differing, json.dumps(differing, indent=1)
    assert proc.returncode == 0, proc.stdout[-3000:]


def _conformance_module() -> object:
    import importlib.util

    path = ROOT / "scripts" / "conformance.py"
    spec = importlib.util.spec_from_file_location("rp_conformance_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def test_accumulated_logs_count_complete_tests_only(tmp_path: Path) -> None:
    """A long run is resumed over several sittings (``--resume``): the summary of the logs
    counts each test's comparisons once (its last complete run) and leaves out a test that was
    interrupted before it completed."""
    conformance = _conformance_module()

    def comparison(test: str, identical: bool, subtest: int = 0) -> dict[str, object]:
        side = {"result": "SUCCESS", "lower_seconds": 1.0}
        return {"test": test, "flow": "xnnpack", "subtest": subtest, "identical": identical,
                "differences": [] if identical else [".pte: differ"], "local": side,
                "remote": side, "commit": "abc"}

    def complete(test: str) -> dict[str, object]:
        return {"test": test, "flow": "xnnpack", "complete": True, "outcome": "passed"}

    first = tmp_path / "a.jsonl"
    first.write_text("\n".join(json.dumps(x) for x in [
        comparison("t1[xnnpack]", False), complete("t1[xnnpack]"),
        comparison("t2[xnnpack]", True), comparison("t2[xnnpack]", True, 1),
        complete("t2[xnnpack]"),
        comparison("t3[xnnpack]", False),  # interrupted: never complete
    ]))
    second = tmp_path / "b.jsonl"  # t1 again, identical now
    second.write_text("\n".join(json.dumps(x) for x in [
        comparison("t1[xnnpack]", True), complete("t1[xnnpack]")]))
    log = conformance.read_log([first, second])  # type: ignore[attr-defined]
    assert sorted(c["test"] for c in log["comparisons"]) == [
        "t1[xnnpack]", "t2[xnnpack]", "t2[xnnpack]"]
    text, differing = conformance.summarize_logs(  # type: ignore[attr-defined]
        [first, second], ["xnnpack"])
    assert differing == 0, text
    assert "complete tests per flow: xnnpack 2" in text
    _, differing = conformance.summarize_logs([first], ["xnnpack"])  # type: ignore[attr-defined]
    assert differing == 1
