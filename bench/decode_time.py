"""Time ``codec.decode_program`` on a real ATen and Edge program (12 residual MLP blocks).

    PYTHONPATH=build/pkg python bench/decode_time.py [--repeat N]

Prints, per program, the first decode in the process (cold: the schema classes' type hints are
resolved then) and the median and minimum of the next ``N``. Run it on an idle machine, or
alternate it with the version it is compared with: on shared cores the numbers move by half.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from executorch.exir import to_edge
from torch.export import ExportedProgram, export

from remote_partitioner.proto import codec


class _Block(torch.nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 2 * d)
        self.fc2 = torch.nn.Linear(2 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.ln(x))))


def _programs() -> dict[str, ExportedProgram]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[_Block(32) for _ in range(12)]).eval()
    aten = export(net, (torch.randn(2, 32),), strict=True)
    return {"aten": aten, "edge": to_edge(copy.deepcopy(aten)).exported_program()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    for name, ep in _programs().items():
        encoded = codec.encode_program(ep)
        blobs = {h: bytes(b) for h, b in encoded.blobs.items()}
        get = blobs.__getitem__
        times = []
        for _ in range(args.repeat + 1):
            start = time.perf_counter()
            codec.decode_program(encoded.message, lambda d, get=get: get(d.hash))
            times.append((time.perf_counter() - start) * 1000)
        warm = times[1:]
        print(
            f"{name}: {len(ep.graph.nodes)} nodes, cold {times[0]:.0f} ms, "
            f"warm median {statistics.median(warm):.0f} ms (min {min(warm):.0f} ms)"
        )


if __name__ == "__main__":
    main()
