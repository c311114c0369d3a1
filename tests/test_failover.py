"""Clients across replicas: one multi-address target, affinity, failover, retries.

Three ``remote-partitioner serve`` processes on free loopback ports, one target naming them all
(``ipv4:127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3``), and the client's default channel config
(``client/channel.py``: ``ring_hash`` on the ``x-remote-partitioner-affinity`` header, gRPC
retries of UNAVAILABLE).

* Affinity: one lowering's calls (uploads and hooks) all reach one replica.
* Failover: client threads run lowerings, their calls overlapping on the replicas; mid-run,
  the replica seen running a hook call is killed with SIGKILL. Every lowering must still
  finish with ``.pte`` bytes identical to local lowering with ``XnnpackPartitioner``. The
  retries are reported and checked against the servers' access logs (each call carries its
  own ``x-request-id``): every call a client made appears in one replica's log with the code
  the client got, or died with the killed replica and was retried by the client; and
  lowerings the killed replica served went on on the others.
* With ``serve --blob-dir``, replicas sharing one blob directory serve per-call
  ``round_robin`` clients, through the same kill.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import traceback
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from models import small_models
from servers import launch, served  # (tests/ is on sys.path, as for certs.py)
from torch.export import ExportedProgram

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.client.channel import (
    DEFAULT_CHANNEL_OPTIONS,
    HEADER_AFFINITY,
    RING_HASH_ENV,
    SERVICE_NAME,
    merge_options,
    service_config,
    service_config_json,
)
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

#: Minutes of subprocess fleets and soaks: `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow

REPLICAS = 3
THREADS = 4
LOWERINGS = 8
STARTUP_S = 180
CALL_TIMEOUT_S = 60
RUN_TIMEOUT_S = 240
#: Hook calls logged (over all replicas) before the kill: the run is under way.
KILL_AFTER_HOOK_CALLS = 8

#: The RPCs a RemotePartitioner makes through ``_rpc`` (those ``stats["calls"]`` counts).
CLIENT_RPCS = frozenset({
    "ListPartitioners", "FindMissingBlobs", "UploadBlobs", "Partition", "OpsToNotDecompose",
    "TransformForPreDecomposition",
})
HOOK_RPCS = frozenset({"Partition", "OpsToNotDecompose", "TransformForPreDecomposition"})
_ACCESS = re.compile(r"\brpc=(\S+) partitioner=\S+ code=(\w+) ")
_ACCESS_ID = re.compile(r"\brpc=(\S+) partitioner=\S+ code=(\w+) .* request_id=(\S+)")
_METRICS_URL = re.compile(r"metrics on (http://\S+/metrics)")
_IN_FLIGHT = re.compile(r'^remote_partitioner_in_flight\{rpc="([^"]+)"\} (\S+)$', re.M)


# --------------------------------------------------------------------------------------------
# Replicas


@dataclasses.dataclass
class Replica:
    """One ``remote-partitioner serve`` process with INFO access logs and metrics."""

    proc: subprocess.Popen[str]
    log_path: Path
    address: str = ""
    metrics_url: str = ""

    def access(self) -> Counter[tuple[str, str]]:
        """Calls logged so far: (rpc, code) -> count."""
        text = self.log_path.read_text(errors="replace")
        return Counter((m.group(1), m.group(2)) for m in _ACCESS.finditer(text))

    def calls(self) -> list[tuple[str, str, str]]:
        """(request id, rpc, code) of every call logged so far."""
        text = self.log_path.read_text(errors="replace")
        return [(m.group(3), m.group(1), m.group(2)) for m in _ACCESS_ID.finditer(text)]

    def hook_calls(self) -> int:
        return sum(n for (rpc, _), n in self.access().items() if rpc in HOOK_RPCS)

    def in_flight(self) -> dict[str, float]:
        """Calls running now, by rpc (empty if the replica does not answer)."""
        try:
            with urllib.request.urlopen(self.metrics_url, timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return {}
        return {rpc: float(v) for rpc, v in _IN_FLIGHT.findall(text)}


@contextlib.contextmanager
def replicas(tmp_path: Path, *extra: str) -> Iterator[list[Replica]]:
    """REPLICAS server processes started at once, each on a free port of 127.0.0.1, SERVING;
    stopped on exit."""
    with contextlib.ExitStack() as stack:
        launched = []
        for k in range(REPLICAS):
            one = launch(tmp_path / f"replica{k}.log", "--no-plugins", "--log-level", "INFO",
                         "--metrics-port", "0", *extra)
            stack.callback(one.stop)  # (the ones not yet served, if one fails to start)
            launched.append(one)
        deadline = time.monotonic() + STARTUP_S
        started = []
        for one in launched:
            proc, address, log = stack.enter_context(
                served(one, startup_seconds=max(deadline - time.monotonic(), 1.0))
            )
            url = _METRICS_URL.search(log.read_text(errors="replace"))
            assert url, f"replica gave no metrics URL:\n{log.read_text()[-4000:]}"
            started.append(Replica(proc, log, address, url.group(1)))
        yield started


def target_of(reps: list[Replica]) -> str:
    return "ipv4:" + ",".join(r.address for r in reps)


# --------------------------------------------------------------------------------------------
# Models


def _export(name: str) -> ExportedProgram:
    model, inputs = small_models()[name]
    return torch.export.export(model.eval(), inputs, strict=True)


@pytest.fixture(scope="module")
def expected() -> dict[str, bytes]:
    """The local XNNPACK lowering's ``.pte`` of each model."""
    out = {}
    for name in small_models():
        lowered = to_edge_transform_and_lower(_export(name), partitioner=[XnnpackPartitioner()])
        out[name] = lowered.to_executorch().buffer
    return out


