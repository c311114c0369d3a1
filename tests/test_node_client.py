"""The Node.js client (client/node) against a real server process: `list`, `lower` (whose `.pte`
must equal the local lowering's, byte for byte), and its exit codes. What it shares with the
Python CLI (output, JSON, errors, local checks) is compared case by case in
tests/test_cli_table.py.

Skipped only when `node` or `npm` is not on PATH. The client's dependencies are installed with
`npm ci` from its committed lock file when client/node/node_modules is absent.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "client" / "node"
CLI = NODE_DIR / "bin" / "remote-partitioner.js"
NPM_CI_SECONDS = 600
CALL_SECONDS = 300

NODE = shutil.which("node")
NPM = shutil.which("npm")

pytestmark = pytest.mark.skipif(
    NODE is None or NPM is None,
    reason="node and npm are needed for the Node.js client (client/node); not on PATH",
)


@pytest.fixture(scope="session")
def node_client() -> Path:
    """client/node with its dependencies installed (`npm ci`, once per session)."""
    if not (NODE_DIR / "node_modules").is_dir():
        assert NPM is not None
        result = subprocess.run(
            [NPM, "ci", "--no-audit", "--no-fund"],
            cwd=NODE_DIR, capture_output=True, text=True, timeout=NPM_CI_SECONDS,
        )
        assert result.returncode == 0, f"npm ci failed:\n{result.stdout}\n{result.stderr}"
    return CLI


def run_cli(cli: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert NODE is not None
    return subprocess.run(
        [NODE, str(cli), *args], capture_output=True, text=True, timeout=CALL_SECONDS,
        env={**os.environ, "NO_COLOR": "1"},
    )


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small PT2 archive (`torch.export.save`) of Linear + ReLU."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU()).eval()
    path = tmp_path_factory.mktemp("node_client") / "model.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(2, 8),)), path)
    return path


@pytest.fixture()
def dead_port() -> Iterator[int]:
    """A loopback port that is bound (so nobody else takes it) but not listening: connections
    to it are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_node_unit_tests(node_client: Path) -> None:
    assert NODE is not None
    result = subprocess.run(
        [NODE, "--test", "test/"], cwd=NODE_DIR, capture_output=True, text=True,
        timeout=CALL_SECONDS,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_list_json(node_client: Path, server_address: str) -> None:
    result = run_cli(node_client, "list", "--target", server_address, "--json")
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    by_name = {p["name"]: p for p in listing["partitioners"]}
    assert "xnnpack" in by_name
    assert [p["name"] for p in listing["partitioners"]] == sorted(by_name)
    xnnpack = by_name["xnnpack"]
    assert xnnpack["backend_id"] == "XnnpackBackend"
    assert "HOOK_PARTITION" in xnnpack["overridden_hooks"]
    keys = {k["name"]: k for k in xnnpack["spec_keys"]}
    assert keys["per_op_mode"]["type"] == "SPEC_TYPE_BOOL"
    assert keys["per_op_mode"]["default"] is False
    assert listing["versions"]["api"] == "v1"


def test_list_text(node_client: Path, server_address: str) -> None:
    result = run_cli(node_client, "list", "--target", server_address)
    assert result.returncode == 0, result.stderr
    assert "xnnpack  XnnpackBackend" in result.stdout
    assert "per_op_mode: bool = false" in result.stdout


@pytest.mark.slow
def test_lower_matches_local(
    node_client: Path, server_address: str, archive: Path, tmp_path: Path
) -> None:
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    out = tmp_path / "out.pte"
    result = run_cli(
        node_client, "lower", str(archive), "-o", str(out), "--partitioner", "xnnpack",
        "--target", server_address, "--json",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    answer = json.loads(result.stdout)

    local = to_edge_transform_and_lower(
        torch.export.load(archive), partitioner=[XnnpackPartitioner()]
    ).to_executorch().buffer
    remote = out.read_bytes()
    assert remote == local, f"node .pte ({len(remote)} bytes) != local ({len(local)} bytes)"
    assert answer["output"]["bytes"] == len(local)
    assert answer["output"]["path"] == str(out)
    assert answer["model"] == archive.name and answer["partitioners"] == ["xnnpack"]
    [method] = answer["methods"]
    assert method["method"] == "forward"
    assert [d["backend_id"] for d in method["delegated"]] == ["XnnpackBackend"]
    assert isinstance(method["total_nodes"], int)  # a number, not protobuf JSON's string
    assert not list(tmp_path.glob("*.tmp-*")), "the temporary .pte was left behind"

    # Again, with a spec: the same .pte.
    again = tmp_path / "again.pte"
    result = run_cli(
        node_client, "lower", str(archive), "-o", str(again), "--partitioner", "xnnpack",
        "--spec", "per_op_mode=false", "--target", server_address, "--json",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert again.read_bytes() == local

    # Text output: the report and the file written; into a file that holds it, the file kept.
    text = tmp_path / "text.pte"
    for verb in ("wrote", "kept"):
        result = run_cli(
            node_client, "lower", str(archive), "-o", str(text), "--partitioner", "xnnpack",
            "--target", server_address,
        )
        assert result.returncode == 0, result.stderr
        assert "in 1 partition\n" in result.stdout
        assert f"{verb} {text} ({len(local)} bytes, sha256 " in result.stdout
        assert text.read_bytes() == local


def test_lower_server_error_reason(
    node_client: Path, server_address: str, archive: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out.pte"
    result = run_cli(
        node_client, "lower", str(archive), "-o", str(out), "--partitioner", "no-such",
        "--target", server_address, "--json",
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout == ""  # with --json an error goes to stderr, as one JSON object
    error = json.loads(result.stderr)["error"]
    assert (error["kind"], error["code"]) == ("server", "NOT_FOUND")
    assert error["reason"] == "UNKNOWN_PARTITIONER"
    assert not out.exists()

    result = run_cli(
        node_client, "lower", str(archive), "-o", str(out), "--partitioner", "xnnpack",
        "--spec", "per_op_mode=3", "--target", server_address,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "INVALID_ARGUMENT" in result.stderr
    assert "[INVALID_SPEC]" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["frobnicate"],
        ["list", "--target", "127.0.0.1:1", "--no-such-option"],
        ["list", "--target", "127.0.0.1:1", "--request-id", "not valid"],
        ["partition", "model.pt2", "--target", "127.0.0.1:1", "--spec", "a=1",
         "--partitioner", "xnnpack"],
        ["lower", "--target", "127.0.0.1:1", "--partitioner", "xnnpack", "-o", "x.pte"],
        ["lower", "model.pt2", "--target", "127.0.0.1:1", "--partitioner", "xnnpack"],
        ["lower", "model.pt2", "-o", "x.pte", "--target", "127.0.0.1:1"],
        ["lower", "model.pt2", "-o", "x.pte", "--partitioner", "xnnpack", "--spec", "novalue",
         "--target", "127.0.0.1:1"],
    ],
)
def test_usage_error_exits_2(node_client: Path, args: list[str]) -> None:
    result = run_cli(node_client, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "error:" in result.stderr


def test_unreadable_inputs_exit_2(node_client: Path, archive: Path, tmp_path: Path) -> None:
    result = run_cli(
        node_client, "lower", str(tmp_path / "missing.pt2"), "-o", str(tmp_path / "x.pte"),
        "--partitioner", "xnnpack", "--target", "127.0.0.1:1",
    )
    assert result.returncode == 2, result.stderr
    empty = tmp_path / "token"
    empty.write_text("# no token here\n\n")
    result = run_cli(node_client, "list", "--target", "127.0.0.1:1", "--token-file", str(empty))
    assert result.returncode == 2, result.stderr
    assert "holds no token" in result.stderr


@pytest.fixture(scope="module")
def token_server() -> Iterator[str]:
    """An in-process server that admits only `authorization: Bearer node-s3cret`."""
    from servers import inproc_server  # (tests/ is on sys.path)

    from remote_partitioner.server.auth import BearerTokenInterceptor

    with inproc_server(interceptors=[BearerTokenInterceptor(["node-s3cret"])]) as (_, target):
        yield target


def test_bearer_token(node_client: Path, token_server: str, tmp_path: Path) -> None:
    good = tmp_path / "good.token"
    good.write_text("# the client's token\n\n  node-s3cret  \n")
    result = run_cli(node_client, "list", "--target", token_server, "--token-file", str(good),
                     "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "xnnpack" in {p["name"] for p in json.loads(result.stdout)["partitioners"]}

    result = run_cli(node_client, "list", "--target", token_server, "--json")
    assert result.returncode == 1, result.stdout + result.stderr
    error = json.loads(result.stderr)["error"]
    assert (error["code"], error["reason"]) == ("UNAUTHENTICATED", "UNAUTHENTICATED")

    bad = tmp_path / "bad.token"
    bad.write_text("wrong\n")
    result = run_cli(node_client, "list", "--target", token_server, "--token-file", str(bad))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "PERMISSION_DENIED" in result.stderr
    assert "[PERMISSION_DENIED]" in result.stderr
    assert "wrong" not in result.stderr


def test_unreachable_server_exits_3(node_client: Path, archive: Path, dead_port: int,
                                   tmp_path: Path) -> None:
    target = f"127.0.0.1:{dead_port}"
    result = run_cli(node_client, "list", "--target", target)
    assert result.returncode == 3, result.stdout + result.stderr
    assert f"cannot reach {target}" in result.stderr
    assert f"remote-partitioner serve --address {target}" in result.stderr
    result = run_cli(
        node_client, "lower", str(archive), "-o", str(tmp_path / "x.pte"),
        "--partitioner", "xnnpack", "--target", target, "--json",
    )
    assert result.returncode == 3, result.stdout + result.stderr
    error = json.loads(result.stderr)["error"]
    assert (error["kind"], error["code"], error["exit_code"]) == ("unreachable", "UNAVAILABLE", 3)


def test_version_and_help(node_client: Path) -> None:
    package = json.loads((NODE_DIR / "package.json").read_text())
    result = run_cli(node_client, "--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"remote-partitioner {package['version']} (Node.js client;")
    for command in ("list", "partition", "lower"):
        result = run_cli(node_client, command, "--help")
        assert result.returncode == 0, result.stderr
        assert "(default: 127.0.0.1:50051)" in result.stdout
        assert "--request-id" in result.stdout and "--tls " in result.stdout
    result = run_cli(node_client, "lower", "--help")
    assert "--skip-ir-validity-check" in result.stdout and "--report-only" in result.stdout
