"""One command line, two implementations: the Python CLI (``python -m remote_partitioner.cli``)
and the Node.js CLI (``client/node/bin/remote-partitioner.js``) run on the same cases against
one real server, and must agree on the exit code, stdout (text byte for byte, ``--json`` as
parsed JSON) and stderr (the ``remote-partitioner ...: error: ...`` lines; with ``--json`` the
error object, gRPC's own words in ``detail`` aside), and the files they write (``.pte``, report
JSON, the HTML report page: byte for byte). Each case also states what the answer must say, so
that two equally wrong answers fail too. docs/cli.md is the command line's reference.

The server is this module's own process (``serve`` on 127.0.0.1:0) with one plugin partitioner
added, ``xnnpack_raises``, whose ``partition()`` raises, for the "the partitioner raised" case.
Skipped only when ``node`` is not on PATH or client/node's dependencies are not installed
(``make node-client``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import plugin_distribution
from servers import serve_process, silent_target  # (tests/ is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "client" / "node"
NODE = shutil.which("node")
CALL_SECONDS = 300

pytestmark = [
    # About 110 command-line runs (minutes on two idle cores): `make test`, not test-fast.
    pytest.mark.slow,
    # Outside CI a machine without Node skips the table; in CI (CI=true) it must run.
    pytest.mark.skipif(
        (NODE is None or not (NODE_DIR / "node_modules").is_dir())
        and os.environ.get("CI", "").lower() not in ("1", "true", "yes"),
        reason="node and client/node's dependencies (make node-client) are needed",
    ),
]

_RAISING_PLUGIN = '''
"""XNNPACK's partitioner, except that partition() raises."""
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

from remote_partitioner.server.registry import HostedPartitioner


class RaisingPartitioner(XnnpackPartitioner):
    def partition(self, ep):
        raise ValueError("no partition today")