# --------------------------------------------------------------------------------------------
# A run of concurrent lowerings


#: ExecuTorch's lowering is not thread-safe (``run_decompositions`` installs process-wide
#: operator overrides): each client thread holds this lock while it lowers, except while it
#: waits for the server, so the threads' calls overlap on the replicas.
_LOCAL_WORK = threading.Lock()
#: The calls the clients are waiting on now: request id -> lowering.
_OUTSTANDING: dict[str, int] = {}
_OUTSTANDING_LOCK = threading.Lock()
#: The calls whose wait (on the frozen replica) decided the moment of the kill (debugging).
_TRIGGER: list[str] = []
#: A test request id: ``l<lowering>-<n>``.
_CALL_ID = re.compile(r"l(\d+)-\d+")


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One call a client made (one ``_rpc``): its lowering, when it was sent and answered
    (``time.monotonic()``), and its status code name."""

    lowering: int
    start: float
    end: float
    code: str


class _Client(RemotePartitioner):
    """A ``RemotePartitioner`` that lets other client threads work during its RPCs, and
    records each call under a request id of its own (``l<lowering>-<n>``, sent as
    ``x-request-id``, which the servers' access logs show)."""

    def __init__(self, target: str, options: list[tuple[str, Any]], lowering: int) -> None:
        super().__init__(target, "xnnpack", timeout=CALL_TIMEOUT_S, options=options)
        self.lowering = lowering
        self.calls: dict[str, CallRecord] = {}
        self._plain_metadata: tuple[tuple[str, str], ...] = tuple(self._metadata)

    def _rpc(self, method: Callable[..., Any], request: Any, **kwargs: Any) -> Any:
        call_id = f"l{self.lowering}-{len(self.calls)}"
        self._metadata = (*self._plain_metadata, ("x-request-id", call_id))
        start, code = time.monotonic(), "OK"
        with _OUTSTANDING_LOCK:
            _OUTSTANDING[call_id] = self.lowering
        _LOCAL_WORK.release()
        try:
            return super()._rpc(method, request, **kwargs)
        except BaseException as e:
            code = getattr(getattr(e, "code", None), "name", type(e).__name__)
            raise
        finally:
            end = time.monotonic()
            with _OUTSTANDING_LOCK:
                del _OUTSTANDING[call_id]
            _LOCAL_WORK.acquire()
            self.calls[call_id] = CallRecord(self.lowering, start, end, code)


@dataclasses.dataclass
class Run:
    """Lowerings taken by worker threads from a queue; each one's outcome, stats and calls."""

    target: str
    options: list[tuple[str, Any]]
    todo: queue.Queue[tuple[int, str, ExportedProgram]]
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    ptes: dict[int, tuple[str, bytes]] = dataclasses.field(default_factory=dict)
    errors: list[str] = dataclasses.field(default_factory=list)
    stats: Counter[str] = dataclasses.field(default_factory=Counter)
    calls: dict[str, CallRecord] = dataclasses.field(default_factory=dict)

    def work(self) -> None:
        while True:
            try:
                i, name, ep = self.todo.get_nowait()
            except queue.Empty:
                return
            partitioner = _Client(self.target, self.options, i)
            try:
                with _LOCAL_WORK:
                    pte = to_edge_transform_and_lower(
                        ep, partitioner=[partitioner]
                    ).to_executorch().buffer
                with self.lock:
                    self.ptes[i] = (name, pte)
            except Exception as e:  # every failure is reported
                with self.lock:
                    self.errors.append(f"lowering {i} ({name}): {type(e).__name__}: {e}\n"
                                       f"{traceback.format_exc()}")
            finally:
                partitioner.close()
                with self.lock:
                    self.stats.update(partitioner.stats)
                    self.calls.update(partitioner.calls)

    def done(self) -> int:
        with self.lock:
            return len(self.ptes) + len(self.errors)


def _lowerings() -> queue.Queue[tuple[int, str, ExportedProgram]]:
    """LOWERINGS programs (the models in turn), exported here: export is not thread-safe."""
    names = list(small_models())
    todo: queue.Queue[tuple[int, str, ExportedProgram]] = queue.Queue()
    for i in range(LOWERINGS):
        todo.put((i, names[i % len(names)], _export(names[i % len(names)])))
    return todo


def _kill_mid_run(
    reps: list[Replica], run: Run, threads: list[threading.Thread]
) -> tuple[Replica, float, dict[str, float]]:
    """Once KILL_AFTER_HOOK_CALLS hook calls are logged, SIGKILL the first replica seen
    running a hook call (preferring one with two or more calls in flight, for up to 2 s);
    return it, when it was killed (``time.monotonic()``) and what it had in flight.

    The replica is first frozen (SIGSTOP), and killed once a client waits on a call, for a
    lowering it served, that it has not answered (bounded): the call seen in flight may have
    ended between the look and the signal, but one sent to a frozen replica stays in flight,
    so the kill cuts it."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while sum(r.hook_calls() for r in reps) < KILL_AFTER_HOOK_CALLS:
        assert any(t.is_alive() for t in threads), "the run ended before the kill"
        assert time.monotonic() < deadline, "the run made too few hook calls"
        time.sleep(0.05)
    patient_until = time.monotonic() + 2.0
    while True:
        assert not run.errors, "\n".join(run.errors)
        assert run.done() < LOWERINGS, "every lowering finished before a replica was seen busy"
        assert time.monotonic() < deadline, "no replica was seen running a hook call"
        for r in reps:
            flying = {rpc: n for rpc, n in r.in_flight().items() if n}
            hooks = sum(n for rpc, n in flying.items() if rpc in HOOK_RPCS)
            if hooks >= 2 or (hooks >= 1 and time.monotonic() > patient_until):
                r.proc.send_signal(signal.SIGSTOP)
                # Its log is final now: a call it logged has its answer (on the way).
                logged = {call_id for call_id, _, _ in r.calls()}
                served = {int(m.group(1)) for m in map(_CALL_ID.fullmatch, logged) if m}
                frozen_until = time.monotonic() + 20
                while time.monotonic() < frozen_until:
                    with _OUTSTANDING_LOCK:
                        waiting = [call_id for call_id, lowering in _OUTSTANDING.items()
                                   if lowering in served and call_id not in logged]
                    if waiting:
                        _TRIGGER[:] = waiting
                        break
                    time.sleep(0.01)
                killed_at = time.monotonic()
                r.proc.send_signal(signal.SIGKILL)
                assert r.proc.wait(30) == -signal.SIGKILL
                return r, killed_at, flying
        time.sleep(0.002)


def _accounted(rec: CallRecord, where: list[tuple[Replica, str]], killed: Replica) -> bool:
    """Whether a call's outcome at the client agrees with the access logs (``where``: the
    replicas that logged its request id, and their codes). A call cut short by the kill
    (UNAVAILABLE at the client) is logged by no survivor; any other was answered by one
    replica, with the code the client got: one survivor, or the killed replica before the
    kill."""
    survivors = [code for r, code in where if r is not killed]
    if rec.code == "UNAVAILABLE":
        return not survivors
    return survivors == [rec.code] or (not survivors and [c for _, c in where] == [rec.code])


def _run_with_a_kill(
    reps: list[Replica], options: list[tuple[str, Any]], expected: dict[str, bytes],
    record_property: Callable[[str, Any], None], label: str, affinity: bool,
) -> Counter[str]:
    """Run LOWERINGS lowerings on THREADS threads through all replicas, SIGKILL one mid-run;
    check every ``.pte`` and account for every call; return the clients' summed stats."""
    run = Run(target_of(reps), options, _lowerings())
    threads = [threading.Thread(target=run.work, name=f"client-{k}", daemon=True)
               for k in range(THREADS)]
    start = time.monotonic()
    for t in threads:
        t.start()
    killed, killed_at, flying = _kill_mid_run(reps, run, threads)
    done_at_kill = run.done()
    for t in threads:
        t.join(max(start + RUN_TIMEOUT_S - time.monotonic(), 1))
    elapsed = time.monotonic() - start
    assert not any(t.is_alive() for t in threads), "a lowering is stuck"
    assert not run.errors, "\n".join(run.errors)
    assert len(run.ptes) == LOWERINGS
    for i, (name, pte) in sorted(run.ptes.items()):
        assert pte == expected[name], f"lowering {i} ({name}): the .pte differs from local"

    # Where each call was logged: request id -> [(replica, code)].
    logged: dict[str, list[tuple[Replica, str]]] = {}
    for r in reps:
        for call_id, rpc, code in r.calls():
            if call_id in run.calls:
                assert rpc in CLIENT_RPCS, (call_id, rpc)
                logged.setdefault(call_id, []).append((r, code))
    problems = [
        f"{call_id} {rec}: logged by {[(r.address, c) for r, c in logged.get(call_id, [])]}"
        for call_id, rec in run.calls.items()
        if not _accounted(rec, logged.get(call_id, []), killed)
    ]
    assert not problems, "calls and logs disagree:\n" + "\n".join(problems)
    cut = [i for i, rec in run.calls.items() if rec.code == "UNAVAILABLE"]
    on_killed = {run.calls[i].lowering for i, where in logged.items()
                 if any(r is killed for r, _ in where)}
    # In flight across the kill, for a lowering the killed replica served, answered by a
    # survivor: gRPC's retry policy sent it again (or its first pick found the replica gone).
    # The survivor's answer may be any code it logged: BLOB_MISSING (FAILED_PRECONDITION) for
    # a hook whose blobs went to the killed replica, which the client then uploads again.
    failed_over = [
        i for i, rec in run.calls.items()
        if rec.start < killed_at < rec.end and rec.lowering in on_killed
        and [c for r, c in logged.get(i, []) if r is not killed] == [rec.code]
    ] if affinity else []  # (without affinity, which replica a call went to is unknown)
    # Lowerings the killed replica served that still had calls to make: they failed over.
    moved = {rec.lowering for rec in run.calls.values()
             if rec.lowering in on_killed and rec.start > killed_at}
    totals = run.stats
    per_replica = ", ".join(
        f"{r.address}{' (killed)' if r is killed else ''}: "
        f"{sum(1 for where in logged.values() for q, _ in where if q is r)}"
        for r in reps
    )
    summary = (
        f"[{label}] {LOWERINGS} lowerings on {THREADS} threads in {elapsed:.1f} s; replica "
        f"{killed.address} SIGKILLed at {killed_at - start:.1f} s with {flying} in flight, "
        f"{done_at_kill} lowering(s) done by then; {len(moved)} lowering(s) it had served "
        f"went on on the survivors; {len(run.calls)} client calls, logged by "
        f"replica: {per_replica}; retried: {len(cut)} cut by the kill (UNAVAILABLE) and "
        f"retried by the client, "
        + (f"{len(failed_over)} in flight on the killed replica completed by gRPC's retry "
           "policy on a survivor, " if affinity else "")
        + f"{totals['blob_missing_retries']} retried "
        f"after BLOB_MISSING; {totals['blobs_uploaded']} blobs uploaded "
        f"({totals['bytes_uploaded']} bytes)"
    )
    print(summary)
    record_property(label, summary)
    assert totals["calls"] == len(run.calls), summary
    assert totals["unavailable_retries"] == len(cut), summary
    assert killed.hook_calls() > 0, summary
    if affinity:
        # The replica was killed with a hook call in flight for a lowering it served: that
        # call was completed on a survivor, by gRPC's retry policy (before the replica's
        # response headers reached the client) or by the client after UNAVAILABLE.
        trigger = {i: (run.calls.get(i), [(r.address, c) for r, c in logged.get(i, [])])
                   for i in _TRIGGER}
        assert failed_over or cut, (
            f"no call in flight on the killed replica: {summary}; killed at {killed_at}, "
            f"the calls it was killed for: {trigger}")
    assert moved, f"no lowering the killed replica served had calls left: {summary}"
    assert all(r.proc.poll() is None for r in reps if r is not killed), "a survivor died"
    return totals


