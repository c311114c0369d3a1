"""Property-based fuzzing (hypothesis) of every RPC's requests, and of the program codec.

One in-process server is started for the module. Hypothesis builds requests for every RPC: random
digests (well-formed, malformed, held, held with another size), upload streams of chunks cut from
real blobs and then perturbed, random ``Program`` messages, one-field mutations of real programs
(ATen, Edge, and Edge with fake parameters), mutated graph JSON blobs (random JSON, a node target
replaced by names of code, a random value replaced or removed, bytes flipped) sent with the
client's fingerprint or with the one the server will rebuild (so that the hook itself runs on the
mutated graph), programs parsed from arbitrary bytes, random partitioner specs, and PT2 archives
for ``Lower`` (arbitrary bytes, a real archive with bytes flipped, a member's JSON mutated, a
payload replaced, members dropped or added). The properties, for every call:

* it ends OK with a well-formed response, or with a ``google.rpc.Status`` carrying one
  ``ErrorInfo`` (domain ``remote-partitioner``) whose reason the RPC documents, with the status
  code the README's table gives that reason; so never UNKNOWN, and INTERNAL only with
  ``UNREPRESENTABLE_RESULT``;
* a hook call ends with the reason of the request's first fault, in the server's order: the
  partitioner or its spec, the program's declared sizes, then the program as the codec
  rebuilds it from the blobs the server holds (its error's reason); only a program that
  decodes reaches the partitioner, so only then (or when its constructor refuses the spec) is
  ``PARTITIONER_RAISED`` an answer;
* afterwards the server still answers ``ListPartitioners`` and health reports SERVING.

The codec is fuzzed directly too: ``decode_program`` raises nothing but ``codec.CodecError``, and
node metadata values round-trip. Then payloads that would run code if anything executed,
evaluated or unpickled what the client sends (node targets naming ``os.system`` and friends with
a ``touch FILE`` argument, symbolic sizes and placeholder targets that are Python, pickles whose
loading opens a file for writing, as graphs, tensor storages and PT2 archives or their members):
the files must not appear. Last, lone surrogates in graph JSON, unbounded error messages, and
request bytes that are not a message (tests/test_undecodable.py: INTERNAL on every method).

What the property tests found is fixed, with a regression test naming each input; the property
tests discard no input for hitting a bug.

Runs are reproducible (``derandomize=True``, no example database) and bounded: the whole file
takes about a minute on two cores.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import itertools
import json
import math
import pickle
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import grpc
import pytest
import torch
from executorch.exir import to_edge
from executorch.exir.program._fake_program import get_fake_program
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import note as _hypothesis_note
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from servers import inproc_server  # (tests/ is on sys.path)

from remote_partitioner.client.channel import DEFAULT_CHANNEL_OPTIONS
from remote_partitioner.proto import codec
from remote_partitioner.proto.codec import decode
from remote_partitioner.proto.errors import DOMAIN, STATUS_CODES, Reason, ServiceError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb
from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc
from remote_partitioner.server import value_reads
from remote_partitioner.server.app import SERVICE_NAME
from remote_partitioner.server.blobstore import BlobStore
from remote_partitioner.server.instance import PartitionerInstance

RPC_TIMEOUT = 30.0
Code = grpc.StatusCode

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.function_scoped_fixture,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)

HOOKS = ("Partition", "OpsToNotDecompose", "TransformForPreDecomposition")
# Lower's documented reasons, and INVALID_DIGEST for a malformed archive digest.
_LOWER_REASONS = frozenset({
    "UNKNOWN_PARTITIONER", "INVALID_SPEC", "INVALID_PROGRAM", "PARTITIONER_RAISED",
    "BLOB_MISSING", "LIMIT_EXCEEDED", "INVALID_DIGEST",
})
_HOOK_REASONS = frozenset({
    "UNKNOWN_PARTITIONER", "INVALID_SPEC", "INVALID_PROGRAM", "PARTITIONER_RAISED",
    "BLOB_MISSING", "FINGERPRINT_MISMATCH", "SIZE_MISMATCH", "UNREPRESENTABLE_RESULT",
    "LIMIT_EXCEEDED",
})
# The reasons each RPC documents (the .proto's "Status codes"), plus LIMIT_EXCEEDED for the
# server's configured bounds on declared sizes.
ALLOWED_REASONS: dict[str, frozenset[str]] = {
    "ListPartitioners": frozenset(),
    "FindMissingBlobs": frozenset({"INVALID_DIGEST", "LIMIT_EXCEEDED"}),
    "UploadBlobs": frozenset(
        {"INVALID_DIGEST", "BAD_CHUNK", "DIGEST_MISMATCH", "INCOMPLETE_BLOB", "LIMIT_EXCEEDED"}
    ),
    "ReadBlobs": frozenset({"INVALID_DIGEST", "BLOB_NOT_FOUND", "LIMIT_EXCEEDED"}),
    **dict.fromkeys(HOOKS, _HOOK_REASONS),
    "Lower": _LOWER_REASONS,
}
REQUESTS: dict[str, Callable[..., Any]] = {
    "Partition": pb.PartitionRequest,
    "OpsToNotDecompose": pb.OpsToNotDecomposeRequest,
    "TransformForPreDecomposition": pb.TransformForPreDecompositionRequest,
}
#: Far below any sane server bound on one blob, far above any blob this file uploads.
SMALL_BLOB_BYTES = 1 << 20

# Node targets naming code (and a path, and nothing): none may ever run.
CODE_TARGETS = (
    "os.system",
    "posix.system",
    "builtins.eval",
    "builtins.exec",
    "builtins.__import__",
    "subprocess.call",
    "torch.os.system",
    "torch.load",
    "torch.save",
    "torch.serialization.load",
    "torch.ops.aten.__class__",
    "torch.ops.aten.__class__.__subclasses__",
    "torch.ops.__builtins__",
    "torch.nn.modules.module.Module.__init__",
    "_operator.methodcaller",
    "_operator.attrgetter",
    "math.__builtins__",
    "executorch.exir.dialects.edge.ops.aten.__class__.x",
    "executorch.exir.dialects.edge.ops.__builtins__.eval.default",
    "#os.system",
    "../../x",
    "/bin/sh",
    "",
)


def note(text: str) -> None:
    """``hypothesis.note`` inside a hypothesis test (printed with a falsifying example); nothing
    elsewhere."""
    with contextlib.suppress(InvalidArgument):
        _hypothesis_note(text)


# --------------------------------------------------------------------------------------------
# Blobs every test may name


def _known_blobs() -> list[bytes]:
    seeded = hashlib.sha256(b"fuzz").digest()
    return [
        b"",
        b"\x00",
        b"x",
        bytes(range(256)),
        seeded * 40,
        b'{"graph_module": null}',
        json.dumps({"a": [1, 2, {"b": None}]}).encode(),
    ]


KNOWN_BLOBS = _known_blobs()
KNOWN_DIGESTS = [codec.digest_of(b) for b in KNOWN_BLOBS]


# --------------------------------------------------------------------------------------------
# The server and how every call is checked


@dataclasses.dataclass
class Outcome:
    """How a call ended: OK with a response (the list of messages of ReadBlobs and Lower), or a
    status."""

    response: Any
    code: grpc.StatusCode
    reason: str | None = None
    details: str = ""

    @property
    def ok(self) -> bool:
        return self.code is Code.OK


class Harness:
    """A channel to the module's in-process server, its blob store, and the property checks."""

    def __init__(self, store: BlobStore, target: str, instance: PartitionerInstance) -> None:
        self.store = store
        self.target = target
        #: The server's logic (to build a partitioner as the server does, for the checks).
        self.instance = instance
        # The project client's channel options (1 MiB of metadata: room for the error trailers
        # that carry long messages; test_error_trailers_fit_a_default_client is about the rest).
        self.channel = grpc.insecure_channel(target, options=DEFAULT_CHANNEL_OPTIONS)
        self.stub = pb_grpc.RemotePartitionerStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def call(self, rpc: str, request: Any) -> Outcome:
        """Make the call; check that its status is one the RPC documents (see module doc)."""
        method = getattr(self.stub, rpc)
        try:
            if rpc in ("ReadBlobs", "Lower"):
                response: Any = list(method(request, timeout=RPC_TIMEOUT))
            elif rpc == "UploadBlobs":
                response = method(iter(list(request)), timeout=RPC_TIMEOUT)
            else:
                response = method(request, timeout=RPC_TIMEOUT)
        except grpc.RpcError as e:
            return self._failed(rpc, e)
        return Outcome(response, Code.OK)

    def _failed(self, rpc: str, e: grpc.RpcError) -> Outcome:
        assert isinstance(e, grpc.Call)
        code, details = e.code(), e.details() or ""
        note(f"{rpc} -> {code.name}: {details[:500]}")
        assert code is not Code.UNKNOWN, f"{rpc} ended UNKNOWN: {details}"
        assert code is not Code.DEADLINE_EXCEEDED, f"{rpc} hung: {details}"
        status = rpc_status.from_call(e)
        assert status is not None, f"{rpc} ended {code.name} without a google.rpc.Status: {details}"
        infos = []
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                infos.append(info)
        assert len(infos) == 1, f"{rpc} ended {code.name} with {len(infos)} ErrorInfo: {details}"
        info = infos[0]
        assert info.domain == DOMAIN, info
        assert info.reason in ALLOWED_REASONS[rpc], (
            f"{rpc} ended {code.name} with undocumented reason {info.reason}: {details}"
        )
        assert STATUS_CODES[Reason(info.reason)] is code, (info.reason, code, details)
        return Outcome(None, code, info.reason, details)

    def assert_serving(self) -> None:
        listed = self.stub.ListPartitioners(pb.ListPartitionersRequest(), timeout=RPC_TIMEOUT)
        assert listed.partitioners
        assert listed.versions.api == "v1"
        for service in ("", SERVICE_NAME):
            r = self.health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert r.status == health_pb2.HealthCheckResponse.SERVING, service

    def upload(self, blobs: Sequence[bytes]) -> None:
        chunks = [pb.UploadBlobsRequest(digest=codec.digest_of(b), data=b) for b in blobs]
        outcome = self.call("UploadBlobs", chunks)
        assert outcome.ok, outcome
        for b in blobs:
            assert self.store.get(codec.digest_of(b).hash) == b

    def held(self, d: pb.Digest) -> bool:
        data = self.store.get(d.hash)
        return data is not None and len(data) == d.size_bytes


