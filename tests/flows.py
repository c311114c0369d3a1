"""Running the lowering scripts (``tests/arm_flow.py``, ``tests/openvino_flow.py``) in fresh
processes, with the Python of the environment they lower in."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

#: How long one script may take (it imports a toolchain, then lowers a few small models).
FLOW_SECONDS = 900


def run_flow(python: str | Path, script: Path, mode: str, jobs: list[dict[str, Any]],
             target: str = "", token: str = "", hash_seed: str | None = None) -> dict[str, Any]:
    """Run ``script MODE JOBS TARGET`` with ``python`` (``token`` in ``RP_TOKEN``, and
    ``hash_seed`` in ``PYTHONHASHSEED`` when given); the JSON summary its last stdout line
    prints, with its whole stdout under ``"stdout"``."""
    seed = {} if hash_seed is None else {"PYTHONHASHSEED": hash_seed}
    out = subprocess.run(
        [str(python), str(script), mode, json.dumps(jobs), target],
        capture_output=True, text=True, timeout=FLOW_SECONDS,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "RP_TOKEN": token, **seed},
    )
    assert out.returncode == 0, f"{mode}: {out.stderr[-4000:]}"
    summary: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    summary["stdout"] = out.stdout
    return summary
