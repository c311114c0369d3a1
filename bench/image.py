"""The server image's figures: size, build time cold and with Docker's layer cache, and the time
from ``docker run`` to SERVING.

    python bench/image.py                 # make bench-image; --json PATH for the figures

Builds with ``scripts/build_image.py`` (the same as ``make image``): cold with ``--no-cache``
(every layer of deploy/Dockerfile rebuilt; the base image and the wheelhouse are reused, unless
``--cold-base``: the Debian base is removed first, so mmdebstrap and ``docker import`` are
timed too), then again with the layer cache and nothing changed (every layer a hit: what a
rebuild costs at the least). Then, ``--runs`` times, ``docker run`` of the image as
deploy/README.md's command runs it (token file, read-only root, tmpfs /tmp, uid 10001, no
capabilities, port published on 127.0.0.1) until grpc.health.v1 answers SERVING; the fastest
counts, every sample is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
BUILD = [sys.executable, str(ROOT / "scripts" / "build_image.py")]
DEBIAN_BASE = "remote-partitioner-base:bookworm"
LABEL = "remote-partitioner.bench-image"
STARTUP_S = 300


def _timed(cmd: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(cmd, check=True, cwd=ROOT)
    return time.monotonic() - started


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], check=True, capture_output=True, text=True,
                          timeout=300).stdout


def _serving(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=2)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def run_to_serving(image: str) -> float:
    """Seconds from ``docker run`` to SERVING, for deploy/README.md's run command."""
    with tempfile.TemporaryDirectory(prefix="rp-bench-token-") as tmp:
        token = Path(tmp) / "tokens"
        token.write_text(secrets.token_urlsafe(24) + "\n")
        os.chmod(tmp, 0o755)
        os.chmod(token, 0o644)
        started = time.monotonic()
        cid = _docker(
            "run", "-d", "--label", LABEL, "--user", "10001:10001", "--read-only",
            "--tmpfs", "/tmp:rw,mode=1777,size=1g", "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--memory", "6g",
            "-v", f"{tmp}:/etc/remote-partitioner/token:ro", "-p", "127.0.0.1::50051", image,
        ).strip()
        try:
            target = _docker("port", cid, "50051/tcp").split()[0]
            deadline = started + STARTUP_S
            while not _serving(target):
                if time.monotonic() > deadline:
                    raise SystemExit(f"not SERVING in {STARTUP_S} s:\n" + _docker("logs", cid))
                time.sleep(0.05)
            return time.monotonic() - started
        finally:
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--image", default="remote-partitioner:0.1.0")
    parser.add_argument("--base", default="python:3.11-slim")
    parser.add_argument("--cold-base", action="store_true",
                        help="remove the Debian base first: time mmdebstrap + docker import too")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    build = [*BUILD, "--tag", args.image, "--base", args.base]
    figures: dict[str, Any] = {"image": args.image}
    if args.cold_base:
        subprocess.run(["docker", "image", "rm", DEBIAN_BASE], capture_output=True, check=False)
    figures["build_cold_s"] = _timed([*build, "--no-cache"])
    figures["build_cached_s"] = _timed(build)
    figures["size_bytes"] = int(_docker("image", "inspect", "--format", "{{.Size}}", args.image))
    samples = [run_to_serving(args.image) for _ in range(args.runs)]
    figures["run_to_serving_s"] = min(samples)
    figures["run_to_serving_samples_s"] = samples
    figures["nproc"] = os.cpu_count()
    print(f"image {args.image}: {figures['size_bytes'] / 1e9:.2f} GB")
    print(f"build, no layer cache ({'base built too' if args.cold_base else 'base reused'}): "
          f"{figures['build_cold_s']:.0f} s")
    print(f"build, layer cache:       {figures['build_cached_s']:.0f} s")
    print(f"docker run -> SERVING:    {figures['run_to_serving_s']:.1f} s "
          f"(fastest of {len(samples)}: {', '.join(f'{s:.1f}' for s in samples)})")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