@pytest.fixture(scope="module")
def harness() -> Iterator[Harness]:
    store = BlobStore()
    with inproc_server(blob_store=store) as (server, target):
        h = Harness(store, target, server.servicer.instance)
        try:
            h.assert_serving()
            h.upload(KNOWN_BLOBS)
            yield h
        finally:
            h.close()


# --------------------------------------------------------------------------------------------
# Real programs


@dataclasses.dataclass
class RealProgram:
    """A real program's message, the blobs it names and its graph JSON."""

    name: str
    message: pb.Program
    blobs: dict[str, bytes]
    graph: dict[str, Any]

    def copy(self) -> pb.Program:
        m = pb.Program()
        m.CopyFrom(self.message)
        return m

    def digests(self) -> list[pb.Digest]:
        return [codec.digest_of(b) for b in self.blobs.values()]


def _real(name: str, ep: torch.export.ExportedProgram) -> RealProgram:
    encoded = codec.encode_program(ep)
    blobs = {h: bytes(b) for h, b in encoded.blobs.items()}
    graph = json.loads(blobs[encoded.message.graph.hash])
    return RealProgram(name, encoded.message, blobs, graph)


@pytest.fixture(scope="module")
def reals() -> dict[str, RealProgram]:
    """Linear(4, 4) as an ATen program, an Edge program and an Edge program with fake weights."""
    torch.manual_seed(0)
    aten = torch.export.export(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    edge = to_edge(torch.export.export(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),)))
    edge_ep = edge.exported_program()
    return {
        "aten": _real("aten", aten),
        "edge": _real("edge", edge_ep),
        "fake": _real("fake", get_fake_program(edge_ep)),
    }


@pytest.fixture(scope="module")
def uploaded(harness: Harness, reals: dict[str, RealProgram]) -> dict[str, RealProgram]:
    """The real programs, their blobs held by the server."""
    for real in reals.values():
        harness.upload(list(real.blobs.values()))
    return reals


def _all_blobs(reals: dict[str, RealProgram], *extra: bytes) -> dict[str, bytes]:
    blobs = {codec.digest_of(b).hash: b for b in KNOWN_BLOBS}
    for real in reals.values():
        blobs.update(real.blobs)
    blobs.update({codec.digest_of(b).hash: b for b in extra})
    return blobs


def _blob_getter(blobs: dict[str, bytes]) -> Callable[[pb.Digest], bytes]:
    def get(d: pb.Digest) -> bytes:
        data = blobs.get(d.hash)
        if data is None:
            raise codec.BlobMissing(d)
        return data

    return get


# --------------------------------------------------------------------------------------------
# Strategies

HEX = "0123456789abcdef"
EDGE_INTS = st.sampled_from(
    [0, 1, -1, 2, 3, 4, 7, 8, 16, 64, 255, 256, 2**31 - 1, 2**31, 2**32, 2**53 + 1, 2**62,
     2**63 - 1, -(2**63), -(2**31)]
)
int64s = st.one_of(st.integers(-4, 70), EDGE_INTS, st.integers(-(2**63), 2**63 - 1))
int32s = st.one_of(st.integers(-3, 5), st.integers(-(2**31), 2**31 - 1))
valid_hashes = st.text(alphabet=HEX, min_size=64, max_size=64)
bad_hashes = st.one_of(
    st.text(max_size=80),
    valid_hashes.map(str.upper),
    st.text(alphabet=HEX, min_size=63, max_size=63),
    st.text(alphabet=HEX, min_size=65, max_size=65),
    valid_hashes.map(lambda h: h[:-1] + "g"),
    valid_hashes.map(lambda h: h + "\n"),
    valid_hashes.map(lambda h: " " + h[1:]),
    st.just(""),
    st.just("../" * 21 + "x"),
)
NAMES = st.one_of(
    st.text(max_size=16),
    st.sampled_from(
        ["", "weight", "bias", "p_weight", "p_bias", "input", "input_1", "linear", "output",
         "aten_addmm_default", "aten_permute_copy_default", "..", "../../x", "\x00", "a.b",
         "__class__", "true_graph_0", "lowered_module_0"]
    ),
)
DTYPES = sorted({str(d).removeprefix("torch.") for d in vars(torch).values()
                 if isinstance(d, torch.dtype)})
dtypes = st.one_of(
    st.sampled_from(DTYPES),
    st.sampled_from(["", "torch.float32", "Float", "float33", "float32 ", "__class__", "dtype"]),
    st.text(max_size=12),
)
META_KEYS = ("stack_trace", "nn_module_stack", "source_fn_stack", "torch_fn", "debug_handle",
             "from_node", "custom", "val", "tensor_meta", "seq_nr")
META_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        ["", "1", "-1", "x", "[]", "{}", "null", "[{}]", '[{"name": 1}]', "a,b,c", "a,b",
         "L__self__,,torch.nn.modules.linear.Linear", "linear_1;builtin_function_or_method.linear",
         "x,torch.os.system", "x,builtins.eval", "x,torch.load", "99999999999999999999999",
         '{"a": [1, 2]}', '[{"name": "a", "target": "b", "graph_id": 1, "pass_name": "p", '
         '"action": "create", "from_node": []}]']
    ),
)


def _digest(hash_: str, size: int) -> pb.Digest:
    return pb.Digest(hash=hash_, size_bytes=size)


def digests(held: Sequence[pb.Digest] = ()) -> st.SearchStrategy[pb.Digest]:
    """Random, malformed, held, and held-but-resized digests."""
    random_ = st.builds(_digest, st.one_of(valid_hashes, bad_hashes), int64s)
    known = st.sampled_from([*KNOWN_DIGESTS, *held])
    resized = st.builds(lambda d, s: _digest(d.hash, s), known, int64s)
    return st.one_of(known, random_, resized)


@st.composite
def tensor_refs(draw: st.DrawFn, held: Sequence[pb.Digest] = ()) -> pb.TensorRef:
    sizes = draw(st.lists(st.one_of(st.integers(-2, 8), int64s), max_size=5))
    same_rank = draw(st.booleans())
    strides = draw(
        st.lists(st.one_of(st.integers(-2, 8), int64s), min_size=len(sizes), max_size=len(sizes))
        if same_rank
        else st.lists(int64s, max_size=5)
    )
    ref = pb.TensorRef(
        name=draw(NAMES),
        dtype=draw(dtypes),
        sizes=sizes,
        strides=strides,
        storage_offset=draw(st.one_of(st.just(0), int64s)),
        fake=draw(st.booleans()),
        is_parameter=draw(st.booleans()),
        requires_grad=draw(st.booleans()),
    )
    if draw(st.booleans()):
        ref.storage.CopyFrom(draw(digests(held)))
    return ref


@st.composite
def fingerprints(draw: st.DrawFn) -> pb.NodeFingerprint:
    return pb.NodeFingerprint(
        graph=draw(st.one_of(st.just(""), NAMES)),
        name=draw(NAMES),
        op=draw(st.sampled_from(["placeholder", "get_attr", "call_function", "call_module",
                                 "call_method", "output", "", "x"])),
        target=draw(st.one_of(NAMES, st.sampled_from(CODE_TARGETS))),
        num_args=draw(int32s),
        kwarg_names=draw(st.lists(NAMES, max_size=3)),
        args=draw(st.text(max_size=30)),
    )


