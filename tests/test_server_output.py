"""What the server writes, at each log level (issue 30): a real ``remote-partitioner serve``
process answers a batch of real calls (list; the partitioner hooks and preprocess of XNNPACK,
Core ML and Vulkan through ``RemotePartitioner``; a ``Lower``), and its stdout and stderr are
read line by line.

At the default level (WARNING) stdout holds the "serving ... on" line and stderr nothing
while it serves (the partitioners' INFO lines, coremltools' progress bars, torch's
FutureWarnings and the optional libraries' start-up messages all go through logging, below
WARNING); stopping it adds its shutdown notice. At INFO every stderr line is a log record:
one access line per call, and a bounded number of others. The server runs without
``PYTHONWARNINGS`` (the launcher's default ignores warnings; an operator's server does not).

The fast tests below check :func:`configure_logging`'s parts in this process.
"""

from __future__ import annotations

import collections
import io
import logging
import queue
import re
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import servers  # (tests/ is on sys.path)
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from models import small_models

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.client.lower import LowerClient, partitioner_ref
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server.observability import (
    ACCESS_LOGGER,
    KNOWN_NOISE,
    ProgressLog,
    configure_logging,
)
from remote_partitioner.server.registry import HostedPartitioner, Registry

#: A log record's first line, as :data:`~remote_partitioner.server.observability.LOG_FORMAT`
#: writes it: level, logger, request id, message.
RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) (\S+) "
    r"\[([^\]]*)\]: (.*)$"
)
ACCESS = re.compile(r"^rpc=(\S+) partitioner=(\S+) code=(\S+) ")
#: The notice ``serve`` logs when a signal stops it.
SHUTDOWN = re.compile(r" WARNING remote_partitioner\.server \[-\]: shutting down")
#: At INFO, the lines that are not access lines, for the batch below: the Core ML and Vulkan
#: partitioners' and coremltools' INFO lines for one small model each (about 35 today).
OTHERS_AT_INFO = 60


