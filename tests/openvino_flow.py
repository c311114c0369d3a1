"""Lowers small models for OpenVINO, locally or through a server, and writes each ``.pte``: run
by tests/test_openvino.py with the OpenVINO environment's Python (``make venv-openvino``), or
with the main one for a client that has no OpenVINO package at all.

    python tests/openvino_flow.py MODE JOBS_JSON [TARGET]

MODE ``local`` quantizes with ExecuTorch's ``OpenVINOQuantizer`` and lowers with its
``OpenvinoPartitioner``, as ExecuTorch's suite flows ``openvino`` and ``openvino_int8`` build
them (``OpenVINOTester``: compile spec ``device=CPU``, ``_check_ir_validity=False``, quantized
without folding); ``remote`` first blocks every OpenVINO and NNCF module (a client without the
toolchain), then quantizes with ``RemoteQuantizer`` and lowers with
``RemotePartitioner(remote_preprocess=True)`` against TARGET (with the bearer token in the
environment variable ``RP_TOKEN``, if set). Each job is ``{"spec": spec,
"quantize": bool, "model": "conv"|"linear"|"partial", "out": path}``; the generator is seeded
the same way before each job in both modes. The last stdout line is JSON: the OpenVINO modules this
process loaded, and the generator's state digest after each job.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any

from arm_flow import Block, build_model, loaded_modules, lower_jobs

#: What a client without the OpenVINO toolchain cannot import.
OPENVINO_MODULES = ("executorch.backends.openvino", "openvino", "nncf", "openvino_telemetry")


def _build(kind: str) -> tuple[Any, tuple[Any, ...]]:
    """``arm_flow``'s models, and ``partial``: two linears around ``erfinv``, which OpenVINO's
    partitioner does not support (two partitions; it prints "Op not supported")."""
    if kind != "partial":
        return build_model(kind)
    import torch

    class Partial(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(16, 32)
            self.b = torch.nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.special.erfinv(torch.tanh(self.a(x)) * 0.5))

    return Partial().eval(), (torch.randn(2, 16),)


def _local_objects(spec: dict[str, Any]) -> tuple[Any, Any]:
    from executorch.backends.openvino.partitioner import OpenvinoPartitioner
    from executorch.backends.openvino.quantizer.quantizer import (
        OpenVINOQuantizer,
        QuantizationMode,
    )
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    quantizer = OpenVINOQuantizer(mode=QuantizationMode(spec.get("mode", "int8_sym")))
    device = str(spec.get("device", "CPU")).encode()
    return quantizer, OpenvinoPartitioner([CompileSpec("device", device)])


def main() -> None:
    mode, jobs = sys.argv[1], json.loads(sys.argv[2])
    target = sys.argv[3] if len(sys.argv) > 3 else ""
    if mode == "remote":
        sys.meta_path.insert(0, Block(OPENVINO_MODULES))
    warnings.filterwarnings("ignore")
    from executorch.exir import EdgeCompileConfig

    token = os.environ.get("RP_TOKEN") or None  # a server run with --token-file

    def objects(job: dict[str, Any]) -> tuple[Any, Any]:
        if mode == "local":
            return _local_objects(job["spec"])
        from remote_partitioner.client import RemotePartitioner, RemoteQuantizer

        quantizer_spec = {k: v for k, v in job["spec"].items() if k == "mode"}
        lowering_spec = {k: v for k, v in job["spec"].items() if k != "mode"}
        return (
            RemoteQuantizer(target, "openvino", quantizer_spec, timeout=600, token=token),
            RemotePartitioner(target, "openvino", lowering_spec, remote_preprocess=True,
                              timeout=600, token=token),
        )

    # As OpenVINOTester: quantized without folding, lowered without the IR validity check.
    rng_after = lower_jobs(jobs, objects, _build, fold_quantize=False,
                           compile_config=EdgeCompileConfig(_check_ir_validity=False))
    loaded = loaded_modules(("openvino", "nncf"), ("executorch.backends.openvino",))
    print(json.dumps({"openvino_modules_loaded": loaded, "rng_after": rng_after}))


if __name__ == "__main__":
    main()