# --------------------------------------------------------------------------------------------
# Tests


def test_channel_config() -> None:
    """The default options carry the service config (affinity, failover, retries of every RPC
    of the service); options given later win."""
    value = os.environ.get(RING_HASH_ENV, "")
    assert (value.lower() in {"1", "true", "yes"}) is HEADER_AFFINITY
    config = json.loads(dict(DEFAULT_CHANNEL_OPTIONS)["grpc.service_config"])
    policies = [next(iter(p)) for p in config["loadBalancingConfig"]]
    assert policies == (
        ["ring_hash_experimental", "pick_first"] if HEADER_AFFINITY else ["pick_first"]
    )
    [method] = config["methodConfig"]
    assert pb.DESCRIPTOR.services_by_name["RemotePartitioner"].full_name == SERVICE_NAME
    assert method["name"] == [{"service": SERVICE_NAME}]
    assert method["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert method["retryPolicy"]["maxAttempts"] == 5
    no_affinity = service_config(affinity=False)["loadBalancingConfig"]
    assert [next(iter(p)) for p in no_affinity] == ["round_robin"]
    merged = merge_options([*DEFAULT_CHANNEL_OPTIONS, ("grpc.service_config", "{}")])
    assert len(merged) == len(DEFAULT_CHANNEL_OPTIONS)
    assert dict(merged)["grpc.service_config"] == "{}"


@pytest.mark.timeout(STARTUP_S + RUN_TIMEOUT_S + 120)
def test_affinity_and_failover(
    tmp_path: Path, expected: dict[str, bytes], record_property: Callable[[str, Any], None]
) -> None:
    with replicas(tmp_path) as reps:
        # Affinity: every call of one lowering reaches one replica.
        before = [r.access() for r in reps]
        partitioner = RemotePartitioner(target_of(reps), "xnnpack", timeout=CALL_TIMEOUT_S)
        try:
            pte = to_edge_transform_and_lower(
                _export("mlp"), partitioner=[partitioner]
            ).to_executorch().buffer
        finally:
            partitioner.close()
        assert pte == expected["mlp"]
        gained = [
            sum(n for (rpc, _), n in (r.access() - b).items() if rpc in CLIENT_RPCS)
            for r, b in zip(reps, before, strict=True)
        ]
        assert sorted(gained)[:-1] == [0] * (REPLICAS - 1), f"calls spread: {gained}"
        assert max(gained) == partitioner.stats["calls"], (gained, partitioner.stats)
        assert partitioner.stats["blob_missing_retries"] == 0

        # Failover.
        totals = _run_with_a_kill(reps, [], expected, record_property, "affinity", True)
        # With affinity a hook reaches the replica its blobs went to: a blob goes missing
        # only when a replica dies between an upload and the call after it.
        assert totals["blob_missing_retries"] <= THREADS


@pytest.mark.timeout(STARTUP_S + RUN_TIMEOUT_S + 120)
def test_round_robin_over_a_shared_blob_dir(
    tmp_path: Path, expected: dict[str, bytes], record_property: Callable[[str, Any], None]
) -> None:
    blob_dir = tmp_path / "blobs"
    with replicas(tmp_path, "--blob-dir", str(blob_dir)) as reps:
        options = [("grpc.service_config", service_config_json(affinity=False))]
        totals = _run_with_a_kill(
            reps, options, expected, record_property, "shared blob dir", False
        )
        # Any replica reads what any other stored: nothing goes missing, blobs cross once.
        assert totals["blob_missing_retries"] == 0
    assert any(blob_dir.glob("??/*"))