@st.composite
def node_metadata(draw: st.DrawFn, names: Sequence[str] = ()) -> pb.NodeMetadata:
    known = bool(names) and draw(st.booleans())
    name = draw(st.sampled_from(list(names))) if known else draw(NAMES)
    return pb.NodeMetadata(
        node=pb.NodeRef(graph=draw(st.one_of(st.just(""), NAMES)), name=name),
        entries=draw(st.dictionaries(st.one_of(st.sampled_from(META_KEYS), st.text(max_size=8)),
                                     META_TEXT, max_size=3)),
        has_tensor_meta=draw(st.booleans()),
        tensor_meta_requires_grad=draw(st.booleans()),
        no_val=draw(st.booleans()),
        tensor_meta_is_none=draw(st.booleans()),
        tensor_meta_none_items=draw(st.lists(st.booleans(), max_size=3)),
        val_is_list=draw(st.booleans()),
    )


dialects = st.one_of(st.sampled_from([0, 1, 2, 2, 1]), int32s)


@st.composite
def programs(draw: st.DrawFn, held: Sequence[pb.Digest] = (), depth: int = 2) -> pb.Program:
    """A Program with every field random (graph and storages often naming held blobs)."""
    msg = pb.Program(dialect=draw(dialects))
    if draw(st.integers(0, 4)):
        msg.graph.CopyFrom(draw(digests(held)))
    msg.state_dict.extend(draw(st.lists(tensor_refs(held), max_size=3)))
    msg.constants.extend(draw(st.lists(tensor_refs(held), max_size=2)))
    for _ in range(draw(st.integers(0, 2))):
        msg.module_tensors.add(module_path=draw(NAMES), tensor=draw(tensor_refs(held)))
    if depth > 0:
        for _ in range(draw(st.integers(0, 1))):
            msg.lowered_modules.add(
                module_path=draw(NAMES),
                name=draw(NAMES),
                backend_id=draw(st.sampled_from(["XnnpackBackend", "", "x"])),
                compile_specs=[pb.CompileSpec(key=draw(st.text(max_size=8)),
                                              value=draw(st.binary(max_size=8)))],
                original_program=draw(programs(held, depth - 1)),
            )
    msg.fingerprint.extend(draw(st.lists(fingerprints(), max_size=4)))
    msg.node_metadata.extend(draw(st.lists(node_metadata(), max_size=3)))
    return msg