class _CallCounter(
    grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor,
):
    """Counts the calls made through a channel, by method name (each call once, whatever
    its kind)."""

    def __init__(self) -> None:
        self.calls: collections.Counter[str] = collections.Counter()

    def _count(self, continuation: Callable[..., Any], details: Any, request: Any) -> Any:
        self.calls[details.method.rsplit("/", 1)[-1]] += 1
        return continuation(details, request)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._count(continuation, details, request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._count(continuation, details, request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._count(continuation, details, requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._count(continuation, details, requests)


def _batch(target: str) -> collections.Counter[str]:
    """Make the batch of calls against ``target``; the calls made, by method name."""
    counter = _CallCounter()
    models = small_models()
    with grpc.insecure_channel(target) as plain:
        channel = grpc.intercept_channel(plain, counter)
        for name in ("xnnpack", "coreml", "vulkan"):
            model, inputs = models["mlp"]
            ep = torch.export.export(model.eval(), inputs, strict=True)
            remote = RemotePartitioner(
                target, name, channel=channel, timeout=600, remote_preprocess=True
            )
            to_edge_transform_and_lower(ep, partitioner=[remote]).to_executorch()
            assert remote.stats["preprocess_calls"] == 1, (name, remote.stats)
        model, inputs = models["linear"]
        archive = io.BytesIO()
        torch.export.save(torch.export.export(model.eval(), inputs, strict=True), archive)
        with LowerClient(target, timeout=600) as client:
            client.stub = pb_grpc.RemotePartitionerStub(
                grpc.intercept_channel(client.channel, counter)
            )
            assert client.list_partitioners().partitioners
            assert client.lower(archive.getvalue(), [partitioner_ref("xnnpack")]).pte
    for method in ("ListPartitioners", "Partition", "Preprocess", "Lower"):
        assert counter.calls[method] >= 1, counter.calls
    return counter.calls


def _serve_batch(
    tmp_path: Path, *args: str
) -> tuple[list[str], list[str], list[str], collections.Counter[str]]:
    """Run ``serve ARGS``, make the batch, stop it: (stdout lines, stderr lines written by
    the time the batch was answered, stderr lines written after, calls made)."""
    log = tmp_path / "server.log"
    launched = servers.launch(log, *args, env={"PYTHONWARNINGS": ""})
    stdout: list[str] = []
    try:
        deadline = time.monotonic() + servers.STARTUP_SECONDS
        first = launched.lines.get(timeout=servers.STARTUP_SECONDS)
        assert first is not None, log.read_text(errors="replace")[-4000:]
        stdout.append(first.rstrip("\n"))
        match = re.search(servers.SERVING_LINE, stdout[0])
        assert match is not None, (stdout, log.read_text(errors="replace")[-4000:])
        servers.wait_serving(match.group(1), deadline)
        calls = _batch(match.group(1))
        during = log.read_text()
    finally:
        launched.stop()
    while True:  # the process has exited: its stdout ends with None
        line = launched.lines.get(timeout=servers.STOP_SECONDS)
        if line is None:
            break
        stdout.append(line.rstrip("\n"))
    everything = log.read_text()
    assert everything.startswith(during)
    return stdout, during.splitlines(), everything[len(during):].splitlines(), calls


@pytest.mark.slow
def test_at_warning_a_batch_of_calls_writes_nothing(tmp_path: Path) -> None:
    stdout, during, after, calls = _serve_batch(tmp_path)
    assert len(stdout) == 1 and re.search(servers.SERVING_LINE, stdout[0]), stdout
    assert during == [], "\n".join(during[:40])
    assert len(after) <= 1 and all(SHUTDOWN.search(line) for line in after), after
    assert sum(calls.values()) >= 25, calls


@pytest.mark.slow
def test_at_info_one_access_line_per_call(tmp_path: Path) -> None:
    stdout, during, after, calls = _serve_batch(tmp_path, "--log-level", "info")
    assert len(stdout) == 1 and re.search(servers.SERVING_LINE, stdout[0]), stdout
    lines = during + after
    records = [RECORD.match(line) for line in lines]
    unrouted = [line for line, record in zip(lines, records, strict=True) if record is None]
    assert unrouted == [], "written around logging:\n" + "\n".join(unrouted[:40])
    access: collections.Counter[str] = collections.Counter()
    others: list[str] = []
    for line, record in zip(lines, records, strict=True):
        assert record is not None
        level, logger, _, message = record.groups()
        if logger == ACCESS_LOGGER:
            fields = ACCESS.match(message)
            assert fields is not None and level == "INFO", line
            access[fields.group(1).rsplit("/", 1)[-1]] += 1
        else:
            others.append(line)
            assert level == "INFO" or SHUTDOWN.search(line), line
    health = access.pop("Check", 0)
    assert health >= 1  # the launcher's wait for SERVING
    assert access == calls
    assert len(others) <= OTHERS_AT_INFO, "\n".join(others)
    # The backends' progress bars are INFO records now, one per bar.
    assert any(" INFO coremltools [" in line and "Running MIL default pipeline: 100%" in line
               for line in others), "\n".join(others)


# ------------------------------------------------------------------ configure_logging, here


@pytest.fixture()
def logging_restored() -> Iterator[None]:
    """Put back what configure_logging changes in this process."""
    root = logging.getLogger()
    names = [*KNOWN_NOISE, "py.warnings", ACCESS_LOGGER]
    saved = (list(root.handlers), root.level,
             {n: (list(logging.getLogger(n).filters), logging.getLogger(n).level) for n in names})
    # Another test of this process may have called configure_logging, whose
    # captureWarnings(True) a later one would then skip (logging keeps its own record of it),
    # while pytest put warnings.showwarning back after that test: start uncaptured.
    logging.captureWarnings(False)
    showwarning = warnings.showwarning
    try:
        yield
    finally:
        logging.captureWarnings(False)
        warnings.showwarning = showwarning
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        for name, (filters, level) in saved[2].items():
            logging.getLogger(name).filters[:] = filters
            logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("logging_restored")
def test_levels_known_noise_and_repeated_warnings() -> None:
    out = io.StringIO()
    configure_logging("WARNING", stream=out)
    # A library that lowers the root logger's level (as ExecuTorch's Vulkan partitioner
    # does when imported) makes nothing louder.
    logging.getLogger().setLevel(logging.INFO)
    logging.getLogger().info("Found 1 Vulkan subgraphs to be partitioned.")
    logging.getLogger("coremltools").warning(
        "Failed to load _MLModelProxy: No module named 'coremltools.libcoremlpython'"
    )
    logging.getLogger("coremltools").warning("something else")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        for _ in range(3):
            warnings.warn("a warning said three times", UserWarning, stacklevel=1)
    lines = out.getvalue().splitlines()
    assert [line.split(" ", 3)[-1] for line in lines if RECORD.match(line)] == [
        "coremltools [-]: something else",
        f"py.warnings [-]: {__file__}:{_line_of('a warning said three times')}: "
        "UserWarning: a warning said three times",
    ], lines

    out = io.StringIO()
    configure_logging("debug", stream=out)  # replaces the filters: the known line shows
    logging.getLogger("coremltools").warning(
        "Failed to load _MLModelProxy: No module named 'coremltools.libcoremlpython'"
    )
    assert " DEBUG coremltools [-]: Failed to load _MLModelProxy" in out.getvalue()


def _line_of(text: str) -> int:
    """The line of this file where ``text`` is first written between quotes."""
    source = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(source, 1) if f'"{text}"' in line)


def test_progress_log_logs_each_finished_bar_once() -> None:
    from tqdm import tqdm

    records: queue.Queue[logging.LogRecord] = queue.Queue()

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.put(record)

    logger = logging.getLogger("tests.server_output.progress")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = Collect()
    logger.addHandler(handler)
    try:
        for _ in tqdm(range(40), desc="Running passes", file=ProgressLog(logger),
                      mininterval=0):
            pass
    finally:
        logger.removeHandler(handler)
    got = [records.get_nowait() for _ in range(records.qsize())]
    assert [(r.levelno, r.getMessage().split("|")[0]) for r in got] == [
        (logging.INFO, "Running passes: 100%")
    ], [r.getMessage() for r in got]
    assert "40/40" in got[0].getMessage() and "\r" not in got[0].getMessage()


class _PrintingPartitioner(XnnpackPartitioner):
    """XNNPACK's partitioner, printing a Vela-like summary to stdout as it partitions."""

    def partition(self, exported_program: Any) -> Any:
        print("Network summary for out\nAccelerator configuration   Ethos_U55_128", end="")
        return super().partition(exported_program)


def test_what_backend_code_prints_during_a_call_goes_to_the_log(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A hosted partitioner's prints (Vela prints its network summary) do not reach the
    server's stdout: they are records of ``remote_partitioner.server.backend_output`` at DEBUG,
    a line each (the last one without its newline too); the server's own output is unchanged,
    and this thread prints as before once the call is over."""
    registry = Registry([HostedPartitioner(
        "printing", "XnnpackBackend", {}, lambda spec: _PrintingPartitioner(),
        _PrintingPartitioner,
    )])
    model, inputs = small_models()["linear"]
    with caplog.at_level(logging.DEBUG, logger="remote_partitioner.server.backend_output"), \
            servers.inproc_server(registry=registry) as (_, target):
        to_edge_transform_and_lower(
            torch.export.export(model, inputs),
            partitioner=[RemotePartitioner(target, "printing", timeout=120)],
        )
    print("the test's own line")
    out = capsys.readouterr().out
    assert "Network summary" not in out and "Accelerator" not in out, out
    assert "the test's own line" in out
    assert [(r.levelno, r.getMessage()) for r in caplog.records
            if r.name == "remote_partitioner.server.backend_output"] == [
        (logging.DEBUG, "Network summary for out"),
        (logging.DEBUG, "Accelerator configuration   Ethos_U55_128"),
    ]
