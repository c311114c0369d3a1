"""Lowers small models for the Arm backends, locally or through a server, and writes each
``.pte``: run by tests/test_arm.py with the Arm environment's Python (``make venv-arm``), or
with the main one for a client that has no Arm packages at all.

    python tests/arm_flow.py MODE JOBS_JSON [TARGET]

MODE ``local`` quantizes with ExecuTorch's Arm quantizer and lowers with its partitioners, as
ExecuTorch's Arm test flows build them; ``remote`` first blocks every Arm and TOSA module (a
client without the toolchain), then quantizes with ``RemoteQuantizer`` and lowers with
``RemotePartitioner(remote_preprocess=True)`` against TARGET (with the bearer token in the
environment variable ``RP_TOKEN``, if set); ``remote-lowering`` quantizes
as ``local`` does (the client has the Arm quantizer) and lowers as ``remote`` does. Each job
is ``{"name": hosted name, "spec": spec, "quantize": bool, "model": "conv"|"linear"|"avgpool",
"out": path}`` (``avgpool``: an ``AdaptiveAvgPool2d`` Arm lowers as two partitions); the
generator is seeded the same way before each job in every mode. The last stdout line is JSON:
the Arm modules this process loaded, and the generator's state digest after each job.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import json
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

#: What a client without the Arm toolchain cannot import.
ARM_MODULES = ("executorch.backends.arm", "tosa_serializer", "tosa", "ethosu", "serializer")


class Block(importlib.abc.MetaPathFinder):
    """Refuses to import ``modules`` and their submodules, as if they were not installed."""

    def __init__(self, modules: tuple[str, ...]) -> None:
        self.modules = modules

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if any(name == b or name.startswith(b + ".") for b in self.modules):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None


def build_model(kind: str) -> tuple[Any, tuple[Any, ...]]:
    import torch

    class Conv(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(8)
            self.fc = torch.nn.Linear(8 * 8 * 8, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn(self.conv(x)))
            return self.fc(y.flatten(1)) + 1.0

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(16, 32)
            self.b = torch.nn.Linear(32, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(torch.sigmoid(self.a(x)))

    if kind == "conv":
        return Conv().eval(), (torch.randn(1, 3, 8, 8),)
    if kind == "avgpool":  # the suite's test_adaptive_avgpool2d_batch_sizes, its first subtest
        return torch.nn.AdaptiveAvgPool2d((5, 5)).eval(), (torch.randn(2, 8, 20, 20),)
    return Linear().eval(), (torch.randn(2, 16),)


def _local_objects(name: str, spec: dict[str, Any]) -> tuple[Any, Any]:
    """ExecuTorch's own quantizer and partitioner for ``name`` and ``spec``, built as its Arm
    test flows build them (and as the server documents its spec keys)."""
    from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
    from executorch.backends.arm.quantizer import get_symmetric_quantization_config
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.backends.arm.util._factory import create_quantizer

    if name == "arm_tosa":
        compile_spec = TosaCompileSpec(spec.get("tosa_spec", "TOSA-1.0+FP"))
        partitioner = TOSAPartitioner(compile_spec)
    else:
        prefix = name.replace("_", "-")
        kwargs = {k: spec[k] for k in ("system_config", "memory_mode") if k in spec}
        if "extra_flags" in spec:
            kwargs["extra_flags"] = spec["extra_flags"].split()
        compile_spec = EthosUCompileSpec(f"{prefix}-{spec.get('macs', 128)}", **kwargs)
        partitioner = EthosUPartitioner(compile_spec)
    quantizer = create_quantizer(compile_spec)
    quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
    return quantizer, partitioner


def lower_jobs(
    jobs: list[dict[str, Any]],
    objects: Callable[[dict[str, Any]], tuple[Any, Any]],
    build: Callable[[str], tuple[Any, tuple[Any, ...]]] = build_model,
    *,
    check_guards: bool = True,
    fold_quantize: bool = True,
    compile_config: Any = None,
) -> list[str]:
    """Lower each job as a user's script would, and write its ``.pte``: seed 0, ``build`` the
    job's model, ``objects(job)`` gives (quantizer, partitioner); export (strict); for a job
    that quantizes, ``prepare_pt2e(program.module(check_guards=...))``, one calibration,
    ``convert_pt2e(fold_quantize=...)`` and export again; ``to_edge_transform_and_lower``
    (with ``compile_config``), ``to_executorch``. Returns the digest of the generator's state
    after each job."""
    import torch
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    rng_after = []
    for job in jobs:
        torch.manual_seed(0)
        model, inputs = build(job["model"])
        quantizer, partitioner = objects(job)
        program = torch.export.export(model, inputs, strict=True)
        if job["quantize"]:
            prepared = prepare_pt2e(program.module(check_guards=check_guards), quantizer)
            prepared(*inputs)
            converted = convert_pt2e(prepared, fold_quantize=fold_quantize)
            program = torch.export.export(converted, inputs, strict=True)
        lowered = to_edge_transform_and_lower(
            program, partitioner=[partitioner], compile_config=compile_config)
        with open(job["out"], "wb") as fh:
            fh.write(lowered.to_executorch().buffer)
        rng_after.append(hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest())
    return rng_after


def loaded_modules(tops: tuple[str, ...], packages: tuple[str, ...]) -> list[str]:
    """The modules this process loaded under the top-level names ``tops`` or the packages
    ``packages``."""
    return sorted(m for m in sys.modules if m.split(".")[0] in tops
                  or any(m == p or m.startswith(p + ".") for p in packages))


def main() -> None:
    mode, jobs = sys.argv[1], json.loads(sys.argv[2])
    target = sys.argv[3] if len(sys.argv) > 3 else ""
    if mode == "remote":
        sys.meta_path.insert(0, Block(ARM_MODULES))
    warnings.filterwarnings("ignore")
    token = os.environ.get("RP_TOKEN") or None  # a server run with --token-file

    def objects(job: dict[str, Any]) -> tuple[Any, Any]:
        if mode in ("local", "remote-lowering"):
            quantizer, partitioner = _local_objects(job["name"], job["spec"])
        if mode in ("remote", "remote-lowering"):
            from remote_partitioner.client import RemotePartitioner, RemoteQuantizer

            if mode == "remote":
                quantizer = RemoteQuantizer(target, job["name"], job["spec"], timeout=600,
                                            token=token)
            partitioner = RemotePartitioner(
                target, job["name"], job["spec"], remote_preprocess=True, timeout=600,
                token=token,
            )
        return quantizer, partitioner

    # As Arm's own flows: without check_guards=False the module holds a `_guards_fn`
    # call_module node that the Arm quantizer's passes refuse (torch 2.13).
    rng_after = lower_jobs(jobs, objects, check_guards=False)
    loaded = loaded_modules(("tosa_serializer", "ethosu"), ("executorch.backends.arm",))
    print(json.dumps({"arm_modules_loaded": loaded, "rng_after": rng_after}))


if __name__ == "__main__":
    main()