# Lone surrogates (which JSON can carry and protobuf strings cannot) are left to
# test_lone_surrogates_in_graph_json, which puts one in every string of a graph in turn.
json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12),
              st.sampled_from(["as_expr", "as_tensor", "as_int", "as_string", "as_graph"])),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=10),
                                  st.sampled_from(["as_tensor", "name", "target", "inputs"])),
                        inner, max_size=4),
    ),
    max_leaves=20,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path (dict keys, list indices) into a JSON value, the root excluded."""
    items: Any = value.items() if isinstance(value, dict) else (
        enumerate(value) if isinstance(value, list) else ())
    for k, v in items:
        yield (*prefix, k)
        yield from _paths(v, (*prefix, k))


def _nodes(graph: Any) -> Iterator[dict[str, Any]]:
    """The serialized nodes of a graph JSON, nested graphs included."""
    if isinstance(graph, dict):
        if {"target", "inputs", "outputs"} <= graph.keys():
            yield graph
        for v in graph.values():
            yield from _nodes(v)
    elif isinstance(graph, list):
        for v in graph:
            yield from _nodes(v)


@st.composite
def mutated_graphs(draw: st.DrawFn, graph: dict[str, Any]) -> bytes:
    """A graph JSON blob: random JSON, or the real graph with one thing changed."""
    kind = draw(st.sampled_from(["random", "target", "bytes", "replace", "replace", "delete",
                                 "delete", "perturb", "perturb", "perturb"]))
    note(f"graph mutation: {kind}")
    if kind == "random":
        return json.dumps(draw(json_values)).encode()
    g = json.loads(json.dumps(graph))
    if kind == "target":
        node = draw(st.sampled_from(list(_nodes(g))))
        node["target"] = draw(st.one_of(st.sampled_from(CODE_TARGETS), st.text(max_size=40)))
        note(f"target: {node['target']!r}")
        return json.dumps(g).encode()
    if kind == "bytes":
        raw = bytearray(json.dumps(g).encode())
        for _ in range(draw(st.integers(1, 4))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(raw)
    path = draw(st.sampled_from(list(_paths(g))))
    parent: Any = g
    for k in path[:-1]:
        parent = parent[k]
    old = parent[path[-1]]
    note(f"path {path!r}: {old!r:.80}")
    if kind == "delete":
        del parent[path[-1]]
    elif kind == "replace" or isinstance(old, bool) or old is None:
        parent[path[-1]] = draw(json_values)
    elif isinstance(old, int):
        parent[path[-1]] = draw(st.one_of(int64s, st.integers()))
    elif isinstance(old, str):
        parent[path[-1]] = draw(st.one_of(st.text(max_size=20), st.sampled_from(CODE_TARGETS)))
    elif isinstance(old, list) and old:
        parent[path[-1]] = draw(st.permutations(old)) + draw(
            st.lists(st.sampled_from(old), max_size=2))
    else:
        parent[path[-1]] = draw(json_values)
    return json.dumps(g).encode()


TENSOR_FIELDS = ("sizes", "strides", "storage_offset", "dtype", "storage", "fake",
                 "is_parameter", "requires_grad", "name", "drop", "duplicate", "random")
FINGERPRINT_FIELDS = ("graph", "name", "op", "target", "num_args", "kwarg_names", "args",
                      "drop", "duplicate", "swap", "add")


def _mutate_tensor(
    draw: st.DrawFn, refs: Any, i: int, field: str, held: Sequence[pb.Digest]
) -> None:
    if i >= len(refs):
        return
    ref = refs[i]
    if field in ("sizes", "strides"):
        values = draw(st.lists(st.one_of(st.integers(-2, 8), int64s), max_size=5))
        getattr(ref, field)[:] = values
    elif field == "storage_offset":
        ref.storage_offset = draw(int64s)
    elif field == "dtype":
        ref.dtype = draw(dtypes)
    elif field == "storage":
        if draw(st.booleans()):
            ref.ClearField("storage")
        else:
            ref.storage.CopyFrom(draw(digests(held)))
    elif field in ("fake", "is_parameter", "requires_grad"):
        setattr(ref, field, not getattr(ref, field))
    elif field == "name":
        ref.name = draw(NAMES)
    elif field == "drop":
        del refs[i]
    elif field == "duplicate":
        refs.add().CopyFrom(ref)
    else:
        ref.CopyFrom(draw(tensor_refs(held)))


@st.composite
def mutated_programs(
    draw: st.DrawFn, real: RealProgram, held: Sequence[pb.Digest]
) -> tuple[pb.Program, list[bytes]]:
    """The real program with one thing changed; and the new blobs it names (to upload)."""
    msg = real.copy()
    new_blobs: list[bytes] = []
    where = draw(st.sampled_from(
        ["tensor", "tensor", "fingerprint", "fingerprint", "metadata", "graph_digest", "dialect",
         "graph_json", "graph_json", "lowered", "module_tensor"]))
    note(f"mutating {real.name}: {where}")
    if where == "tensor":
        refs = msg.state_dict
        i = draw(st.integers(0, len(refs) - 1))
        fields = draw(st.lists(st.sampled_from(TENSOR_FIELDS), min_size=1, max_size=3,
                               unique=True))
        note(f"state_dict[{i}]: {fields}")
        for field in fields:
            _mutate_tensor(draw, refs, i, field, held)
    elif where == "fingerprint":
        fp = msg.fingerprint
        i = draw(st.integers(0, len(fp) - 1))
        field = draw(st.sampled_from(FINGERPRINT_FIELDS))
        note(f"fingerprint[{i}].{field}")
        if field == "num_args":
            fp[i].num_args = draw(int32s)
        elif field == "kwarg_names":
            fp[i].kwarg_names[:] = draw(st.lists(NAMES, max_size=3))
        elif field == "drop":
            del fp[i]
        elif field == "duplicate":
            fp.add().CopyFrom(fp[i])
        elif field == "swap":
            j = draw(st.integers(0, len(fp) - 1))
            a, b = pb.NodeFingerprint(), pb.NodeFingerprint()
            a.CopyFrom(fp[i])
            b.CopyFrom(fp[j])
            fp[i].CopyFrom(b)
            fp[j].CopyFrom(a)
        elif field == "add":
            fp.add().CopyFrom(draw(fingerprints()))
        else:
            setattr(fp[i], field, draw(st.one_of(NAMES, st.sampled_from(CODE_TARGETS),
                                                 st.text(max_size=30))))
    elif where == "metadata":
        names = [f.name for f in msg.fingerprint]
        if msg.node_metadata and draw(st.booleans()):
            i = draw(st.integers(0, len(msg.node_metadata) - 1))
            if draw(st.booleans()):
                del msg.node_metadata[i]
            else:
                msg.node_metadata[i].CopyFrom(draw(node_metadata(names)))
        else:
            msg.node_metadata.add().CopyFrom(draw(node_metadata(names)))
    elif where == "graph_digest":
        field = draw(st.sampled_from(["size", "hash", "clear", "other"]))
        note(f"graph digest: {field}")
        if field == "size":
            msg.graph.size_bytes = draw(int64s)
        elif field == "hash":
            msg.graph.hash = draw(st.one_of(valid_hashes, bad_hashes))
        elif field == "clear":
            msg.ClearField("graph")
        else:
            msg.graph.CopyFrom(draw(digests(held)))
    elif where == "dialect":
        msg.dialect = draw(dialects)
    elif where == "graph_json":
        raw = draw(mutated_graphs(real.graph))
        new_blobs.append(raw)
        msg.graph.CopyFrom(codec.digest_of(raw))
    elif where == "lowered":
        msg.lowered_modules.add(
            module_path=draw(NAMES), name=draw(NAMES), backend_id="XnnpackBackend",
            original_program=draw(programs(held, 0)) if draw(st.booleans()) else real.message,
        )
    else:
        msg.module_tensors.add(module_path=draw(NAMES), tensor=draw(tensor_refs(held)))
    return msg, new_blobs


def refingerprinted(msg: pb.Program, blobs: dict[str, bytes]) -> pb.Program | None:
    """``msg`` with the fingerprint the server will rebuild (so that a mutated graph gets past
    the fingerprint check to the hook), or None when the program does not decode."""
    try:
        with mock.patch.object(decode, "first_difference", return_value=None):
            ep = codec.decode_program(msg, _blob_getter(blobs))
        fp = codec.fingerprint(ep)
    except Exception:
        return None
    out = pb.Program()
    out.CopyFrom(msg)
    del out.fingerprint[:]
    out.fingerprint.extend(fp)
    return out


partitioner_names = st.sampled_from(["xnnpack", "xnnpack", "coreml"])


def hook_request(rpc: str, program: pb.Program, name: str = "xnnpack",
                 spec: Sequence[pb.SpecEntry] = ()) -> Any:
    return REQUESTS[rpc](partitioner=pb.PartitionerRef(name=name, spec=spec), program=program)


# --------------------------------------------------------------------------------------------
# Checks of OK responses


def check_hook_response(harness: Harness, rpc: str, response: Any, program: pb.Program) -> None:
    nodes = {(f.graph, f.name) for f in program.fingerprint}
    if rpc == "Partition":
        tags = [p.tag for p in response.partition_tags]
        assert len(set(tags)) == len(tags), tags
        for p in response.partition_tags:
            assert p.delegation_spec.backend_id, p
        for t in response.tags:
            assert (t.node.graph, t.node.name) in nodes, t
            assert t.tag in tags, t
        for u in response.meta_updates:
            assert (u.node.graph, u.node.name) in nodes, u
            assert u.key
            assert u.removed != u.HasField("value"), u
            if u.HasField("value"):
                codec.decode_meta_value(u.value)
    elif rpc == "OpsToNotDecompose":
        for op in response.ops:
            codec.op_from_name(op)
        if not response.has_filter:
            assert not response.supported and not response.failures
        for ref in response.supported:
            assert (ref.graph, ref.name) in nodes, ref
        for failure in response.failures:
            assert (failure.node.graph, failure.node.name) in nodes, failure
            assert failure.exception.type
    else:
        assert response.unchanged != response.HasField("program"), response
        if response.HasField("program"):
            for d in codec.iter_digests(response.program):
                assert harness.held(d), d


#: The reason the server gives a program the codec cannot rebuild, by the codec's error.
DECODE_REASONS: dict[type[codec.CodecError], str] = {
    codec.BlobMissing: "BLOB_MISSING",
    codec.FingerprintMismatch: "FINGERPRINT_MISMATCH",
    codec.BlobSizeMismatch: "SIZE_MISMATCH",
    codec.ProgramDecodeError: "INVALID_PROGRAM",
}
#: What a program that decodes may get: the hook's own outcome (None: OK).
HOOK_OUTCOMES = frozenset({None, "PARTITIONER_RAISED", "UNREPRESENTABLE_RESULT"})


def decoded_as(harness: Harness, program: pb.Program) -> str | None:
    """None if ``program`` decodes from the blobs the server holds; else the reason the server
    must give it (by the codec's error)."""
    def get(d: pb.Digest) -> bytes:
        data = harness.store.get(d.hash)
        if data is None:
            raise codec.BlobMissing(d)
        return bytes(data)

    withheld = value_reads.Withheld() if codec.has_withheld(program) else None
    try:
        codec.decode_program(program, get, withheld=withheld)
    except codec.CodecError as e:
        return next(r for cls, r in DECODE_REASONS.items() if isinstance(e, cls))
    return None


def check_hook_outcome(harness: Harness, request: Any, outcome: Outcome) -> None:
    """The call ended as the request's first fault says, in the server's order: the
    partitioner (unknown, a bad spec, or its constructor refusing the spec:
    PARTITIONER_RAISED), the program's declared sizes (LIMIT_EXCEEDED), then the program
    itself (the codec's error's reason); only a program that decodes reaches the hook, whose
    outcome is OK, PARTITIONER_RAISED (the partitioner raised) or UNREPRESENTABLE_RESULT."""
    try:
        harness.instance.partitioner(request.partitioner)
    except ServiceError as e:
        assert outcome.reason == e.reason.value, (outcome, e.message)
        return
    assert outcome.reason not in ("UNKNOWN_PARTITIONER", "INVALID_SPEC"), outcome
    if outcome.reason == "LIMIT_EXCEEDED":
        return  # a declared size (the status's BadRequest names it)
    expected = decoded_as(harness, request.program)
    if expected is None:
        assert outcome.reason in HOOK_OUTCOMES, outcome
    else:
        assert outcome.reason == expected, (outcome, expected)


def run_hook(harness: Harness, rpc: str, request: Any) -> Outcome:
    outcome = harness.call(rpc, request)
    with contextlib.suppress(InvalidArgument):
        event(f"{rpc}: {outcome.reason or 'OK'}")
    if outcome.ok:
        check_hook_response(harness, rpc, outcome.response, request.program)
    check_hook_outcome(harness, request, outcome)
    harness.assert_serving()
    return outcome


def _well_formed(d: pb.Digest) -> bool:
    return (len(d.hash) == 64 and all(c in HEX for c in d.hash) and d.size_bytes >= 0)


def _check_blob_failure(outcome: Outcome, named: Sequence[pb.Digest]) -> None:
    """A failed blob call's reason must be explained by what the request named."""
    if outcome.reason == "INVALID_DIGEST":
        assert any(not _well_formed(d) for d in named), outcome
    elif outcome.reason == "LIMIT_EXCEEDED":
        assert any(d.size_bytes > SMALL_BLOB_BYTES for d in named), outcome


# --------------------------------------------------------------------------------------------
# 1. Discovery and blobs


@pytest.mark.slow
@FUZZ
@given(raw=st.binary(max_size=64))
def test_list_partitioners(harness: Harness, raw: bytes) -> None:
    """Unknown fields in the (empty) request are ignored."""
    try:
        request = pb.ListPartitionersRequest.FromString(raw)
    except DecodeError:
        assume(False)
        raise
    outcome = harness.call("ListPartitioners", request)
    assert outcome.ok, outcome
    names = [p.name for p in outcome.response.partitioners]
    assert names == sorted(set(names)) and "xnnpack" in names
    for p in outcome.response.partitioners:
        assert p.backend_id and p.class_name
        assert pb.HOOK_PARTITION in p.overridden_hooks
    v = outcome.response.versions
    assert v.api == "v1" and v.torch and v.executorch and v.export_schema
    harness.assert_serving()


@pytest.mark.slow
@settings(FUZZ, max_examples=60)
@given(named=st.lists(digests(), max_size=8))
def test_find_missing_blobs(harness: Harness, named: list[pb.Digest]) -> None:
    outcome = harness.call("FindMissingBlobs", pb.FindMissingBlobsRequest(digests=named))
    if outcome.ok:
        assert all(_well_formed(d) for d in named)
        expected = [d for d in named if not harness.held(d)]
        assert list(outcome.response.missing_digests) == expected
    else:
        _check_blob_failure(outcome, named)
    harness.assert_serving()


PERTURBATIONS = ("offset", "digest", "size", "data", "drop", "duplicate", "swap", "append",
                 "truncate")


@st.composite
def upload_streams(draw: st.DrawFn) -> tuple[list[pb.UploadBlobsRequest], list[bytes], bool]:
    """Chunks of a few blobs (each cut at random points), then perhaps perturbed; and whether
    the stream is still exactly the well-formed one."""
    blobs = draw(st.lists(st.one_of(st.binary(max_size=200), st.sampled_from(KNOWN_BLOBS)),
                          max_size=3))
    chunks: list[pb.UploadBlobsRequest] = []
    for data in blobs:
        d = codec.digest_of(data)
        cuts = sorted(draw(st.sets(st.integers(1, len(data) - 1), max_size=3))) if len(
            data) > 1 else []
        bounds = [0, *cuts, len(data)]
        for start, end in itertools.pairwise(bounds):
            chunks.append(pb.UploadBlobsRequest(digest=d, offset=start, data=data[start:end]))
    original = [c.SerializeToString() for c in chunks]
    for kind in draw(st.lists(st.sampled_from(PERTURBATIONS), max_size=2)):
        if not chunks and kind != "append":
            continue
        i = draw(st.integers(0, max(len(chunks) - 1, 0)))
        if kind == "offset":
            chunks[i].offset = draw(int64s)
        elif kind == "digest":
            chunks[i].digest.CopyFrom(draw(digests()))
        elif kind == "size":
            chunks[i].digest.size_bytes = draw(int64s)
        elif kind == "data":
            chunks[i].data = draw(st.binary(max_size=40))
        elif kind == "drop":
            del chunks[i]
        elif kind == "duplicate":
            chunks.insert(i, pb.UploadBlobsRequest.FromString(chunks[i].SerializeToString()))
        elif kind == "swap":
            j = draw(st.integers(0, len(chunks) - 1))
            chunks[i], chunks[j] = chunks[j], chunks[i]
        elif kind == "truncate":
            chunks[i].data = chunks[i].data[: draw(st.integers(0, len(chunks[i].data)))]
        else:
            chunks.append(pb.UploadBlobsRequest(
                digest=draw(digests()), offset=draw(int64s), data=draw(st.binary(max_size=40))))
    intact = [c.SerializeToString() for c in chunks] == original
    return chunks, blobs, intact


@settings(FUZZ, max_examples=60)
@given(stream=upload_streams())
def test_upload_blobs(
    harness: Harness, stream: tuple[list[pb.UploadBlobsRequest], list[bytes], bool]
) -> None:
    chunks, blobs, intact = stream
    note(f"{len(chunks)} chunks, intact={intact}")
    outcome = harness.call("UploadBlobs", chunks)
    if intact:
        assert outcome.ok, outcome
        committed = [(d.hash, d.size_bytes) for d in outcome.response.committed_digests]
        assert committed == [(d.hash, d.size_bytes) for d in map(codec.digest_of, blobs)]
    if outcome.ok:
        for d in outcome.response.committed_digests:
            data = harness.store.get(d.hash)
            assert data is not None and len(data) == d.size_bytes
    else:
        _check_blob_failure(outcome, [c.digest for c in chunks])
    # Nothing held ever differs from its digest.
    for c in chunks:
        data = harness.store.get(c.digest.hash)
        if data is not None:
            assert hashlib.sha256(data).hexdigest() == c.digest.hash
    harness.assert_serving()


@settings(FUZZ, max_examples=60)
@given(named=st.lists(digests(), max_size=5))
def test_read_blobs(harness: Harness, named: list[pb.Digest]) -> None:
    outcome = harness.call("ReadBlobs", pb.ReadBlobsRequest(digests=named))
    if outcome.ok:
        chunks = list(outcome.response)
        for d in named:
            data = harness.store.get(d.hash)
            assert data is not None and len(data) == d.size_bytes
            got = bytearray()
            while chunks and (chunks[0].digest.hash, chunks[0].digest.size_bytes) == (
                d.hash, d.size_bytes
            ):
                c = chunks.pop(0)
                assert c.offset == len(got), (c.offset, len(got))
                got += c.data
                if len(got) == d.size_bytes:
                    break
            assert bytes(got) == data
        assert not chunks, f"{len(chunks)} chunks left over"
    else:
        _check_blob_failure(outcome, named)
        if outcome.reason == "BLOB_NOT_FOUND":
            assert any(_well_formed(d) and not harness.held(d) for d in named)
    harness.assert_serving()


# --------------------------------------------------------------------------------------------
# 2. The hooks


@pytest.mark.slow
@pytest.mark.parametrize("rpc", HOOKS)
@FUZZ
@given(data=st.data())
def test_hooks_on_random_programs(
    harness: Harness, uploaded: dict[str, RealProgram], rpc: str, data: st.DataObject
) -> None:
    held = [d for real in uploaded.values() for d in real.digests()]
    program = data.draw(programs(held), label="program")
    name = data.draw(st.sampled_from(["xnnpack", "xnnpack", "xnnpack", "coreml", "vulkan", "",
                                      "XNNPACK"]))
    run_hook(harness, rpc, hook_request(rpc, program, name))


@pytest.mark.parametrize("rpc", HOOKS)
@FUZZ
@given(data=st.data())
def test_hooks_on_mutated_real_programs(
    harness: Harness, uploaded: dict[str, RealProgram], rpc: str, data: st.DataObject
) -> None:
    held = [d for real in uploaded.values() for d in real.digests()]
    real = uploaded[data.draw(st.sampled_from(["fake", "edge", "aten"]), label="variant")]
    program, new_blobs = data.draw(mutated_programs(real, held), label="mutation")
    if new_blobs:
        harness.upload(new_blobs)
        if data.draw(st.booleans(), label="refingerprint"):
            program = refingerprinted(program, _all_blobs(uploaded, *new_blobs)) or program
    run_hook(harness, rpc, hook_request(rpc, program, data.draw(partitioner_names)))


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_hooks_on_mutated_graph_json(
    harness: Harness, uploaded: dict[str, RealProgram], data: st.DataObject
) -> None:
    """Mutated graph JSON, half the time with the fingerprint the server will rebuild, so that
    the hook itself runs on the mutated graph."""
    real = uploaded[data.draw(st.sampled_from(["fake", "edge", "aten"]), label="variant")]
    raw = data.draw(mutated_graphs(real.graph), label="graph")
    harness.upload([raw])
    program = real.copy()
    program.graph.CopyFrom(codec.digest_of(raw))
    if data.draw(st.booleans(), label="refingerprint"):
        program = refingerprinted(program, _all_blobs(uploaded, raw)) or program
    rpc = data.draw(st.sampled_from(HOOKS), label="rpc")
    run_hook(harness, rpc, hook_request(rpc, program, data.draw(partitioner_names)))


@st.composite
def program_bytes(draw: st.DrawFn, real: RealProgram) -> bytes:
    """Arbitrary bytes, or the real program's serialization with bytes flipped, cut or added."""
    if not draw(st.integers(0, 3)):
        return draw(st.binary(max_size=300))
    raw = bytearray(real.message.SerializeToString())
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(raw) - 1))
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        if op == "flip":
            raw[i] = draw(st.integers(0, 255))
        elif op == "cut":
            del raw[i: i + draw(st.integers(1, 16))]
        else:
            raw[i:i] = draw(st.binary(min_size=1, max_size=8))
        if not raw:
            break
    return bytes(raw)


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_hooks_on_programs_from_bytes(
    harness: Harness, uploaded: dict[str, RealProgram], data: st.DataObject
) -> None:
    real = uploaded[data.draw(st.sampled_from(["fake", "edge", "aten"]), label="variant")]
    raw = data.draw(program_bytes(real), label="bytes")
    try:
        program = pb.Program.FromString(raw)
    except DecodeError:
        assume(False)
        raise
    rpc = data.draw(st.sampled_from(HOOKS), label="rpc")
    run_hook(harness, rpc, hook_request(rpc, program, data.draw(partitioner_names)))


