"""Build the server image (deploy/Dockerfile) on a machine that reaches only package registries.

``make image`` runs this; ``make image-arm`` runs it with ``--extra arm`` in ``.venv-arm`` (the
Arm environment's server: the wheelhouse is that environment's, ``build/image/wheels-arm``);
``make image-router`` with ``--router`` (the front door: Debian's nginx on the same base,
deploy/router/Dockerfile; no wheelhouse). Three steps:

1. The base image. ``--base`` (default ``python:3.11-slim``, the Dockerfile's default) is used
   if Docker has it or can pull it. Otherwise (Docker Hub unreachable) a Debian bookworm base is
   built from Debian's packages with ``mmdebstrap --variant=minbase`` and ``docker import``-ed
   as :data:`DEBIAN_BASE` (once: an existing one is reused). bookworm's python3 is 3.11, the
   host's wheels' Python.
2. The wheelhouse, ``build/image/wheels``: the runtime closure of ``remote-partitioner`` (its
   dependencies without extras, followed through every requirement whose marker holds here)
   at the versions installed in this interpreter's environment (``make venv``'s ``.venv``),
   fetched with the host's pip (its index and certificate configuration) into the build
   context, plus the build backend the project's ``pyproject.toml`` needs; and
   ``requirements.txt`` pinning each one ``==`` the installed version. The image installs from
   it with ``--no-index``: the container never contacts an index, and its versions are the
   host's.
3. ``docker build -f deploy/Dockerfile --build-arg PYTHON_IMAGE=<base> -t <tag> .``.

Contract: on success the image ``--tag`` exists, its ``/opt/venv`` holds exactly the pinned
versions (the Dockerfile checks that ``pip freeze`` equals the requirements), and the base it
was built on is printed. Exits non-zero on any failure, with the failing command's output.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
WHEELHOUSE = ROOT / "build" / "image" / "wheels"
DEFAULT_BASE = "python:3.11-slim"
DEFAULT_TAG = "remote-partitioner:0.1.0"
#: The Debian base built when ``--base`` cannot be had (bookworm: python3 is 3.11).
DEBIAN_BASE = "remote-partitioner-base:bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv", "passwd")
PULL_TIMEOUT_S = 120
DEBOOTSTRAP_TIMEOUT_S = 900
#: The project itself; installed from the source in the build context, not from the wheelhouse.
PROJECT = "remote-partitioner"


def run(cmd: list[str], *, timeout: float | None = None, **kwargs: object) -> None:
    """Run ``cmd``, echoed; raise SystemExit with its code when it fails."""
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, timeout=timeout, check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(cmd)}")


def have_image(ref: str) -> bool:
    return subprocess.run(
        ["docker", "image", "inspect", ref], capture_output=True, check=False
    ).returncode == 0


def pull(ref: str) -> bool:
    """Try to pull ``ref`` (bounded); False when the registry cannot be reached."""
    try:
        done = subprocess.run(["docker", "pull", ref], capture_output=True, text=True,
                              timeout=PULL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        print(f"docker pull {ref}: no answer in {PULL_TIMEOUT_S} s", flush=True)
        return False
    if done.returncode != 0:
        print(f"docker pull {ref} failed: {done.stderr.strip()[-300:]}", flush=True)
    return done.returncode == 0


def debian_base() -> str:
    """:data:`DEBIAN_BASE`, built with mmdebstrap and imported unless Docker has it."""
    if have_image(DEBIAN_BASE):
        print(f"using the existing {DEBIAN_BASE}", flush=True)
        return DEBIAN_BASE
    if shutil.which("mmdebstrap") is None:
        raise SystemExit("mmdebstrap is needed to build a base image (apt-get install mmdebstrap)")
    with tempfile.TemporaryDirectory(prefix="rp-rootfs-") as tmp:
        tar = Path(tmp) / "rootfs.tar"
        run(["mmdebstrap", "--variant=minbase", f"--include={','.join(DEBIAN_PACKAGES)}",
             "bookworm", str(tar)], timeout=DEBOOTSTRAP_TIMEOUT_S)
        run(["docker", "import", "--change", 'CMD ["python3"]', str(tar), DEBIAN_BASE])
    return DEBIAN_BASE


def choose_base(base: str) -> str:
    if have_image(base) or pull(base):
        return base
    if base != DEFAULT_BASE:
        raise SystemExit(f"the base image {base} cannot be found or pulled")
    print(f"{base} cannot be pulled: building a Debian bookworm base", flush=True)
    return debian_base()


def runtime_closure(
    project: str = PROJECT, extras: frozenset[str] = frozenset()
) -> dict[str, tuple[str, str]]:
    """{canonical name: (distribution name, installed version)} of ``project``'s runtime
    dependencies (with ``extras``), transitively, as installed in this environment;
    ``project`` itself left out."""
    found: dict[str, tuple[str, str]] = {}
    todo: list[tuple[str, frozenset[str]]] = [(project, extras)]
    visited: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if (key, extras) in visited:
            continue
        visited.add((key, extras))
        dist = metadata.distribution(name)
        found[key] = (dist.metadata["Name"], dist.version)
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = [{"extra": e} for e in extras] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(env) for env in wanted):
                continue
            todo.append((req.name, frozenset(req.extras)))
    found.pop(canonicalize_name(project), None)
    return found


def build_backend_requirements() -> list[str]:
    """The project's ``[build-system] requires``, pinned to the versions installed here when
    they are (setuptools), else as written."""
    text = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^\[build-system\]\s*\nrequires\s*=\s*\[(.*?)\]", text, re.M | re.S)
    if block is None:
        raise SystemExit("pyproject.toml has no [build-system] requires")
    pinned = []
    for raw in re.findall(r'"([^"]+)"', block.group(1)):
        req = Requirement(raw)
        try:
            pinned.append(f"{req.name}=={metadata.version(req.name)}")
        except metadata.PackageNotFoundError:
            pinned.append(raw)
    return pinned


def wheelhouse_for(extras: frozenset[str]) -> Path:
    """The wheelhouse of the image with ``extras``: :data:`WHEELHOUSE`, suffixed by them."""
    return WHEELHOUSE.with_name("-".join([WHEELHOUSE.name, *sorted(extras)]))


def make_wheelhouse(extras: frozenset[str] = frozenset()) -> list[str]:
    """Fill :func:`wheelhouse_for` ``extras`` (wheels already there are kept); return the pins
    written to its ``requirements.txt``."""
    wheelhouse = wheelhouse_for(extras)
    wheelhouse.mkdir(parents=True, exist_ok=True)
    closure = runtime_closure(extras=extras)
    pins = sorted(f"{name}=={version}" for name, version in closure.values())
    wanted = pins + build_backend_requirements()
    (wheelhouse / "requirements.txt").write_text("".join(f"{p}\n" for p in pins))
    build_pins = wanted[len(pins):]
    (wheelhouse / "build-requirements.txt").write_text("".join(f"{p}\n" for p in build_pins))
    # pip wheel: a wheel the index has is downloaded (one already in the folder is reused), an
    # sdist-only package is built here (same interpreter version as the image's).
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", str(wheelhouse),
         "--progress-bar", "off", *wanted])
    # Stale versions from an earlier .venv go: one wheel per pinned package.
    pinned = {canonicalize_name(n): Version(v) for n, v in closure.values()}
    for wheel in wheelhouse.glob("*.whl"):
        name, version, _, _ = parse_wheel_filename(wheel.name)
        if name in pinned and version != pinned[name]:
            wheel.unlink()
    return pins


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--base", default=os.environ.get("PYTHON_IMAGE", DEFAULT_BASE),
                        help=f"base image (default {DEFAULT_BASE}; a Debian one is built "
                             "when the default cannot be pulled)")
    parser.add_argument("--tag", default=DEFAULT_TAG)
    parser.add_argument("--no-cache", action="store_true", help="docker build --no-cache")
    parser.add_argument("--extra", action="append", default=[], metavar="EXTRA",
                        help="install the project with this extra (its wheelhouse is this "
                        "environment's, build/image/wheels-EXTRA): arm for the Arm server")
    parser.add_argument("--router", action="store_true",
                        help="build the front door's image instead (deploy/router/Dockerfile)")
    args = parser.parse_args(argv)
    if shutil.which("docker") is None:
        raise SystemExit("docker is not installed")
    started = time.monotonic()
    if args.router:
        base = choose_base(args.base)
        cmd = ["docker", "build", "-f", "deploy/router/Dockerfile",
               "--build-arg", f"BASE_IMAGE={base}", "-t", args.tag]
        run([*cmd, *(["--no-cache"] if args.no_cache else []), "deploy/router"], cwd=ROOT)
        print(f"built {args.tag} on {base} in {time.monotonic() - started:.0f} s", flush=True)
        return 0
    if sys.version_info[:2] != (3, 11):
        # The wheelhouse is the host's pip's choice for the host's Python; the image's is 3.11
        # (python:3.11-slim, or Debian bookworm's).
        raise SystemExit(f"make image needs a Python 3.11 .venv (this is "
                         f"{sys.version_info[0]}.{sys.version_info[1]}): PYTHON=python3.11")
    base = choose_base(args.base)
    extras = frozenset(args.extra)
    pins = make_wheelhouse(extras)
    cmd = ["docker", "build", "-f", "deploy/Dockerfile", "--build-arg", f"PYTHON_IMAGE={base}",
           "--build-arg", f"WHEELHOUSE={wheelhouse_for(extras).relative_to(ROOT)}",
           "--build-arg", f"EXTRAS={','.join(sorted(extras))}", "-t", args.tag]
    if args.no_cache:
        cmd.append("--no-cache")
    run([*cmd, "."], cwd=ROOT)
    print(f"built {args.tag} on {base} with {len(pins)} pinned packages "
          f"in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