PLUGIN = HostedPartitioner(
    "xnnpack_raises", "XnnpackBackend", {}, lambda spec: RaisingPartitioner(),
    RaisingPartitioner, "XNNPACK, whose partition() raises",
)
'''


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """This module's server: the default partitioners and ``xnnpack_raises``."""
    root = tmp_path_factory.mktemp("plugin")
    with (
        plugin_distribution(root, "rp_raising_plugin", _RAISING_PLUGIN,
                            "xnnpack_raises = rp_raising_plugin:PLUGIN"),
        serve_process(tmp_path_factory.mktemp("server") / "server.log") as (_, address, _),
    ):
        yield address


@pytest.fixture(scope="module")
def dead_target() -> Iterator[str]:
    """A loopback port bound but not listening: connections to it are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module", name="silent_target")
def _silent_target() -> Iterator[str]:
    """A loopback port that listens and never speaks (:func:`servers.silent_target`)."""
    with silent_target() as address:
        yield address


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The input files of the cases: ``model.pt2`` (Linear, ReLU, then a cumsum XNNPACK
    leaves on the CPU), a truncated copy, a text file, a zip file that is no PT2 archive;
    ``saved.json``, a report whose strings need escaping in the page (markup, quotes, control
    and non-ASCII characters) and whose backends include ones without a fixed colour, and
    ``list.json``, JSON that is no report."""
    import torch

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cumsum(torch.relu(self.fc(x)), dim=1)

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("inputs")
    model = root / "model.pt2"
    torch.export.save(torch.export.export(Model().eval(), (torch.randn(2, 8),)), model)
    data = model.read_bytes()
    (root / "truncated.pt2").write_bytes(data[: len(data) // 2])
    (root / "notes.pt2").write_text("not an archive\n")
    with zipfile.ZipFile(root / "other.pt2", "w") as z:
        z.writestr("other/data.txt", "a zip file, but no PT2 archive")
    tricky = "</script><b>&amp; 'q' \"qq\" \u2028\x7f\x01\n\t\\ é 😀 {{TITLE}}"
    saved = {
        "model": "dir/model.pt2", "partitioners": ["xnnpack", "acme"],
        "methods": [{
            "method": "forward", "total_nodes": 3,
            "delegated": [{"backend_id": "XnnpackBackend", "partitions": 1, "nodes": 1},
                          {"backend_id": "AcmeBackend", "partitions": 1, "nodes": 1}],
            "cpu_ops": [{"op": "aten.cumsum.default", "count": 1}],
            "nodes": [
                {"name": "x", "op": "", "kind": "placeholder", "shapes": "[2, 8]"},
                {"name": "linear", "op": "aten.linear.default", "kind": "call_function",
                 "inputs": ["x"], "backend_id": "XnnpackBackend", "partition": "0",
                 "module_stack": [{"path": "fc", "type": "torch.nn.Linear"}]},
                {"name": tricky, "op": "aten.relu.default", "kind": "call_function",
                 "inputs": ["linear"], "backend_id": "AcmeBackend", "partition": "1"},
                {"name": "cumsum", "op": "aten.cumsum.default", "kind": "call_function",
                 "inputs": [tricky], "reason": tricky, "reason_source": "REJECTION_SOURCE_DERIVED"},
            ],
            "partitions": [{"id": "0", "backend_id": "XnnpackBackend", "nodes": 1},
                           {"id": "1", "backend_id": "ZetaBackend", "nodes": 1}],
            "cpu_nodes": [{"name": "cumsum", "op": "aten.cumsum.default", "reason": tricky}],
        }],
    }
    (root / "saved.json").write_text(json.dumps(saved, indent=2, ensure_ascii=False),
                                     encoding="utf-8")
    (root / "list.json").write_text("[1, 2]\n")
    return root


@dataclasses.dataclass(frozen=True)
class Case:
    """One command line, run by both CLIs. ``args`` may name ``{target}`` and ``{dead}``;
    relative paths are in each CLI's own working directory (holding the inputs and a
    directory ``dir``). ``says`` must be in stdout (exit 0) or stderr (otherwise)."""

    id: str
    args: tuple[str, ...]
    exit_code: int
    says: str
    files: tuple[str, ...] = ()  # outputs that both must write, byte for byte the same

    @property
    def json(self) -> bool:
        return "--json" in self.args


P = ("--partitioner", "xnnpack")
CASES = [
    Case("list", ("list",), 0, "xnnpack  XnnpackBackend  "),
    Case("list-json", ("list", "--json"), 0, '"name": "xnnpack_raises"'),
    Case("partition", ("partition", "model.pt2", *P), 0,
         "  XnnpackBackend: 2 nodes in 1 partition\n  left on the CPU:\n"),
    Case("partition-why", ("partition", "model.pt2", *P), 0,
         "  why:\n    aten.cumsum.default: "),
    Case("partition-json", ("partition", "model.pt2", *P, "--json"), 0, '"total_nodes": 3,'),
    Case("partition-two", ("partition", "model.pt2", "--partitioner", "xnnpack", "--spec",
                           "per_op_mode=false", "--partitioner", "vulkan", "--json"), 0,
         '"partitioners": [\n    "xnnpack",\n    "vulkan"\n  ]'),
    Case("lower", ("lower", "model.pt2", "-o", "out.pte", *P), 0, "wrote out.pte (",
         files=("out.pte",)),
    Case("lower-json-report-json", ("lower", "model.pt2", "-o", "dir/out.pte", *P, "--json",
                                    "--report-json", "dir/report.json"), 0,
         '"output": {\n    "path": "dir/out.pte",', files=("dir/out.pte", "dir/report.json")),
    Case("lower-report-only", ("lower", "model.pt2", "--report-only", *P), 0,
         "2 nodes in 1 partition"),
    Case("lower-needs-output", ("lower", "model.pt2", *P), 2,
         "-o OUT.pte is required (or --report-only)"),
    Case("unknown-partitioner", ("partition", "model.pt2", "--partitioner", "nope"), 1,
         "the server refused: NOT_FOUND: unknown partitioner 'nope'"),
    Case("unknown-partitioner-json", ("partition", "model.pt2", "--partitioner", "nope",
                                      "--json"), 1, '"reason": "UNKNOWN_PARTITIONER"'),
    Case("spec-str-prefix", ("partition", "model.pt2", *P, "--spec", "per_op_mode=str:true"), 1,
         "expects bool, got str 'true' [INVALID_SPEC]"),
    Case("spec-int", ("partition", "model.pt2", *P, "--spec", "per_op_mode=1"), 1,
         "expects bool, got int 1 [INVALID_SPEC]"),
    Case("spec-before-partitioner", ("partition", "model.pt2", "--spec", "per_op_mode=true",
                                     *P), 2, "comes before any --partitioner"),
    Case("spec-without-value", ("partition", "model.pt2", *P, "--spec", "per_op_mode"), 2,
         '--spec wants KEY=VALUE, got "per_op_mode"'),
    Case("spec-twice", ("partition", "model.pt2", *P, "--spec", "a=1", "--spec", "a=2"), 2,
         'key "a" given twice'),
    Case("spec-int64", ("partition", "model.pt2", *P, "--spec", "a=9223372036854775808"), 2,
         "outside the int64 range"),
    Case("partitioner-raised", ("partition", "model.pt2", "--partitioner", "xnnpack_raises"), 1,
         "the partitioner raised ValueError: no partition today"),
    Case("partitioner-raised-json", ("partition", "model.pt2", "--partitioner",
                                     "xnnpack_raises", "--json"), 1, '"kind": "partitioner"'),
    Case("missing-model", ("partition", "missing.pt2", *P), 2,
         "cannot read missing.pt2: No such file or directory"),
    Case("not-a-zip", ("partition", "notes.pt2", *P), 2, "notes.pt2 is not a PT2 archive"),
    Case("truncated", ("partition", "truncated.pt2", *P), 2,
         "truncated.pt2 is not a PT2 archive (not a zip file, or truncated"),
    Case("zip-not-pt2", ("partition", "other.pt2", *P), 2, "no archive_format entry"),
    Case("output-dir-missing", ("lower", "model.pt2", "-o", "nowhere/out.pte", *P), 2,
         "the directory nowhere does not exist"),
    Case("output-is-dir", ("lower", "model.pt2", "-o", "dir", *P, "--json"), 2,
         '"message": "-o dir is a directory; give a file path"'),
    Case("report-json-dir-missing", ("partition", "model.pt2", *P, "--report-json",
                                     "nowhere/r.json"), 2, "--report-json nowhere/r.json: "),
    Case("partition-report", ("partition", "model.pt2", *P, "--report", "page.html"), 0,
         "wrote page.html (open it in a browser)\n", files=("page.html",)),
    Case("lower-report-and-json", ("lower", "model.pt2", "-o", "out.pte", "--partitioner",
                                   "xnnpack", "--partitioner", "vulkan", "--report",
                                   "dir/page.html", "--report-json", "dir/r.json"), 0,
         "wrote dir/page.html (open it in a browser)\nwrote dir/r.json\n",
         files=("out.pte", "dir/page.html", "dir/r.json")),
    Case("lower-report-json-output", ("lower", "model.pt2", "--report-only", *P, "--report",
                                      "page.html", "--json"), 0, '"model": "model.pt2"',
         files=("page.html",)),
    Case("report-dir-missing", ("partition", "model.pt2", *P, "--report", "nowhere/p.html"), 2,
         "--report nowhere/p.html: the directory nowhere does not exist"),
    Case("report-is-dir", ("lower", "model.pt2", "-o", "out.pte", *P, "--report", "dir"), 2,
         "--report dir is a directory; give a file path"),
    Case("report", ("report", "saved.json", "-o", "page.html"), 0, "wrote page.html\n",
         files=("page.html",)),
    Case("report-title", ("report", "saved.json", "-o", "dir/page.html", "--title",
                          "<My> model & 'its' \"page\""), 0, "wrote dir/page.html\n",
         files=("dir/page.html",)),
    Case("report-empty-title", ("report", "-o", "page.html", "--title=", "saved.json"), 0,
         "wrote page.html\n", files=("page.html",)),
    Case("report-needs-args", ("report",), 2,
         "the following arguments are required: REPORT.json, -o/--output"),
    Case("report-needs-output", ("report", "saved.json"), 2,
         "the following arguments are required: -o/--output"),
    Case("report-output-no-value", ("report", "saved.json", "-o"), 2,
         "argument -o/--output: expected one argument"),
    Case("report-extra", ("report", "saved.json", "-o", "page.html", "more.json"), 2,
         "remote-partitioner: error: unrecognized arguments: more.json"),
    Case("report-json-refused", ("report", "saved.json", "-o", "page.html", "--json"), 2,
         '"message": "unrecognized arguments: --json"'),
    Case("report-missing-json", ("report", "missing.json", "-o", "page.html"), 2,
         "cannot read missing.json: [Errno 2] No such file or directory: 'missing.json'"),
    Case("report-not-a-report", ("report", "list.json", "-o", "page.html"), 2,
         "list.json holds no delegation report (no 'methods' list)"),
    Case("report-output-dir-missing", ("report", "saved.json", "-o", "nowhere/page.html"), 2,
         "-o nowhere/page.html: the directory nowhere does not exist"),
    Case("bad-request-id", ("list", "--request-id", "a b"), 2, "--request-id wants 1 to 64"),
    Case("request-id", ("list", "--request-id", "table-1", "--json"), 0, '"api": "v1"'),
    Case("timeout", ("list", "--timeout", "0.5", "--target", "{silent}"), 1,
         "no answer within the --timeout of 0.5 s"),
    Case("unreachable", ("list", "--target", "{dead}"), 3,
         "cannot reach {dead}: is a server running there? Start one with: "
         "remote-partitioner serve --address {dead}"),
    Case("unreachable-json", ("partition", "model.pt2", *P, "--target", "{dead}", "--json"), 3,
         '"kind": "unreachable"'),
    Case("tls-to-plaintext", ("list", "--tls"), 3, "cannot reach"),
]


def _commands() -> dict[str, list[str]]:
    assert NODE is not None
    return {
        "python": [sys.executable, "-m", "remote_partitioner.cli"],
        "node": [NODE, str(NODE_DIR / "bin" / "remote-partitioner.js")],
    }


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=CALL_SECONDS,
                          env={**os.environ, "PYTHONWARNINGS": "ignore", "NO_COLOR": "1"})


def _error_lines(stderr: str) -> list[str]:
    """The command line's own error lines (argparse's usage lines and gRPC's words aside)."""
    return [line for line in stderr.splitlines() if line.startswith("remote-partitioner")]


def _json_error(stderr: str) -> dict[str, Any]:
    error: dict[str, Any] = json.loads(stderr)["error"]
    assert set(error) == {"exit_code", "kind", "code", "reason", "message", "detail"}
    error.pop("detail")
    return error


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_both_clis_agree(case: Case, target: str, dead_target: str, silent_target: str,
                         inputs: Path, tmp_path: Path) -> None:
    args = [a.replace("{dead}", dead_target).replace("{silent}", silent_target)
            for a in case.args]
    if "--target" not in args and args[0] != "report":  # report: no server
        args += ["--target", target]
    says = case.says.replace("{dead}", dead_target)
    runs: dict[str, Path] = {}
    for name in ("python", "node"):
        cwd = tmp_path / name
        shutil.copytree(inputs, cwd)
        (cwd / "dir").mkdir()
        runs[name] = cwd
    with ThreadPoolExecutor(2) as pool:
        done = dict(zip(runs, pool.map(
            lambda item: _run([*item[0], *args], item[1]),
            [(cmd, runs[name]) for name, cmd in _commands().items()],
        ), strict=True))
    py, node = done["python"], done["node"]
    both = f"python:\n{py.stdout[-3000:]}{py.stderr[-3000:]}\nnode:\n{node.stdout[-3000:]}" \
           f"{node.stderr[-3000:]}"
    assert (py.returncode, node.returncode) == (case.exit_code, case.exit_code), both
    if case.exit_code == 0:
        assert says in py.stdout, both
        if case.json:
            assert json.loads(py.stdout) == json.loads(node.stdout), both
        else:
            assert py.stdout == node.stdout, both
        assert py.stderr == node.stderr == "", both
    else:
        assert says in py.stderr, both
        assert py.stdout == node.stdout == "", both
        if case.json:
            error = _json_error(py.stderr)
            assert error == _json_error(node.stderr), both
            assert error["exit_code"] == case.exit_code
        else:
            assert _error_lines(py.stderr), both
            assert _error_lines(py.stderr) == _error_lines(node.stderr), both
    for file in case.files:
        written = (runs["python"] / file).read_bytes()
        assert written and written == (runs["node"] / file).read_bytes(), file
    if case.exit_code != 0:
        for cwd in runs.values():  # nothing written when refused
            assert not (cwd / "page.html").exists()


def test_report_reads_either_clients_report_json(target: str, inputs: Path,
                                                 tmp_path: Path) -> None:
    """``report``, of either CLI, turns the JSON either CLI wrote (--report-json, or --json's
    output) into a page titled with the model and partitioners: the same bytes in all eight
    combinations, and the same as the page --report wrote during the call."""
    saved, pages = {}, {}
    for name, cmd in _commands().items():
        out = tmp_path / f"{name}.json"
        during = tmp_path / f"{name}-during.html"
        done = _run([*cmd, "partition", str(inputs / "model.pt2"), *P, "--target", target,
                     "--report-json", str(out), "--report", str(during)], tmp_path)
        assert done.returncode == 0, done.stderr
        saved[name] = json.loads(out.read_text())
        pages[f"{name} --report"] = during.read_bytes()
        printed = _run([*cmd, "partition", str(inputs / "model.pt2"), *P, "--target", target,
                        "--json"], tmp_path)
        assert json.loads(printed.stdout) == saved[name]
        (tmp_path / f"{name}-printed.json").write_text(printed.stdout)
    for writer in _commands():
        for source in (f"{writer}.json", f"{writer}-printed.json"):
            for reader, cmd in _commands().items():
                page = tmp_path / f"{reader}-of-{source}.html"
                done = _run([*cmd, "report", str(tmp_path / source), "-o", str(page)], tmp_path)
                assert (done.returncode, done.stdout) == (0, f"wrote {page}\n"), done.stderr
                pages[f"{reader} report {source}"] = page.read_bytes()
    assert saved["python"] == saved["node"]
    assert saved["python"]["model"] == "model.pt2"
    assert saved["python"]["partitioners"] == ["xnnpack"]
    [method] = saved["python"]["methods"]
    assert isinstance(method["total_nodes"], int)
    assert [c["op"] for c in method["cpu_nodes"]] == ["aten.cumsum.default"]
    first = pages["python report python.json"]
    assert "<title>Delegation report: model.pt2 (xnnpack)</title>" in first.decode()
    assert '"XnnpackBackend":"#2f7ed8"' in first.decode()
    assert len(pages) == 10
    assert {k: v == first for k, v in pages.items()} == {k: True for k in pages}


def test_a_closed_stdout_ends_quietly(target: str) -> None:
    """``list | head -2`` when the reader is gone before the first write: no traceback and no
    message, exit 1 (as Python's documentation of SIGPIPE does it), in both CLIs."""
    for name, cmd in _commands().items():
        read, write = os.pipe()
        os.close(read)
        try:
            done = subprocess.run([*cmd, "list", "--target", target], stdout=write,
                                  stderr=subprocess.PIPE, text=True, timeout=CALL_SECONDS,
                                  env={**os.environ, "PYTHONWARNINGS": "ignore"})
        finally:
            os.close(write)
        assert (done.returncode, done.stderr) == (1, ""), f"{name}: {done.stderr[-3000:]}"


def test_both_clis_write_the_pte_the_same_way(target: str, inputs: Path, tmp_path: Path) -> None:
    """``lower -o`` through a symbolic link writes the file it names and keeps the link and
    the file's mode; ``-o`` of a named pipe writes into the pipe and leaves it a pipe; no
    temporary file is left: in both CLIs, with the same bytes."""
    ptes: dict[str, bytes] = {}
    for name, cmd in _commands().items():
        work = tmp_path / name
        (work / "real").mkdir(parents=True)
        real = work / "real" / "model.pte"
        real.write_bytes(b"old")
        real.chmod(0o640)
        (work / "link.pte").symlink_to(Path("real") / "model.pte")
        (work / "dangling.pte").symlink_to(Path("real") / "new.pte")
        pipe = work / "pipe.pte"
        os.mkfifo(pipe)
        # The pipe's reader, a process (killable while it waits in open() for a writer).
        with (work / "piped").open("wb") as piped:
            reader = subprocess.Popen(["cat", str(pipe)], stdout=piped)
        try:
            for out in ("link.pte", "dangling.pte", "pipe.pte"):
                done = _run([*cmd, "lower", str(inputs / "model.pt2"), "-o", out,
                             "--partitioner", "xnnpack", "--target", target], work)
                assert done.returncode == 0, f"{name} -o {out}: {done.stderr[-3000:]}"
            assert reader.wait(timeout=60) == 0, name
        finally:
            reader.kill()
            reader.wait()
        assert (work / "piped").read_bytes() == real.read_bytes(), name
        (work / "piped").unlink()
        assert (work / "link.pte").is_symlink() and (work / "dangling.pte").is_symlink()
        assert (work / "pipe.pte").is_fifo(), name
        assert oct(real.stat().st_mode & 0o7777) == oct(0o640), name
        assert (work / "real" / "new.pte").read_bytes() == real.read_bytes(), name
        assert sorted(p.name for p in work.rglob("*")) == [
            "dangling.pte", "link.pte", "model.pte", "new.pte", "pipe.pte", "real"], name
        ptes[name] = real.read_bytes()
    assert ptes["python"] == ptes["node"] and ptes["python"][4:8] == b"ET12"


def test_both_clis_keep_an_output_that_holds_the_pte(target: str, inputs: Path,
                                                     tmp_path: Path) -> None:
    """Either CLI leaves alone an output the digest cache (which they share) knows holds the
    ``.pte`` (nothing downloaded: ``held_pte``), and writes it again once it changed."""
    cmds = _commands()
    out = tmp_path / "model.pte"
    model = tmp_path / "model.pt2"
    model.write_bytes((inputs / "model.pt2").read_bytes())

    def lower(name: str) -> str:
        done = _run([*cmds[name], "lower", str(model), "-o", str(out), "--partitioner",
                     "xnnpack", "--target", target], tmp_path)
        assert done.returncode == 0, f"{name}: {done.stderr[-3000:]}"
        return done.stdout.splitlines()[-1]

    for writer, keeper in (("python", "node"), ("node", "python")):
        out.unlink(missing_ok=True)
        assert lower(writer).startswith(f"wrote {out} ("), writer
        pte, written = out.read_bytes(), out.stat()
        assert lower(keeper) == (f"kept {out} ({len(pte)} bytes, sha256 "
                                 f"{hashlib.sha256(pte).hexdigest()}): it already held this .pte")
        assert (out.stat().st_ino, out.stat().st_mtime_ns) == (written.st_ino, written.st_mtime_ns)
        with open(out, "r+b") as f:  # changed in place, the same size: written again
            f.write(b"\0\0\0\0")
        assert lower(keeper).startswith(f"wrote {out} (") and out.read_bytes() == pte, keeper