SPEC_STRINGS = st.one_of(
    st.text(max_size=20),
    st.sampled_from(
        ["", "ALL", "all", "CPU_ONLY", "cpu_and_ne", "iOS17", "macOS14", "FLOAT32", "float16",
         "MODEL", "COMPILED_MODEL", "POSITIONAL", "DISABLED", "aten.add.Tensor", "aten.mm",
         "aten.__class__.x", "__builtins__.eval.default", "a::b", "a,b", "a,,b", ",",
         "1,2,3", "0,0,0", "-1,2,3", "1,2", "{}", "[]", "null", '{"mode": "linear_symmetric"}',
         '{"mode": 7}', "common::const_elimination", "common::x", "__import__('os')",
         "torch.os.system", "GEMMConfig", "AddConfig,AddConfig", "fp32", "fp16,fp32",
         "torch.nn.Linear", "L__self__"]
    ),
)
SPEC_VALUES_BY_TYPE: dict[int, st.SearchStrategy[pb.SpecValue]] = {
    pb.SPEC_TYPE_BOOL: st.builds(lambda v: pb.SpecValue(bool_value=v), st.booleans()),
    pb.SPEC_TYPE_INT: st.builds(lambda v: pb.SpecValue(int_value=v), int64s),
    pb.SPEC_TYPE_DOUBLE: st.builds(lambda v: pb.SpecValue(double_value=v), st.floats()),
    pb.SPEC_TYPE_STRING: st.builds(lambda v: pb.SpecValue(string_value=v), SPEC_STRINGS),
    pb.SPEC_TYPE_BYTES: st.builds(lambda v: pb.SpecValue(bytes_value=v), st.binary(max_size=8)),
}
SPEC_VALUES = st.one_of(*SPEC_VALUES_BY_TYPE.values(), st.just(pb.SpecValue()))


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_hooks_with_random_specs(
    harness: Harness, uploaded: dict[str, RealProgram], data: st.DataObject
) -> None:
    """Random spec keys and values; advertised keys most of the time. Vulkan is asked about an
    empty program (its partition() takes seconds): the spec is still validated and the
    partitioner built before the program is decoded."""
    listing = harness.stub.ListPartitioners(pb.ListPartitionersRequest(), timeout=RPC_TIMEOUT)
    keys = {p.name: {k.name: k.type for k in p.spec_keys} for p in listing.partitioners}
    name = data.draw(st.sampled_from(sorted(keys)), label="partitioner")
    spec = []
    for _ in range(data.draw(st.integers(0, 3))):
        if data.draw(st.integers(0, 4)):
            key = data.draw(st.sampled_from(sorted(keys[name])))
            typed = SPEC_VALUES_BY_TYPE.get(keys[name][key], SPEC_VALUES)
            value = data.draw(typed if data.draw(st.integers(0, 3)) else SPEC_VALUES)
        else:
            key, value = data.draw(st.text(max_size=12)), data.draw(SPEC_VALUES)
        spec.append(pb.SpecEntry(key=key, value=value))
    program = pb.Program() if name == "vulkan" else uploaded["fake"].copy()
    rpc = data.draw(st.sampled_from(HOOKS), label="rpc")
    run_hook(harness, rpc, hook_request(rpc, program, name, spec))


