"""Shared fixtures: a real server process on a free loopback port, and an in-process one."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import servers
from servers import Launched, launch, serve_process, served  # (tests/ is on sys.path)

warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=DeprecationWarning)


def modules_loaded_by(code: str, roots: set[str], timeout: float = 120) -> list[str]:
    """The modules under ``roots`` (top-level package names) that a fresh interpreter has
    loaded after running ``code``, sorted: what importing something light drags in."""
    probe = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(roots)!r})))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=timeout)
    loaded: list[str] = json.loads(out.stdout)
    return loaded


@contextlib.contextmanager
def plugin_distribution(
    root: Path, module: str, source: str, entry_point: str,
    group: str = "remote_partitioner.partitioners",
) -> Iterator[None]:
    """Install, for this process and the servers it starts, a one-module distribution that
    registers ``entry_point`` ("name = module:ATTR") in the entry point ``group`` (the
    partitioner plugins' by default, or ``remote_partitioner.backends``): the same path a
    third-party package takes. ``source`` is the module's code."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    dist = root / f"{module}-1.0.dist-info"
    dist.mkdir()
    name = module.replace("_", "-")
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{group}]\n{entry_point}\n")
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), saved) if p)
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))
        sys.modules.pop(module, None)
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved


@contextlib.contextmanager
def _serve(
    tmp_path_factory: pytest.TempPathFactory, *args: str
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`remote-partitioner serve ARGS` in its own process, on a free port of 127.0.0.1,
    SERVING; yields (process, target) and stops it on exit."""
    log = tmp_path_factory.mktemp("server") / "server.log"
    with serve_process(log, *args) as (proc, target, _):
        yield proc, target


#: The session server, started when the session starts (:func:`pytest_sessionstart`) so that
#: its imports (about 10 s) run on the other core while this process collects the tests;
#: :func:`server_process` takes it. The session's directories (its log's, the digest cache's),
#: removed when the session ends.
_EARLY_SERVER: list[Launched] = []
_EARLY_LOG_DIR: list[Path] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    # The command lines the tests run remember digests in a directory of the session's, not
    # in the user's cache (client/digest_cache.py).
    _EARLY_LOG_DIR.append(Path(tempfile.mkdtemp(prefix="rp-session-digests-")))
    os.environ["REMOTE_PARTITIONER_DIGEST_CACHE"] = str(_EARLY_LOG_DIR[-1])
    if session.config.option.collectonly:
        return  # no test runs: a server would only compete with collection
    _EARLY_LOG_DIR.append(Path(tempfile.mkdtemp(prefix="rp-session-server-")))
    _EARLY_SERVER.append(launch(_EARLY_LOG_DIR[-1] / "server.log"))


def pytest_sessionfinish(session: pytest.Session) -> None:
    while _EARLY_SERVER:  # no test asked for it: stop it
        _EARLY_SERVER.pop().stop()
    while _EARLY_LOG_DIR:
        shutil.rmtree(_EARLY_LOG_DIR.pop(), ignore_errors=True)


@pytest.fixture(scope="session")
def server_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`remote-partitioner serve` with default settings, shared by the session (started with
    the session)."""
    started = (_EARLY_SERVER.pop() if _EARLY_SERVER
               else launch(tmp_path_factory.mktemp("server") / "server.log"))
    with served(started) as (proc, target, _):
        yield proc, target


@pytest.fixture(scope="session")
def uncached_server_process(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """A server whose result cache is off, so that every hook call runs the partitioner."""
    with _serve(tmp_path_factory, "--result-cache-bytes", "0") as started:
        yield started


@pytest.fixture(scope="session")
def server_address(server_process: tuple[subprocess.Popen[str], str]) -> str:
    """The target string of the session's server process."""
    return server_process[1]


@pytest.fixture()
def inproc_server() -> Iterator[tuple[object, str]]:
    """A server in this process (for tests that look at its blob store); yields (its blob
    store, target)."""
    from remote_partitioner.server.blobstore import BlobStore

    store = BlobStore()
    with servers.inproc_server(blob_store=store) as (_, target):
        yield store, target


@pytest.fixture()
def torchao_qat_memo() -> Iterator[None]:
    """torchao's QAT conv-batch norm pattern graphs memoized for the test
    (``pattern_memo.memoize_torchao_qat_pattern_graphs``; ``prepare_qat_pt2e`` and
    ``convert_pt2e`` export them on every call, most of a QAT test's time): the test's first QAT
    run (its local one) makes exactly torchao's own exports, the later runs get deep copies of
    them (tests/test_pattern_memo.py checks that a copy is a fresh export's graph). The process
    starts unmemoized and is unmemoized again after the test."""
    from torchao.quantization.pt2e import qat_utils

    from remote_partitioner.server.pattern_memo import memoize_torchao_qat_pattern_graphs

    assert not getattr(qat_utils._get_aten_graph_module_for_pattern, "memoized", False)
    restore = memoize_torchao_qat_pattern_graphs()
    assert restore is not None
    try:
        yield
    finally:
        restore()
