"""Preprocess on the server: a client process that cannot import any backend package lowers
through ``RemotePartitioner`` and gets the local ``.pte`` (Core ML: normalized).

Each test saves exported programs with ``torch.export.save``, lowers them in a subprocess (one
for all the cases of the model matrix) whose import system refuses
``executorch.backends.xnnpack*``, ``executorch.backends.vulkan*``, ``executorch.backends.apple*``
and ``coremltools*`` (a ``sys.meta_path`` finder raising ``ModuleNotFoundError``), and
compares its ``.pte`` with a local lowering of the same programs
in this process, against the session's real server.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.exir import to_edge, to_edge_transform_and_lower
from torch.export import Dim, ExportedProgram, export

from remote_partitioner.client import RemotePartitioner, to_backend_remotely
from remote_partitioner.client.errors import RemotePartitionerError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from models import Cond, Mlp16, Tied

from conformance import normalize_coreml

slow = pytest.mark.slow

#: Prepended to the client script: no backend package can be imported after it.
BLOCK_BACKENDS = textwrap.dedent("""
    import importlib.abc, sys
    _BLOCKED = ("executorch.backends.xnnpack", "executorch.backends.vulkan",
                "executorch.backends.apple", "coremltools")

    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if any(name == b or name.startswith(b + ".") for b in _BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, _Block())
""")

CLIENT = BLOCK_BACKENDS + textwrap.dedent("""
    import json, warnings
    warnings.filterwarnings("ignore")
    import torch
    from executorch.exir import to_edge, to_edge_transform_and_lower
    from remote_partitioner.client import RemotePartitioner

    # argv: the target, then a JSON list of jobs {name, flow, out, files: {method: path}}.
    target, jobs = sys.argv[1], json.loads(sys.argv[2])
    for job in jobs:
        programs = {m: torch.export.load(path) for m, path in job["files"].items()}
        remote = RemotePartitioner(target, job["name"], timeout=900)
        if job["flow"] == "to_backend":
            edge = to_edge(programs).to_backend(remote)
        else:
            edge = to_edge_transform_and_lower(programs, partitioner=[remote])
        with open(job["out"], "wb") as fh:
            fh.write(edge.to_executorch().buffer)
        loaded = sorted(m for m in sys.modules if m.startswith(_BLOCKED))
        print(json.dumps({"stats": remote.stats, "backends_loaded": loaded}), flush=True)
""")


def _local_partitioner(name: str) -> Any:
    if name == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        return XnnpackPartitioner()
    if name == "vulkan":
        from executorch.backends.vulkan.partitioner.vulkan_partitioner import VulkanPartitioner

        return VulkanPartitioner()
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    return CoreMLPartitioner()


def _save(folder: Path, programs: dict[str, ExportedProgram]) -> dict[str, str]:
    """Save each method's program in ``folder``: {method: path}."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for method, ep in programs.items():
        files[method] = str(folder / f"{method}.pt2")
        torch.export.save(ep, files[method])
    return files


