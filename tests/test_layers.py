"""``scripts/check_layers.py`` (run by ``make lint``) passes on this repository and catches
every way of breaking the layering on a tree that breaks it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "check_layers.py"


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--root", str(root)],
                          capture_output=True, text=True, timeout=120)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A minimal repository: the four layer packages, plus ``files`` (path -> source)."""
    for layer in ("proto", "client", "server", "cli"):
        (tmp_path / layer).mkdir()
        (tmp_path / layer / "__init__.py").write_text('"""A layer."""\n')
    for name, source in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return tmp_path


def test_this_repository_holds() -> None:
    done = _run(ROOT)
    assert done.returncode == 0, done.stderr
    assert "layering holds" in done.stdout


def test_allowed_imports_pass(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "proto/a.py": "import grpc\nfrom remote_partitioner.proto.v1 import pb2\n"
                      "from . import b\n",
        "client/a.py": "from remote_partitioner.proto import codec\nimport torch\n",
        "server/sub/a.py": "from remote_partitioner.server import registry\nfrom .. import b\n",
        "cli/__init__.py": "from remote_partitioner.client import cli\n"
                           "from remote_partitioner.server import cli as s\n",
        # the Node.js client's folder is not Python of the package
        "client/node/x.py": "import remote_partitioner.server\n",
    })
    done = _run(root)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("name, source, imported", [
    # a function-local import, as server/cli.py once had
    ("server/cli.py", "def main():\n    from remote_partitioner.client import cli\n",
     "remote_partitioner.client"),
    ("client/a.py", "import remote_partitioner.server.registry as r\n",
     "remote_partitioner.server.registry"),
    ("client/a.py", "from remote_partitioner import server\n", "remote_partitioner.server"),
    ("proto/a.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                   "    from remote_partitioner.client.errors import E\n",
     "remote_partitioner.client.errors"),
    ("proto/a.py", "from ..client import errors\n", "remote_partitioner.client"),
    ("proto/sub/a.py", "from ...server import x\n", "remote_partitioner.server"),
    ("server/a.py", "import importlib\nimportlib.import_module('remote_partitioner.cli')\n",
     "remote_partitioner.cli"),
    ("server/a.py", "import remote_partitioner.nowhere\n", "remote_partitioner.nowhere"),
])
def test_a_violation_is_caught(tmp_path: Path, name: str, source: str, imported: str) -> None:
    root = _tree(tmp_path, {name: source})
    done = _run(root)
    assert done.returncode == 1, done.stdout
    layer = name.split("/")[0]
    assert f"{root / name}:" in done.stderr
    assert f"{layer}/ imports {imported}:" in done.stderr
    assert "1 import(s) break the layering" in done.stderr


def test_a_python_file_that_does_not_parse_fails(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"client/bad.py": "def (:\n"})
    done = _run(root)
    assert done.returncode == 1 and "cannot be parsed" in done.stderr
