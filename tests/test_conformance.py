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
#: (flows, -k expression): a few operator tests, the bidirectional LSTM among them.
SUBSET = (
    (["xnnpack"], "test_add_f32_alpha or test_lstm_bidirectional or test_conv2d_basic"),
    (["xnnpack_static_int8_per_tensor"], "test_conv2d_basic"),
    (["coreml"], "test_add_f32_alpha"),
    (["vulkan"], "test_add_f32_alpha"),
)


@pytest.mark.slow
@pytest.mark.parametrize(("flows", "keyword"), SUBSET, ids=[s[0][0] for s in SUBSET])
def test_conformance_subset(
    flows: list[str], keyword: str, server_address: str, tmp_path: Path
) -> None:
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "conformance.py"), "--server", server_address,
         "--suite", "operators", "--flows", *flows, "-k", keyword, "--json", str(out)],
        capture_output=True, text=True, timeout=1500, check=False,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    compared = result["comparisons"]
    assert compared, proc.stdout[-3000:]
    differing = [c for c in compared if not c["identical"]]
    assert not differing, json.dumps(differing, indent=1)
    assert proc.returncode == 0, proc.stdout[-3000:]