# --------------------------------------------------------------------------------------------
# 3. Lower: PT2 archives


def _rezip(archive: bytes, replace: dict[str, bytes | None], extra: dict[str, bytes]) -> bytes:
    """The zip with members replaced (None drops one) and others added."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(archive)) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = replace.get(info.filename, src.read(info))
            if data is not None:
                dst.writestr(info.filename, data)
        for name, data in extra.items():
            dst.writestr(name, data)
    return out.getvalue()


def _members(archive: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(archive)) as z:
        return {info.filename: z.read(info) for info in z.infolist()}


@pytest.fixture(scope="module")
def archive(harness: Harness) -> bytes:
    """Linear(4, 4) as ``torch.export.save`` writes it, held by the server."""
    torch.manual_seed(0)
    ep = torch.export.export(torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    harness.upload([buf.getvalue()])
    return buf.getvalue()


@st.composite
def mutated_archives(draw: st.DrawFn, archive: bytes) -> bytes:
    """The archive with one thing changed: bytes, a member (JSON mutated, payload replaced),
    members dropped or added; or arbitrary bytes."""
    members = _members(archive)
    kind = draw(st.sampled_from(["intact", "random", "bytes", "truncate", "json", "json",
                                 "json", "payload", "drop", "extra"]))
    note(f"archive mutation: {kind}")
    if kind == "intact":
        return archive
    if kind == "random":
        return draw(st.binary(max_size=200))
    if kind == "truncate":
        return archive[: draw(st.integers(0, len(archive) - 1))]
    if kind == "bytes":
        raw = bytearray(archive)
        for _ in range(draw(st.integers(1, 4))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        return bytes(raw)
    names = sorted(members)
    if kind == "json":
        name = draw(st.sampled_from([n for n in names if n.endswith(".json")]))
        note(f"member {name}")
        return _rezip(archive, {name: draw(mutated_graphs(json.loads(members[name])))}, {})
    if kind == "payload":
        name = draw(st.sampled_from([n for n in names if not n.endswith(".json")]))
        note(f"member {name}")
        size = len(members[name])
        data = draw(st.one_of(st.binary(max_size=2 * size + 8), st.just(members[name][:-1]),
                              st.just(members[name] + b"\x00"), st.sampled_from(KNOWN_BLOBS)))
        return _rezip(archive, {name: data}, {})
    if kind == "drop":
        return _rezip(archive, {draw(st.sampled_from(names)): None}, {})
    name = draw(st.one_of(
        st.sampled_from(["../../x", "/etc/x", "archive/../../x", "archive/data/weights/x",
                         "archive/models/other.json", "archive/data/weights/../../../x",
                         "archive/\x00", "archive/" + "a" * 300]),
        st.text(max_size=20).map(lambda t: "archive/" + t),
    ))
    note(f"extra member {name!r}")
    return _rezip(archive, {}, {name: draw(st.binary(max_size=64))})


def check_lower_response(messages: list[pb.LowerResponse], report_only: bool) -> None:
    assert messages
    first = messages[0]
    assert first.HasField("report") and first.report.methods, first
    for m in first.report.methods:
        assert m.method and m.total_nodes >= 0, m
        for d in m.delegated:
            assert d.backend_id and d.partitions > 0 and d.nodes > 0, d
    if report_only:
        assert not first.HasField("pte") and len(messages) == 1, first
        return
    assert first.HasField("pte"), first
    pte = bytearray(first.data)
    for m in messages[1:]:
        assert not m.HasField("report") and not m.HasField("pte"), m
        assert m.offset == len(pte), (m.offset, len(pte))
        pte += m.data
    assert codec.digest_of(bytes(pte)) == first.pte


@pytest.mark.slow
@settings(FUZZ, max_examples=25)
@given(data=st.data())
def test_lower(harness: Harness, archive: bytes, data: st.DataObject) -> None:
    raw = data.draw(mutated_archives(archive), label="archive")
    harness.upload([raw])
    digest = data.draw(st.one_of(st.just(codec.digest_of(raw)), st.just(codec.digest_of(raw)),
                                 st.just(codec.digest_of(raw)), digests()), label="digest")
    names = st.sampled_from(["xnnpack"] * 6 + ["coreml", "x"])
    count = data.draw(st.sampled_from([1] * 8 + [2, 0]), label="partitioners")
    refs = [pb.PartitionerRef(name=data.draw(names)) for _ in range(count)]
    if refs and not data.draw(st.integers(0, 5)):
        refs[0].spec.add(key=data.draw(st.sampled_from(["per_op_mode", "verbose", "x"])),
                         value=data.draw(st.one_of(SPEC_VALUES_BY_TYPE[pb.SPEC_TYPE_BOOL],
                                                   SPEC_VALUES)))
    options = pb.LowerOptions(skip_ir_validity_check=data.draw(st.booleans()),
                              report_only=data.draw(st.booleans()))
    request = pb.LowerRequest(archive=digest, partitioners=refs, options=options)
    outcome = harness.call("Lower", request)
    with contextlib.suppress(InvalidArgument):
        event(f"Lower: {outcome.reason or 'OK'}")
    if outcome.ok:
        check_lower_response(outcome.response, options.report_only)
    harness.assert_serving()


# --------------------------------------------------------------------------------------------
# 4. The codec directly


def _decode_raises_only_codec_errors(msg: pb.Program, blobs: dict[str, bytes]) -> None:
    """The decoder refuses what it cannot rebuild with a :class:`codec.CodecError` of its own.

    ``decode_program`` also turns any other exception into a ``ProgramDecodeError`` (a last
    resort, so that a server never answers UNKNOWN); the decoder is called here without it, so
    that an exception it did not anticipate (a codec bug) fails the test instead of hiding."""
    try:
        decode.Decoder(_blob_getter(blobs)).program(msg)
    except codec.CodecError as e:
        note(f"{type(e).__name__}: {str(e)[:300]}")
        assert isinstance(
            e,
            (codec.BlobMissing, codec.ProgramDecodeError, codec.FingerprintMismatch,
             codec.BlobSizeMismatch),
        ), e


@pytest.mark.slow
@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_decode_random_programs(reals: dict[str, RealProgram], data: st.DataObject) -> None:
    held = [d for real in reals.values() for d in real.digests()]
    _decode_raises_only_codec_errors(data.draw(programs(held)), _all_blobs(reals))


@settings(FUZZ, max_examples=150)
@given(data=st.data())
def test_decode_mutated_real_programs(reals: dict[str, RealProgram], data: st.DataObject) -> None:
    held = [d for real in reals.values() for d in real.digests()]
    real = reals[data.draw(st.sampled_from(["fake", "edge", "aten"]), label="variant")]
    program, new_blobs = data.draw(mutated_programs(real, held), label="mutation")
    blobs = _all_blobs(reals, *new_blobs)
    if new_blobs:
        refingerprint = data.draw(st.booleans(), label="refingerprint")
        program = (refingerprint and refingerprinted(program, blobs)) or program
    _decode_raises_only_codec_errors(program, blobs)


@pytest.mark.slow
@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_decode_programs_from_bytes(reals: dict[str, RealProgram], data: st.DataObject) -> None:
    real = reals[data.draw(st.sampled_from(["fake", "edge", "aten"]), label="variant")]
    try:
        program = pb.Program.FromString(data.draw(program_bytes(real), label="bytes"))
    except DecodeError:
        assume(False)
        raise
    _decode_raises_only_codec_errors(program, _all_blobs(reals))


# TensorRefs torch would refuse, which the decoder refused only through decode_program's last-
# resort catch-all until it checked them itself (found by the tests above).
TENSOR_ESCAPES = [
    pytest.param("edge", {"dtype": "int32"}, id="real-int32-parameter-requiring-grad"),
    pytest.param("fake", {"dtype": "int64"}, id="fake-int64-parameter-requiring-grad"),
    pytest.param("fake", {"dtype": "bool"}, id="fake-bool-parameter-requiring-grad"),
    pytest.param("fake", {"dtype": "qint8"}, id="fake-quantized-dtype"),
    pytest.param("edge", {"sizes": [2**40, 2**40], "strides": [0, 0]}, id="real-numel-overflow"),
    pytest.param("fake", {"sizes": [2**40, 2**40], "strides": [0, 0]}, id="fake-numel-overflow"),
    pytest.param("edge", {"dtype": "quint8"}, id="real-quantized-dtype"),
]


def _with_weight(real: RealProgram, fields: dict[str, Any]) -> pb.Program:
    """The program with its weight's TensorRef (a float32 Parameter requiring grad) changed."""
    program = real.copy()
    ref = program.state_dict[0]
    assert ref.dtype == "float32" and ref.is_parameter and ref.requires_grad
    for name, value in fields.items():
        if isinstance(value, list):
            getattr(ref, name)[:] = value
        else:
            setattr(ref, name, value)
    return program