def _run_blocked_client(target: str, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Lower each job's saved programs through ``target`` in one process that cannot import a
    backend (one process for all: its start is most of a small case's time); each job's
    client report, and each ``out`` written."""
    import json

    done = subprocess.run(
        [sys.executable, "-c", CLIENT, target, json.dumps(jobs)],
        capture_output=True, text=True, timeout=1200 * len(jobs),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == len(jobs), done.stdout[-4000:]
    for report in reports:
        assert report["backends_loaded"] == [], report["backends_loaded"]
    return reports


def _lower_locally(files: dict[str, str], name: str, flow: str = "transform_and_lower") -> bytes:
    """The local .pte of the saved programs, as loaded back (the client lowers those)."""
    loaded = {m: torch.export.load(path) for m, path in files.items()}
    local = _local_partitioner(name)
    if flow == "to_backend":
        edge = to_edge(loaded).to_backend(local)
    else:
        edge = to_edge_transform_and_lower(loaded, partitioner=[local])
    assert any(
        "executorch_call_delegate" in str(n.target)
        for m in edge.methods for n in edge.exported_program(m).graph.nodes
    ), "nothing was delegated: the comparison would prove little"
    return bytes(edge.to_executorch().buffer)


def _lower_blocked(
    tmp_path: Path, target: str, name: str, programs: dict[str, ExportedProgram],
    flow: str = "transform_and_lower",
) -> tuple[bytes, bytes, dict[str, Any]]:
    """(remote .pte from a process without backends, local .pte from this one, client
    report)."""
    files = _save(tmp_path, programs)
    out = tmp_path / "remote.pte"
    [report] = _run_blocked_client(
        target, [{"name": name, "flow": flow, "out": str(out), "files": files}]
    )
    return out.read_bytes(), _lower_locally(files, name, flow), report


# ------------------------------------------------------------------ models


class _Conv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)) * 2.0


class _Head(torch.nn.Module):
    """Two methods sharing one weight: forward and a second head on the same linear."""

    def __init__(self, fc: torch.nn.Linear, scale: float) -> None:
        super().__init__()
        self.fc = fc
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) * self.scale


def fp32() -> dict[str, ExportedProgram]:
    torch.manual_seed(0)
    return {"forward": export(Mlp16().eval(), (torch.randn(3, 16),), strict=True)}


def conv() -> dict[str, ExportedProgram]:
    torch.manual_seed(0)
    return {"forward": export(_Conv().eval(), (torch.randn(1, 3, 8, 8),), strict=True)}


def dynamic() -> dict[str, ExportedProgram]:
    torch.manual_seed(0)
    batch = Dim("batch", min=1, max=32)
    return {"forward": export(
        Mlp16().eval(), (torch.randn(4, 16),), dynamic_shapes=({0: batch},), strict=True
    )}


def multi_method() -> dict[str, ExportedProgram]:
    torch.manual_seed(0)
    fc = torch.nn.Linear(16, 16)
    x = (torch.randn(2, 16),)
    return {
        "forward": export(_Head(fc, 1.0).eval(), x, strict=True),
        "second": export(_Head(fc, 2.0).eval(), x, strict=True),
    }


def cond() -> dict[str, ExportedProgram]:
    torch.manual_seed(0)
    return {"forward": export(Cond().eval(), (torch.randn(2, 4),), strict=True)}


def tied() -> dict[str, ExportedProgram]:
    torch.manual_seed(0)
    return {"forward": export(Tied().eval(), (torch.randint(0, 64, (2, 5)),), strict=True)}


def quantized() -> dict[str, ExportedProgram]:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(8 * 6 * 6, 10),
    ).eval()
    inputs = (torch.randn(1, 3, 8, 8),)
    quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(export(model, inputs, strict=True).module(), quantizer)
    prepared(*inputs)
    return {"forward": export(convert_pt2e(prepared), inputs, strict=True)}


MODELS = {
    "fp32": fp32, "conv": conv, "dynamic": dynamic, "multi_method": multi_method,
    "cond": cond, "tied": tied, "quantized": quantized,
}
#: (backend, model) cases of the test below: every model with XNNPACK, every float one with
#: Vulkan (it cannot lower the PT2E-quantized one: test_vulkan_quantized_fails_as_locally).
CASES = [
    *[("xnnpack", m) for m in MODELS],
    *[("vulkan", m) for m in ("fp32", "conv", "dynamic", "multi_method", "tied", "cond")],
]


@pytest.fixture(scope="module")
def blocked_lowerings(
    server_address: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> dict[tuple[str, str], tuple[dict[str, str], bytes, dict[str, Any]]]:
    """The selected cases of ``test_process_without_backends_gets_the_local_pte``, lowered by
    one client process without backends: {(backend, model): (saved programs, remote .pte,
    client report)}."""
    selected = [
        (item.callspec.params["backend"], item.callspec.params["model"])
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_process_without_backends_gets_the_local_pte"
    ]
    root = tmp_path_factory.mktemp("blocked")
    jobs, files = [], {}
    for backend, model in selected:
        folder = root / f"{backend}-{model}"
        files[backend, model] = _save(folder, MODELS[model]())
        jobs.append({"name": backend, "flow": "transform_and_lower",
                     "out": str(folder / "remote.pte"), "files": files[backend, model]})
    reports = _run_blocked_client(server_address, jobs) if jobs else []
    return {
        case: (files[case], Path(job["out"]).read_bytes(), report)
        for case, job, report in zip(selected, jobs, reports, strict=True)
    }


# ------------------------------------------------------------------ tests


@slow  # the client process, then a local lowering per case (> 5 s)
@pytest.mark.parametrize(("backend", "model"), CASES, ids=[f"{b}-{m}" for b, m in CASES])
def test_process_without_backends_gets_the_local_pte(
    backend: str, model: str,
    blocked_lowerings: dict[tuple[str, str], tuple[dict[str, str], bytes, dict[str, Any]]],
) -> None:
    files, remote, report = blocked_lowerings[backend, model]
    local = _lower_locally(files, backend)
    assert remote == local, f"remote .pte ({len(remote)} B) differs from local ({len(local)} B)"
    assert report["stats"]["preprocess_calls"] >= 1


@slow
def test_coreml_normalized(server_address: str, tmp_path: Path) -> None:
    remote, local, _ = _lower_blocked(tmp_path, server_address, "coreml", conv())
    assert len(remote) == len(local)
    assert normalize_coreml(remote, across_processes=True) == normalize_coreml(
        local, across_processes=True
    )


@slow
def test_to_backend_flow(server_address: str, tmp_path: Path) -> None:
    remote, local, _ = _lower_blocked(
        tmp_path, server_address, "xnnpack", multi_method(), flow="to_backend"
    )
    assert remote == local


@slow  # a lowering with the backend imported locally (> 5 s)
def test_remote_preprocess_when_the_backend_is_importable(server_address: str) -> None:
    """``remote_preprocess=True`` runs preprocess on the server although the backend imports
    here; a local lowering afterwards in the same process still runs locally."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    programs = fp32()
    local = to_edge_transform_and_lower(
        copy.deepcopy(programs), partitioner=[XnnpackPartitioner()]
    ).to_executorch().buffer
    remote = RemotePartitioner(server_address, "xnnpack", remote_preprocess=True, timeout=600)
    got = to_edge_transform_and_lower(
        copy.deepcopy(programs), partitioner=[remote]
    ).to_executorch().buffer
    assert got == local
    assert remote.stats["preprocess_calls"] == 1
    again = to_edge_transform_and_lower(
        copy.deepcopy(programs), partitioner=[XnnpackPartitioner()]
    ).to_executorch().buffer
    assert again == local
    assert remote.stats["preprocess_calls"] == 1, "a local lowering went to the server"


class _Pool3d(torch.nn.Module):
    """A 3-D average pooling; coremltools refuses to convert it with ``ceil_mode`` (and the
    padding counted), and names its constants from its counter (``const_0``, ...)."""

    def __init__(self, kernel_size: int, ceil_mode: bool) -> None:
        super().__init__()
        self.kernel_size, self.ceil_mode = kernel_size, ceil_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool3d(
            x, self.kernel_size, stride=2, padding=1, ceil_mode=self.ceil_mode
        )


@slow  # three Core ML lowerings (> 5 s)
def test_coreml_preprocess_after_a_failed_conversion(server_address: str) -> None:
    """A conversion that raised on the server does not change the next program's bytes there
    (another client's, maybe): coremltools keeps its name counters after a conversion that
    raises, and the server starts each preprocess from a fresh conversion state. Found by the
    conformance suite (``test_avgpool3d_combinations[coreml]``)."""
    from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    from remote_partitioner.server.backends.coreml import coremltools_fresh_state

    failing = export(_Pool3d(3, ceil_mode=True), (torch.randn(1, 4, 10, 10, 10),), strict=True)
    first = RemotePartitioner(server_address, "coreml", remote_preprocess=True, timeout=600)
    with pytest.raises(ValueError, match="ceil mode=True and include_pad=True not supported"):
        to_edge_transform_and_lower(failing, partitioner=[first])
    assert first.stats["preprocess_calls"] == 1
    programs = {"forward": export(_Pool3d(2, ceil_mode=False), (torch.randn(1, 4, 8, 8, 8),))}
    second = RemotePartitioner(server_address, "coreml", remote_preprocess=True, timeout=600)
    got = to_edge_transform_and_lower(
        copy.deepcopy(programs), partitioner=[second]
    ).to_executorch().buffer
    assert second.stats["preprocess_calls"] == 1
    coremltools_fresh_state()  # this process too may hold a failed conversion's counters
    local = to_edge_transform_and_lower(
        copy.deepcopy(programs), partitioner=[CoreMLPartitioner()]
    ).to_executorch().buffer
    assert normalize_coreml(got, across_processes=True) == normalize_coreml(
        local, across_processes=True
    )


@slow  # three Core ML lowerings (> 5 s)
def test_coreml_lower_after_a_failed_conversion(server_address: str) -> None:
    """The same for the Lower RPC, whose lowering on the server runs Core ML's preprocess."""
    import io

    from executorch.backends.apple.coreml.partition import CoreMLPartitioner

    from remote_partitioner.client.lower import LowerClient, partitioner_ref
    from remote_partitioner.server.backends.coreml import coremltools_fresh_state

    def archive(ep: ExportedProgram) -> bytes:
        buffer = io.BytesIO()
        torch.export.save(ep, buffer)
        return buffer.getvalue()

    failing = export(_Pool3d(3, ceil_mode=True), (torch.randn(1, 4, 10, 10, 10),), strict=True)
    good = export(_Pool3d(2, ceil_mode=False), (torch.randn(1, 4, 8, 8, 8),), strict=True)
    with LowerClient(server_address, timeout=600) as client:
        with pytest.raises(ValueError, match="ceil mode=True and include_pad=True"):
            client.lower(archive(failing), [partitioner_ref("coreml")])
        got = client.lower(archive(good), [partitioner_ref("coreml")]).pte
    assert got is not None
    coremltools_fresh_state()
    local = to_edge_transform_and_lower(
        good, partitioner=[CoreMLPartitioner()]
    ).to_executorch().buffer
    assert normalize_coreml(got, across_processes=True) == normalize_coreml(
        local, across_processes=True
    )


@slow  # a lowering with the backend imported locally (> 5 s)
def test_whole_program_helper(server_address: str) -> None:
    """``to_backend_remotely`` gives what ``to_backend(backend_id, program, specs)`` gives."""
    from executorch.backends.vulkan.vulkan_preprocess import VulkanBackend
    from executorch.exir.backend.backend_api import to_backend

    ep = to_edge(fp32()).exported_program()
    specs: list[Any] = []
    lowered_local = to_backend(VulkanBackend.__name__, copy.deepcopy(ep), specs)
    client = RemotePartitioner(server_address, "vulkan", timeout=600)
    lowered_remote = to_backend_remotely(client, "VulkanBackend", ep, specs)
    assert client.stats["preprocess_calls"] == 1
    assert lowered_remote.processed_bytes == lowered_local.processed_bytes
    assert lowered_remote.backend_id == "VulkanBackend"
    assert lowered_remote.meta == lowered_local.meta  # the debug handle map


def test_unknown_backend_names_the_hosted_ones(server_address: str) -> None:
    ep = to_edge(fp32()).exported_program()
    with pytest.raises(RemotePartitionerError) as e:
        to_backend_remotely(server_address, "NoSuchBackend", ep, [])
    assert e.value.reason == "UNKNOWN_BACKEND"
    assert "XnnpackBackend" in str(e.value) and "NoSuchBackend" in str(e.value)


def test_unknown_backend_on_the_wire(server_address: str) -> None:
    """The server itself refuses an unknown backend id, naming it and the hosted ones."""
    import grpc

    from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
    from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

    with grpc.insecure_channel(server_address) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Preprocess(pb.PreprocessRequest(backend_id="NoSuchBackend"), timeout=60)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "NoSuchBackend" in e.value.details() and "XnnpackBackend" in e.value.details()
        listing = stub.ListPartitioners(pb.ListPartitionersRequest(), timeout=60)
        assert {"XnnpackBackend", "VulkanBackend"} <= {b.backend_id for b in listing.backends}


def test_preprocess_raising_is_raised_again(server_address: str) -> None:
    """A backend whose preprocess raises: the client gets the same built-in class and
    message. Vulkan refuses a compile spec value it cannot parse."""
    from executorch.backends.vulkan.vulkan_preprocess import VulkanBackend
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    ep = to_edge(fp32()).exported_program()
    specs = [CompileSpec("storage_type_override", b"\xff\xff")]
    with pytest.raises(Exception) as local:
        VulkanBackend.preprocess(copy.deepcopy(ep), specs)
    with pytest.raises(Exception) as remote:
        to_backend_remotely(server_address, "VulkanBackend", ep, specs)
    assert isinstance(local.value, ValueError)
    assert type(remote.value) is type(local.value)
    assert str(remote.value) == str(local.value)


# ------------------------------------------------------------------ units


class _Recorder:
    """A stand-in preprocessor that records the calls it gets (no server)."""

    def __init__(self, backend_id: str) -> None:
        self.backend_id = backend_id
        self.calls = 0

    def routes_backend(self, backend_id: str) -> bool:
        return backend_id == self.backend_id

    def remote_preprocess_multimethod(
        self, backend_id: str, programs: Any, compile_specs: Any, multimethod: bool
    ) -> dict[str, list[Any]]:
        from executorch.exir.backend.backend_details import PreprocessResult

        self.calls += 1
        return {m: [PreprocessResult(b"x") for _ in eps] for m, eps in programs.items()}


def test_one_stand_in_per_backend_id() -> None:
    """Two partitioners routing one backend id define one class of that name; each call goes
    to the partitioner in scope, else to the last one that routed it."""
    from executorch.exir.backend.backend_details import BackendDetails

    from remote_partitioner.client import preprocess as routes

    first, second = _Recorder("UnitTestBackend"), _Recorder("UnitTestBackend")
    routes.install("UnitTestBackend", first, wrap_real=False)
    routes.install("UnitTestBackend", second, wrap_real=False)
    named = [c for c in BackendDetails.__subclasses__() if c.__name__ == "UnitTestBackend"]
    assert len(named) == 1
    cls: Any = named[0]
    assert cls.preprocess(None, []).processed_bytes == b"x"
    assert (first.calls, second.calls) == (0, 1)
    with routes.scoped_route("UnitTestBackend", first):
        cls.preprocess_multimethod({"forward": [None, None]}, {"forward": [[], []]})
    assert (first.calls, second.calls) == (1, 1)


def test_preprocess_result_round_trip() -> None:
    """Every field of a PreprocessResult crosses: processed bytes (inline or by blob), the
    debug handle map with int or str keys, named data with layouts, external data."""
    from executorch.exir._serialize._named_data_store import NamedDataStoreOutput
    from executorch.exir._serialize.data_serializer import DataEntry
    from executorch.exir.backend.backend_details import PreprocessResult
    from executorch.exir.scalar_type import ScalarType
    from executorch.exir.tensor_layout import TensorLayout

    from remote_partitioner.proto import codec
    from remote_partitioner.proto.codec.preprocess import INLINE_PROCESSED_BYTES

    layout = TensorLayout(ScalarType.FLOAT, [2, 3], [0, 1])
    for processed in (b"abc", bytes(INLINE_PROCESSED_BYTES + 1)):
        for handles in ({1: (3, 4), 2: (5,)}, {"a": (1,)}, None):
            result = PreprocessResult(
                processed_bytes=processed,
                debug_handle_map=handles,
                data_store_output=NamedDataStoreOutput(
                    buffers=[b"w0", b"w1"],
                    pte_data={"k0": DataEntry(1, 16, layout), "k1": DataEntry(0, 8, None)},
                    external_data={"f.ptd": {"k2": DataEntry(0, 64, None)}},
                ),
            )
            message, blobs = codec.encode_preprocess_result(result)
            got = codec.decode_preprocess_result(
                message, lambda d, blobs=blobs: blobs[d.hash]  # type: ignore[misc]
            )
            assert got == result
            assert bool(message.processed_inline) == (len(processed) <= INLINE_PROCESSED_BYTES)


def _nodes(graph: Any) -> Any:
    if isinstance(graph, dict):
        if {"target", "inputs", "outputs"} <= graph.keys():
            yield graph
        for v in graph.values():
            yield from _nodes(v)
    elif isinstance(graph, list):
        for v in graph:
            yield from _nodes(v)


def test_bad_preprocess_requests(server_address: str, tmp_path: Path) -> None:
    """Each malformed request gets its documented code and reason, and the graph allow-list
    applies: a program naming code as a node target is refused, never run."""
    import json

    import grpc

    from remote_partitioner.client.blobs import upload_missing
    from remote_partitioner.client.errors import from_rpc_error
    from remote_partitioner.proto import codec
    from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
    from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

    encoded = codec.encode_program(to_edge(fp32()).exported_program())
    graph = json.loads(bytes(encoded.blobs[encoded.message.graph.hash]))
    touched = tmp_path / "touched"
    node = next(n for n in _nodes(graph) if "aten" in str(n["target"]))
    node["target"] = "os.system"
    node["inputs"] = [{"name": "command", "arg": {"as_string": f"touch {touched}"}}]
    bad_graph = json.dumps(graph).encode()
    program = pb.Program()
    program.CopyFrom(encoded.message)
    program.graph.CopyFrom(codec.digest_of(bad_graph))
    raw = program.SerializeToString(deterministic=True)
    # The program itself, which passes the graph check: a rule about the request reached.
    good = encoded.message.SerializeToString(deterministic=True)
    blobs = {**encoded.blobs, program.graph.hash: bad_graph, codec.digest_of(raw).hash: raw,
             codec.digest_of(good).hash: good}
    missing = pb.Digest(hash="0" * 64, size_bytes=10)

    def request(digest: pb.Digest, *, n: int = 1, multimethod: bool = False) -> Any:
        return pb.PreprocessRequest(backend_id="XnnpackBackend", multimethod=multimethod, methods=[
            pb.PreprocessMethod(name="forward", programs=[
                pb.PreprocessInput(program_digest=digest) for _ in range(n)
            ]),
        ])

    with grpc.insecure_channel(server_address) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        digests = [pb.Digest(hash=h, size_bytes=len(bytes(b))) for h, b in blobs.items()]
        upload_missing(lambda m, r: m(r, timeout=60), stub, digests, blobs)
        cases = {
            "no program": (pb.PreprocessRequest(backend_id="XnnpackBackend"),
                           grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PROGRAM"),
            "two for preprocess": (request(codec.digest_of(good), n=2),
                                   grpc.StatusCode.INVALID_ARGUMENT, "INVALID_PROGRAM"),
            "missing blob": (request(missing), grpc.StatusCode.FAILED_PRECONDITION,
                             "BLOB_MISSING"),
            "bad digest": (request(pb.Digest(hash="xyz", size_bytes=1)),
                           grpc.StatusCode.INVALID_ARGUMENT, "INVALID_DIGEST"),
            "code target": (request(codec.digest_of(raw)), grpc.StatusCode.INVALID_ARGUMENT,
                            "INVALID_PROGRAM"),
        }
        for what, (req, code, reason) in cases.items():
            with pytest.raises(grpc.RpcError) as e:
                stub.Preprocess(req, timeout=120)
            err = from_rpc_error(e.value)  # the ErrorInfo reason, as the client reads it
            assert isinstance(err, RemotePartitionerError)
            assert (e.value.code(), err.reason) == (code, reason), (what, e.value.details())
            if what == "two for preprocess":  # the rule it names, not another one
                assert "preprocess takes one program" in e.value.details(), e.value.details()
        # The program "two for preprocess" sends twice is preprocessed when sent once.
        one = stub.Preprocess(request(codec.digest_of(good)), timeout=120)
        assert [m.name for m in one.methods] == ["forward"]
        assert not touched.exists(), "a node target was run"
        # The server keeps serving.
        stub.ListPartitioners(pb.ListPartitionersRequest(), timeout=60)


@slow
def test_vulkan_quantized_fails_as_locally(server_address: str, tmp_path: Path) -> None:
    """Vulkan cannot lower the PT2E (XNNPACK-quantizer) model: locally its preprocess asserts;
    in a process without backends the same AssertionError comes back from the server."""
    import json

    files = _save(tmp_path, quantized())
    path = files["forward"]
    job = {"name": "vulkan", "flow": "transform_and_lower", "out": str(tmp_path / "remote.pte"),
           "files": files}
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, server_address, json.dumps([job])],
        capture_output=True, text=True, timeout=1200,
    )
    with pytest.raises(AssertionError) as local:
        to_edge_transform_and_lower(
            {"forward": torch.export.load(path)}, partitioner=[_local_partitioner("vulkan")]
        )
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("AssertionError"), done.stderr[-3000:]
    assert last == f"AssertionError: {local.value}".rstrip(": ").rstrip(), (last, local.value)