@pytest.mark.parametrize("variant, fields", TENSOR_ESCAPES)
def test_decode_program_raises_only_codec_errors(
    reals: dict[str, RealProgram], variant: str, fields: dict[str, Any]
) -> None:
    program = _with_weight(reals[variant], fields)
    with pytest.raises(codec.ProgramDecodeError, match=r"^tensor '"):
        decode.Decoder(_blob_getter(_all_blobs(reals))).program(program)


@pytest.mark.parametrize("variant, fields", TENSOR_ESCAPES)
def test_server_refuses_tensors_torch_refuses(
    harness: Harness, uploaded: dict[str, RealProgram], variant: str, fields: dict[str, Any]
) -> None:
    """The servicer's catch-all turns the escapes above into INVALID_PROGRAM."""
    program = _with_weight(uploaded[variant], fields)
    for rpc in HOOKS:
        outcome = run_hook(harness, rpc, hook_request(rpc, program))
        assert outcome.reason == "INVALID_PROGRAM", outcome


def _out_of_order(real: RealProgram) -> pb.Program:
    """The program with the fingerprints of its last two nodes (an operator and the output node
    using it) swapped: a node order in which a node comes before an input it uses."""
    program = real.copy()
    fp = program.fingerprint
    i, j = len(fp) - 2, len(fp) - 1
    assert (fp[i].op, fp[j].op) == ("call_function", "output")
    a, b = pb.NodeFingerprint(), pb.NodeFingerprint()
    a.CopyFrom(fp[i])
    b.CopyFrom(fp[j])
    fp[i].CopyFrom(b)
    fp[j].CopyFrom(a)
    return program


def _named_twice(real: RealProgram) -> pb.Program:
    """The program with its first operator's fingerprint appended again at the end: every node
    is in the order, one of them twice."""
    program = real.copy()
    first = next(f for f in program.fingerprint if f.op == "call_function")
    program.fingerprint.add().CopyFrom(first)
    return program


def _inputs_reversed(real: RealProgram) -> pb.Program:
    """The program with its placeholders' fingerprints in reverse order: an order in which
    every node comes after its inputs, but the placeholders (never moved) are not the graph's."""
    program = real.copy()
    fp = program.fingerprint
    n = sum(f.op == "placeholder" for f in fp)
    assert n > 1 and all(f.op == "placeholder" for f in fp[:n])
    entries = [pb.NodeFingerprint() for _ in range(n)]
    for entry, f in zip(entries, reversed(fp[:n]), strict=True):
        entry.CopyFrom(f)
    for f, entry in zip(fp[:n], entries, strict=True):
        f.CopyFrom(entry)
    return program


ORDERS = [_out_of_order, _named_twice, _inputs_reversed]


@pytest.mark.parametrize("variant", ["fake", "aten"])
@pytest.mark.parametrize("order", ORDERS)
def test_decode_program_refuses_a_fingerprint_out_of_order(
    reals: dict[str, RealProgram], variant: str, order: Callable[[RealProgram], pb.Program]
) -> None:
    """The repairs must not move nodes into an order FX cannot run (Graph.lint raised): the
    order is left, and the fingerprint check names the difference."""
    with pytest.raises(codec.FingerprintMismatch):
        decode.Decoder(_blob_getter(_all_blobs(reals))).program(order(reals[variant]))


@pytest.mark.parametrize("variant", ["fake", "aten"])
@pytest.mark.parametrize("order", ORDERS)
def test_server_refuses_a_fingerprint_out_of_order(
    harness: Harness, uploaded: dict[str, RealProgram], variant: str,
    order: Callable[[RealProgram], pb.Program],
) -> None:
    program = order(uploaded[variant])
    for rpc in HOOKS:
        outcome = run_hook(harness, rpc, hook_request(rpc, program))
        assert outcome.reason == "FINGERPRINT_MISMATCH", outcome


plain_data = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
        st.floats(allow_nan=False, allow_infinity=False), st.text(), st.binary(),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.lists(inner, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=25,
)


def _same(a: Any, b: Any) -> bool:
    """Equal with equal types all the way down (True is not 1, a tuple is not a list; NaN is
    NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, float):
        if math.isnan(a):
            return math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return bool(a == b)


@settings(FUZZ, max_examples=200)
@given(value=plain_data)
def test_meta_value_round_trip(value: Any) -> None:
    encoded = codec.encode_meta_value(value, where="fuzz")
    again = pb.MetaValue.FromString(encoded.SerializeToString())
    assert _same(codec.decode_meta_value(again), value)


class _Opaque:
    pass


@FUZZ
@given(value=st.one_of(
    st.integers(min_value=2**63), st.integers(max_value=-(2**63) - 1),
    st.sets(st.integers(), max_size=2), st.builds(_Opaque), st.builds(object),
    st.dictionaries(st.integers(), st.none(), min_size=1, max_size=2),
    st.lists(st.builds(_Opaque), min_size=1, max_size=2),
    st.builds(lambda x: [[{"k": x}]], st.builds(_Opaque)),
))
def test_meta_value_refuses_what_is_not_plain_data(value: Any) -> None:
    with pytest.raises(codec.UnrepresentableMeta, match="node x, key y"):
        codec.encode_meta_value(value, where="node x, key y")


@pytest.mark.slow
@settings(FUZZ, max_examples=100)
@given(raw=st.binary(max_size=80))
def test_decode_meta_value_of_arbitrary_messages(raw: bytes) -> None:
    try:
        msg = pb.MetaValue.FromString(raw)
    except DecodeError:
        assume(False)
        raise
    value = codec.decode_meta_value(msg)
    assert _same(codec.decode_meta_value(codec.encode_meta_value(value)), value)


# --------------------------------------------------------------------------------------------
# 5. Nothing the client sends runs


class _OpensFile:
    """Unpickling an instance calls ``open(path, "w")``, creating the file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def _pickle_payloads(path: Path, control: Path) -> dict[str, bytes]:
    """Pickles (plain, and in torch.save's zip format) whose loading creates ``path``; checked
    to be live by loading the same payloads for ``control``."""
    def build(p: Path) -> dict[str, bytes]:
        buf = io.BytesIO()
        torch.save(_OpensFile(p), buf)
        return {"pickle": pickle.dumps(_OpensFile(p), protocol=2), "torch-save": buf.getvalue()}

    for kind, payload in build(control).items():
        loaded = pickle.loads(payload) if kind == "pickle" else torch.load(
            io.BytesIO(payload), weights_only=False)
        loaded.close()
        assert control.exists(), kind
        control.unlink()
    return build(path)


def _pickle_programs(real: RealProgram, payload: bytes) -> dict[str, pb.Program]:
    d = codec.digest_of(payload)
    out: dict[str, pb.Program] = {}
    for dialect in ("edge", "aten"):
        m = real.copy()
        m.dialect = pb.DIALECT_EDGE if dialect == "edge" else pb.DIALECT_ATEN
        m.graph.CopyFrom(d)
        out[f"graph-{dialect}"] = m
    m = real.copy()
    ref = m.state_dict[0]
    ref.dtype, ref.storage_offset = "uint8", 0
    ref.sizes[:], ref.strides[:] = [len(payload)], [1]
    ref.storage.CopyFrom(d)
    out["state-dict-storage"] = m
    m = real.copy()
    m.module_tensors.add(tensor=pb.TensorRef(name="t", dtype="uint8", sizes=[len(payload)],
                                             strides=[1], storage=d))
    out["module-tensor-storage"] = m
    m = real.copy()
    m.constants.add(name="c", dtype="uint8", sizes=[len(payload)], strides=[1], storage=d)
    out["constant-storage"] = m
    inner = real.copy()
    inner.graph.CopyFrom(d)
    m = real.copy()
    m.lowered_modules.add(name="lowered_module_0", backend_id="XnnpackBackend",
                          original_program=inner)
    out["lowered-module-graph"] = m
    return out


@pytest.mark.parametrize("kind", ["pickle", "torch-save"])
def test_pickles_are_never_loaded(
    harness: Harness, uploaded: dict[str, RealProgram], archive: bytes, tmp_path: Path,
    kind: str,
) -> None:
    target, control = tmp_path / "unpickled", tmp_path / "control"
    payload = _pickle_payloads(target, control)[kind]
    harness.upload([payload])
    # As a blob read back.
    read = harness.call("ReadBlobs", pb.ReadBlobsRequest(digests=[codec.digest_of(payload)]))
    assert read.ok and b"".join(c.data for c in read.response) == payload
    blobs = _all_blobs(uploaded, payload)
    for where, program in _pickle_programs(uploaded["edge"], payload).items():
        for rpc in HOOKS:
            outcome = run_hook(harness, rpc, hook_request(rpc, program))
            note(f"{where} {rpc}: {outcome.code.name} {outcome.reason}")
            assert not target.exists(), (where, rpc)
        with contextlib.suppress(Exception):  # the codec's errors are tested above
            codec.decode_program(program, _blob_getter(blobs))
        assert not target.exists(), (where, "decode_program")
    # As a PT2 archive, and inside one: the sample inputs (a pickle in every PT2 archive), a
    # weight's payload, and an extra member.
    members = _members(archive)
    weight = next(n for n in members if "/data/weights/" in n and not n.endswith(".json"))
    sample = next(n for n in members if "/sample_inputs/" in n)
    archives = {
        "archive": payload,
        "sample-inputs": _rezip(archive, {sample: payload}, {}),
        "weight": _rezip(archive, {weight: payload}, {}),
        "extra-member": _rezip(archive, {}, {"archive/data/extra.pt": payload}),
    }
    for where, raw in archives.items():
        harness.upload([raw])
        outcome = harness.call("Lower", pb.LowerRequest(
            archive=codec.digest_of(raw), partitioners=[pb.PartitionerRef(name="xnnpack")],
            options=pb.LowerOptions(report_only=True)))
        note(f"Lower {where}: {outcome.code.name} {outcome.reason} {outcome.details[:200]}")
        assert not target.exists(), ("Lower", where)
        harness.assert_serving()


def _graph_with_target(real: RealProgram, node_index: int, target: str, path: Path) -> bytes:
    g = json.loads(json.dumps(real.graph))
    node = list(_nodes(g))[node_index]
    node["target"] = target
    command = f"touch {path}"
    node["inputs"] = [
        {"name": "command", "arg": {"as_string": command}},
        {"name": "f", "arg": {"as_string": str(path)}},
    ]
    return json.dumps(g).encode()


@pytest.mark.parametrize("variant", ["fake", "aten"])
@pytest.mark.parametrize("target", CODE_TARGETS)
def test_targets_naming_code_are_never_called(
    harness: Harness, uploaded: dict[str, RealProgram], tmp_path: Path, variant: str,
    target: str,
) -> None:
    real = uploaded[variant]
    touched = tmp_path / "touched"
    for index in range(len(list(_nodes(real.graph)))):
        raw = _graph_with_target(real, index, target, touched)
        harness.upload([raw])
        program = real.copy()
        program.graph.CopyFrom(codec.digest_of(raw))
        candidates = [program]
        again = refingerprinted(program, _all_blobs(uploaded, raw))
        assert not touched.exists(), "decode_program ran a node target"
        if again is not None:
            candidates.append(again)
        for candidate in candidates:
            for rpc in HOOKS:
                outcome = run_hook(harness, rpc, hook_request(rpc, candidate))
                assert not touched.exists(), (rpc, outcome)


@pytest.mark.parametrize("variant", ["fake", "aten"])
def test_symbolic_expressions_are_never_evaluated(
    harness: Harness, uploaded: dict[str, RealProgram], tmp_path: Path, variant: str
) -> None:
    """A ``SymInt`` in the graph JSON whose ``expr_str`` is Python that creates a file: sympy's
    ``sympify`` evals such text, and torch's and exir's deserializers hand it every
    ``expr_str`` (the codec checks them first: proto/graph_check.py)."""
    real = uploaded[variant]
    touched = tmp_path / "touched"
    g = json.loads(json.dumps(real.graph))
    values = g["graph_module"]["graph"]["tensor_values"]
    user_input = next(v for k, v in values.items() if not k.startswith(("p_", "b_", "c_")))
    user_input["sizes"][0] = {"as_expr": {
        "expr_str": f"__import__('os').system('touch {touched}')",
        "hint": {"as_int": 2},
    }}
    raw = json.dumps(g).encode()
    harness.upload([raw])
    program = real.copy()
    program.graph.CopyFrom(codec.digest_of(raw))
    outcome = run_hook(harness, "Partition", hook_request("Partition", program))
    note(f"{outcome.code.name} {outcome.reason} {outcome.details[:200]}")
    assert not touched.exists(), "the server evaluated a client's symbolic expression"


@pytest.mark.parametrize("variant", ["fake", "aten"])
def test_placeholder_targets_are_never_code(
    harness: Harness, uploaded: dict[str, RealProgram], tmp_path: Path, variant: str
) -> None:
    real = uploaded[variant]
    touched = tmp_path / "touched"
    program = real.copy()
    last = [f for f in program.fingerprint if f.op == "placeholder"][-1]
    last.target = f"{last.target}=__import__('os').system('touch {touched}')"
    outcome = run_hook(harness, "Partition", hook_request("Partition", program))
    note(f"{outcome.code.name} {outcome.reason} {outcome.details[:200]}")
    assert not touched.exists(), "the server ran a placeholder target from the fingerprint"


@pytest.mark.parametrize("options, length", [([], 20_000), (DEFAULT_CHANNEL_OPTIONS, 2_000_000)],
                         ids=["default-client-20kB", "project-client-2MB"])
def test_error_trailers_fit_a_default_client(
    harness: Harness, uploaded: dict[str, RealProgram], options: list[tuple[str, Any]],
    length: int,
) -> None:
    program = uploaded["fake"].copy()
    node = next(f for f in program.fingerprint if f.op == "call_function")
    node.args = "x" * length
    with grpc.insecure_channel(harness.target, options=options) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        with pytest.raises(grpc.RpcError) as excinfo:
            stub.Partition(hook_request("Partition", program), timeout=RPC_TIMEOUT)
    e = excinfo.value
    assert isinstance(e, grpc.Call)
    assert e.code() is Code.FAILED_PRECONDITION, (e.code(), (e.details() or "")[:300])
    harness.assert_serving()


def _with_surrogates(graph: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The graph JSON with a lone surrogate put into one string (a value or a key) at a time."""
    for path in _paths(graph):
        g = json.loads(json.dumps(graph))
        parent: Any = g
        for k in path[:-1]:
            parent = parent[k]
        label = "/".join(map(str, path))
        if isinstance(parent[path[-1]], str):
            parent[path[-1]] = parent[path[-1]][:1] + "\ud800" + parent[path[-1]][1:]
            yield label, g
        if isinstance(parent, dict):
            parent["\ud800" + path[-1]] = parent.pop(path[-1])
            yield f"{label} (key)", g




@pytest.mark.parametrize("variant", ["fake", "aten"])
def test_lone_surrogates_in_graph_json(
    harness: Harness, uploaded: dict[str, RealProgram], variant: str
) -> None:
    """JSON can carry what protobuf strings cannot (lone surrogates, via \\ud800 escapes): each
    string of the graph, in turn, gets one; every status must still be a documented one."""
    real = uploaded[variant]
    for label, g in _with_surrogates(real.graph):
        raw = json.dumps(g).encode()
        harness.upload([raw])
        program = real.copy()
        program.graph.CopyFrom(codec.digest_of(raw))
        try:
            harness.call("Partition", hook_request("Partition", program))
        except AssertionError as e:
            raise AssertionError(f"surrogate in {label}: {e}") from e
    harness.assert_serving()
