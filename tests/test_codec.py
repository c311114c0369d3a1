"""The program codec round-trips programs into structurally identical programs, without pickles."""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import pickle
import typing
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge, to_edge_transform_and_lower
from executorch.exir.program._fake_program import get_fake_program
from torch._export.serde import serialize as tser
from torch.export import Dim, ExportedProgram, export

from remote_partitioner.proto import codec
from remote_partitioner.proto.codec.deserializers import schema_type_hints_memoized
from remote_partitioner.proto.codec.encode import Encoder
from remote_partitioner.proto.codec.serializers import serialize_aten

META_KEYS = (
    "stack_trace", "source_fn_stack", "torch_fn", "debug_handle",
    "tensor_meta",
)


class _Net(torch.nn.Module):
    """Linear with bias, layer norm and batch norm: the ops exir.serde gets wrong."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.ln = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 8)
        self.register_buffer("scale", torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x)).flatten(2)  # (N, 4, 16)
        return self.fc(self.ln(y)) * self.scale


class _Cond(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: self.fc(x).sin(), lambda x: x.cos(), (x,))


def _programs() -> Iterator[tuple[str, ExportedProgram]]:
    torch.manual_seed(0)
    net = _Net().eval()
    x = torch.randn(2, 3, 6, 6)
    aten = export(net, (x,), strict=True)
    yield "aten", aten
    edge = to_edge(copy.deepcopy(aten)).exported_program()
    yield "edge", edge
    yield "edge-fake", get_fake_program(edge)
    lowered = to_edge_transform_and_lower(copy.deepcopy(aten), partitioner=[XnnpackPartitioner()])
    yield "edge-with-delegates", lowered.exported_program()
    batch = Dim("batch", min=1, max=16)
    dyn = export(net, (x,), dynamic_shapes=({0: batch},), strict=True)
    yield "aten-dynamic", dyn
    yield "edge-dynamic", to_edge(dyn).exported_program()
    cond = export(_Cond().eval(), (torch.randn(2, 4),), strict=True)
    yield "aten-cond", cond
    yield "edge-cond", to_edge(cond).exported_program()


#: The names _programs() yields, in order: tests are parametrized over them without building them.
PROGRAM_NAMES = (
    "aten", "edge", "edge-fake", "edge-with-delegates",
    "aten-dynamic", "edge-dynamic", "aten-cond", "edge-cond",
)


@functools.cache
def programs() -> dict[str, ExportedProgram]:
    """The test programs, built on first use (at import, any collection would pay ~12 s)."""
    built = dict(_programs())
    assert tuple(built) == PROGRAM_NAMES, f"PROGRAM_NAMES is stale: {tuple(built)}"
    return built


def _roundtrip(ep: ExportedProgram) -> tuple[codec.EncodedProgram, ExportedProgram]:
    encoded = codec.encode_program(ep)
    blobs = {h: bytes(b) for h, b in encoded.blobs.items()}
    return encoded, codec.decode_program(encoded.message, lambda d: blobs[d.hash])


def _comparable(value: Any) -> Any:
    if isinstance(value, torch.Tensor):  # symbolic sizes of two programs compare as text
        return (str(tuple(value.shape)), value.dtype, str(tuple(value.stride())))
    if isinstance(value, (list, tuple)):
        return type(value)(_comparable(v) for v in value)
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return str(value)
    return value


def _by_name(value: Any) -> Any:
    """``value`` (a node's args or kwargs) with every node replaced by its name."""
    return _comparable(torch.fx.node.map_arg(value, lambda n: f"%{n.name}"))


def _kind(module: Any) -> str:
    """A module's class name; "GraphModule" for any graph module (fx makes a class each)."""
    return "GraphModule" if isinstance(module, torch.fx.GraphModule) else type(module).__qualname__


def _same_graph_module(name: str, path: str, a: torch.fx.GraphModule,
                       b: torch.fx.GraphModule) -> None:
    """``b`` is ``a`` as torch.fx sees it, compared without the codec: the Python code fx
    generates, every node's op, name, target, arguments and users, and each delegate
    (lowered module) the graph calls: its backend, compile specs and program."""
    where = f"{name}: {path or 'root'}"
    assert b.code == a.code, where
    assert len(b.graph.nodes) == len(a.graph.nodes), where
    for x, y in zip(a.graph.nodes, b.graph.nodes, strict=True):
        assert (y.op, y.name, str(y.target)) == (x.op, x.name, str(x.target)), where
        assert _by_name(y.args) == _by_name(x.args), f"{where}: {x.name}"
        assert _by_name(y.kwargs) == _by_name(x.kwargs), f"{where}: {x.name}"
        assert [u.name for u in y.users] == [u.name for u in x.users], f"{where}: {x.name}"
        if x.op == "get_attr":
            mine, theirs = getattr(a, x.target), getattr(b, y.target)
            assert _kind(theirs) == _kind(mine), f"{where}: {x.name}"
            if hasattr(mine, "original_module"):  # a delegate: backend, specs, its program
                # (its processed bytes do not cross: docs/protocol.md §5)
                assert theirs.backend_id == mine.backend_id, f"{where}: {x.name}"
                assert [(c.key, bytes(c.value)) for c in theirs.compile_specs] == [
                    (c.key, bytes(c.value)) for c in mine.compile_specs
                ], f"{where}: {x.name}"
                _same_graph_module(
                    name, f"{path}.{x.target}", mine.original_module.graph_module,
                    theirs.original_module.graph_module,
                )


@pytest.mark.parametrize("name", PROGRAM_NAMES)
def test_roundtrip_is_structurally_identical(name: str) -> None:
    ep = programs()[name]
    _, decoded = _roundtrip(ep)
    assert codec.first_difference(codec.fingerprint(ep), codec.fingerprint(decoded)) is None
    # Compared independently of the codec (its fingerprint could share its blind spots).
    def graphs(root: torch.nn.Module) -> dict[str, torch.fx.GraphModule]:
        return {p: m for p, m in root.named_modules() if isinstance(m, torch.fx.GraphModule)}

    mine, theirs = graphs(ep.graph_module), graphs(decoded.graph_module)
    assert list(theirs) == list(mine)
    for path, gm in mine.items():
        _same_graph_module(name, path, gm, theirs[path])
    assert str(decoded.graph_signature) == str(ep.graph_signature)
    assert {str(k): str(v) for k, v in decoded.range_constraints.items()} == {
        str(k): str(v) for k, v in ep.range_constraints.items()
    }
    assert [v.dialect for v in decoded.verifiers] == [v.dialect for v in ep.verifiers]
    for path, gm in codec.graph_modules(ep.graph_module):
        other = dict(codec.graph_modules(decoded.graph_module))[path]
        for a, b in zip(gm.graph.nodes, other.graph.nodes, strict=True):
            assert _comparable(b.meta.get("val")) == _comparable(a.meta.get("val")), a.name
            for key in META_KEYS:
                if key in a.meta:  # (symbolic sizes of two programs compare as text)
                    assert str(b.meta.get(key)) == str(a.meta[key]), f"{name}: {a.name}: {key}"
            # Module addresses are renumbered; the modules and their order are the same.
            if "nn_module_stack" in a.meta:
                assert list(b.meta["nn_module_stack"].values()) == list(
                    a.meta["nn_module_stack"].values()
                ), f"{name}: {a.name}"
    for key, value in ep.state_dict.items():
        got = decoded.state_dict[key]
        assert (got.shape, got.dtype, type(got)) == (value.shape, value.dtype, type(value))
        if not isinstance(value, torch._subclasses.fake_tensor.FakeTensor):
            assert torch.equal(got, value)
    for key, value in ep.constants.items():
        assert torch.equal(decoded.constants[key], value)


def test_exir_serde_hazards_are_repaired() -> None:
    edge = programs()["edge"]
    _, decoded = _roundtrip(edge)
    names = [n.name for n in decoded.graph.nodes]
    assert not [n for n in names if "_unused_" in n], "invented getitem nodes must be removed"
    for a, b in zip(edge.graph.nodes, decoded.graph.nodes, strict=True):
        assert len(b.args) == len(a.args) and list(b.kwargs) == list(a.kwargs), a.name


def test_fake_tensors_cross_as_metadata_only() -> None:
    fake = programs()["edge-fake"]
    encoded, decoded = _roundtrip(fake)
    assert all(r.fake and not r.HasField("storage") for r in encoded.message.state_dict)
    param_bytes = sum(t.numel() * t.element_size() for t in fake.state_dict.values())
    blob_bytes = sum(len(b) for b in encoded.blobs.values())
    graph_bytes = encoded.message.graph.size_bytes
    assert blob_bytes - graph_bytes < param_bytes
    assert all(
        isinstance(t, torch._subclasses.fake_tensor.FakeTensor) for t in decoded.state_dict.values()
    )


def test_decoding_never_unpickles(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the codec must not unpickle")

    encoded = {name: codec.encode_program(ep) for name, ep in programs().items()}
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    for e in encoded.values():
        codec.decode_program(e.message, lambda d, e=e: e.blobs[d.hash])


def test_type_hints_are_memoized_only_while_deserializing() -> None:
    """The ``typing.get_type_hints`` replacement is in place inside the deserializers only:
    encoding and importing the codec leave ``typing`` alone, decoding puts it back."""
    from torch._export.serde import schema

    original = typing.get_type_hints
    seen: list[bool] = []
    real_dict_to_dataclass = tser._dict_to_dataclass

    def spy(cls: Any, data: Any) -> Any:
        seen.append(typing.get_type_hints is not original)
        return real_dict_to_dataclass(cls, data)

    for name in ("aten", "edge-with-delegates"):
        encoded = codec.encode_program(programs()[name])
        assert typing.get_type_hints is original
        with pytest.MonkeyPatch.context() as m:
            m.setattr(tser, "_dict_to_dataclass", spy)
            codec.decode_program(encoded.message, lambda d, e=encoded: e.blobs[d.hash])
        assert typing.get_type_hints is original, name
    assert seen and all(seen)
    with schema_type_hints_memoized(), schema_type_hints_memoized():  # nested: one install
        hints = typing.get_type_hints(schema.Node, globalns=vars(schema))
        assert typing.get_type_hints(schema.Node, globalns=vars(schema)) is hints
        extras = original(schema.Node, vars(schema), None, True)  # passed through: not memoized
        assert typing.get_type_hints(schema.Node, vars(schema), None, True) == extras != hints
    assert typing.get_type_hints is original


def test_missing_blob_is_named() -> None:
    encoded = codec.encode_program(programs()["edge"])
    target = encoded.message.state_dict[0].storage

    def blobs(d: Any) -> Any:
        if d.hash == target.hash:
            raise codec.BlobMissing(d)
        return encoded.blobs[d.hash]

    with pytest.raises(codec.BlobMissing, match=target.hash):
        codec.decode_program(encoded.message, blobs)


def test_meta_values_roundtrip_and_refuse_objects() -> None:
    value = {"a": [1, 2.5, "x", None, True, b"\x00"], "b": (1, (2, 3))}
    assert codec.decode_meta_value(codec.encode_meta_value(value)) == value
    with pytest.raises(codec.UnrepresentableMeta, match="node n, key k"):
        codec.encode_meta_value({"f": object()}, where="node n, key k")


def test_operator_names_roundtrip_and_refuse_non_operators() -> None:
    op = torch.ops.aten.linear.default
    assert codec.op_from_name(codec.op_name(op)) is op
    for bad in ("os::system.default", "aten::__class__.default", "aten", "builtins::eval.x"):
        with pytest.raises(ValueError):
            codec.op_from_name(bad)


def test_aten_graph_json_is_torchs_own() -> None:
    """The encoder skips torch's discarded canonicalize self-check, not anything it writes."""
    from torch._export.serde import serialize as tser

    torch.manual_seed(0)
    for ep in (programs()["aten"], export(_Cond(), (torch.randn(4),), strict=True)):
        theirs = tser.serialize(
            ep, serialize_state_dict=False, serialize_constants=False,
            serialize_example_inputs=False,
        ).exported_program
        encoder = Encoder(None)
        ours = serialize_aten(ep, encoder)
        assert ours == Encoder(None).graph_json(
            json.loads(theirs), tser.EnumEncoder, allow_nan=False
        )
        assert encoder._graph_ids  # there were graph ids to renumber


def test_same_program_same_bytes_in_every_lowering() -> None:
    """from_node graph ids are addresses of the exporting process's graphs; the encoding
    renumbers them, so two lowerings of one model send the same graph blobs."""
    torch.manual_seed(0)
    graphs = []
    for _ in range(2):
        ep = export(_Net().eval(), (torch.randn(2, 3, 6, 6),), strict=True)
        edge = to_edge(ep).exported_program()
        graphs.append(
            [codec.encode_program(p).message.graph.hash for p in (ep, edge)]
        )
    assert graphs[0] == graphs[1]


_ENCODE_IN_A_PROCESS = """
import hashlib, json, sys, torch
from remote_partitioner.proto import codec
from executorch.exir import to_edge

class MatMul(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.relu = torch.nn.ReLU()

    def forward(self, x, y):
        return self.relu(torch.mm(x, y)) + self.relu(x)  # relu's second call: "<id>@1"

_ = [object() for _ in range(int(sys.argv[1]))]  # a different heap in each process
ep = torch.export.export(MatMul(), (torch.ones(3, 3), torch.ones(3, 3)), strict=True)
sources = [json.dumps(f.to_dict()) for n in ep.graph.nodes for f in n.meta.get("from_node", [])]
assert any(" at 0x" in s for s in sources), sources  # there are addresses to renumber
stacks = [str(n.meta.get("nn_module_stack")) for n in ep.graph.nodes]
assert any("@1" in s for s in stacks), stacks
for p in (ep, to_edge(ep).exported_program()):
    e = codec.encode_program(p, withhold=True)
    message = e.message.SerializeToString(deterministic=True)
    print(e.message.graph.hash, hashlib.sha256(message).hexdigest())
"""


@pytest.mark.slow  # two fresh processes (about 20 s)
def test_same_program_same_bytes_in_every_process() -> None:
    """A builtin's ``repr`` in ``from_node`` names its address (``<built-in method mm of type
    object at 0x7f...>``), and a module called again is ``<its id>@1`` in ``nn_module_stack``:
    both differ from process to process. Renumbered, the same model exported in two processes
    sends the same graph blobs and program messages, so that a warm server's blobs and cached
    answers serve a new client process too."""
    import subprocess
    import sys

    outs = [
        subprocess.run(
            [sys.executable, "-c", _ENCODE_IN_A_PROCESS, str(n)], capture_output=True,
            text=True, timeout=300, check=True,
        ).stdout
        for n in (0, 100_000)
    ]
    assert len(outs[0].split()) == 4
    assert outs[0] == outs[1]


def test_writable_blobs_are_shared_read_only_blobs_copied() -> None:
    ep = programs()["aten"]
    encoded = codec.encode_program(ep)
    writable = {h: bytearray(b) for h, b in encoded.blobs.items()}
    shared = codec.decode_program(encoded.message, lambda d: writable[d.hash])
    copied = codec.decode_program(encoded.message, lambda d: bytes(writable[d.hash]))
    name = "conv.weight"
    buf = writable[encoded.message.state_dict[0].storage.hash]
    assert encoded.message.state_dict[0].name == name
    before = copied.state_dict[name].clone()
    shared.state_dict[name].data.zero_()  # writes through to the buffer it was decoded from
    assert not any(buf)
    assert torch.equal(copied.state_dict[name], before)


@pytest.mark.parametrize("name", PROGRAM_NAMES)
def test_fast_dataclass_to_dict_writes_what_the_serializers_write(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The codec's faster ``_dataclass_to_dict`` (with the process-local ids renumbered in
    the same pass) and faster schema unions give every program the graph blobs that torch's
    and exir's own functions give (both dialects, delegates, dynamic shapes, cond)."""
    from executorch.exir.serde import export_serialize
    from executorch.exir.serde.union import _Union as exir_union
    from torch._export.serde import serialize as tser
    from torch._export.serde.union import _Union as torch_union

    from remote_partitioner.proto.codec import encode, serializers

    unions = {u: (u.__dict__["create"], u.__dict__["__post_init__"])
              for u in (torch_union, exir_union)}
    ep = programs()[name]
    fast = codec.encode_program(ep)
    # The unions are torch's and exir's own again once the encoding is done.
    assert {u: (u.__dict__["create"], u.__dict__["__post_init__"]) for u in unions} == unions
    originals = {"aten": tser._dataclass_to_dict, "edge": export_serialize._dataclass_to_dict}
    monkeypatch.setattr(serializers, "dataclass_to_dict", originals.__getitem__)
    monkeypatch.setattr(encode, "fast_unions", contextlib.nullcontext)
    slow = codec.encode_program(ep)
    assert codec.graph_digests(fast.message) is not None
    assert [d.hash for d in codec.graph_digests(fast.message)] == [
        d.hash for d in codec.graph_digests(slow.message)]
    assert fast.message == slow.message


@pytest.mark.slow  # (an export and a to_edge of its own: 5 s)
def test_derived_dims_root_symbols_keep_their_hints() -> None:
    """A derived dim (``Dim("h") * 16``) crosses as the expression ``16*s`` with its hint; the
    decoded shape environment has the client's hint for ``s`` itself (an ATen and an Edge
    program), so a guard its ranges cannot decide is evaluated as the client's would be."""
    from test_conformance_regressions import derived_dims_program

    aten = derived_dims_program()
    for ep in (aten, to_edge(copy.deepcopy(aten)).exported_program()):
        x = next(n for n in ep.graph.nodes if n.op == "placeholder" and n.name == "x")
        client_env = x.meta["val"].shape[2].node.shape_env
        roots = {s for d in x.meta["val"].shape if isinstance(d, torch.SymInt)
                 for s in d.node.expr.free_symbols}
        assert len(roots) == 2 and not any(isinstance(d, int) for d in x.meta["val"].shape[2:])
        back = _roundtrip(ep)[1]
        y = next(n for n in back.graph.nodes if n.op == "placeholder" and n.name == "x")
        env = y.meta["val"].shape[2].node.shape_env
        hints = {str(s): int(v) for s, v in env.backed_var_to_val.items() if s.is_Symbol}
        assert {str(r): hints.get(str(r)) for r in roots} == {
            str(r): int(client_env.backed_var_to_val[r]) for r in roots}
        # XNNPACK's partitioner asks every node whether it is empty: guards the value ranges
        # cannot decide (``floor(s/2) - 1`` after three max-pools) are answered from the hints.
        client = {n.name: bool(n.meta["val"].numel() == 0) for n in ep.graph.nodes
                  if isinstance(n.meta.get("val"), torch.Tensor)}
        assert {n.name: bool(n.meta["val"].numel() == 0) for n in back.graph.nodes
                if isinstance(n.meta.get("val"), torch.Tensor)} == client


def test_symbol_hints_are_solved_only_from_linear_expressions() -> None:
    """The expressions come from the client: only ``a*s + b`` (a derived dim) is solved, with an
    integer solution in range; a power, a floor or an inexact division is left unsolved."""
    import sympy
    from torch.utils._sympy.value_ranges import ValueRanges

    from remote_partitioner.proto.codec.repair import _solve_for

    s = sympy.Symbol("s89", integer=True, positive=True)
    assert _solve_for(16 * s, s, 224, ValueRanges(1, 16)) == 14
    assert _solve_for(2 * s + 1, s, 9, None) == 4
    assert _solve_for(16 * s, s, 224, ValueRanges(1, 8)) is None  # out of range
    assert _solve_for(16 * s, s, 225, None) is None  # not an integer
    for expr in (s**2, s**1_000_000, sympy.floor(s / 2), s * sympy.Rational(1, 2)):
        assert _solve_for(expr, s, 4, None) is None, expr


def test_edge_verifier_configuration_crosses() -> None:
    """An Edge program keeps its verifier's configuration across the wire: the operators kept
    from decomposition validate on the other side as they do locally (Arm's preprocess calls
    ``validate()``; the default verifier refused ``aten.linear`` there), and nothing but
    registered operators is accepted for it."""
    from executorch.exir import EdgeCompileConfig
    linear = torch.ops.aten.linear.default
    edge = to_edge(
        export(torch.nn.Linear(4, 3).eval(), (torch.randn(2, 4),)),
        compile_config=EdgeCompileConfig(preserve_ops=[linear], _skip_dim_order=True),
    ).exported_program()
    assert any(getattr(n.target, "_op", None) is linear for n in edge.graph.nodes)  # kept
    edge.validate()
    encoded, decoded = _roundtrip(edge)
    want = edge.verifiers[0]()
    # (exir's verifier lists the operator once per verifier it built along the way: kept as is)
    assert set(encoded.message.edge_verifier.preserve_ops) == {"aten::linear.default"}
    assert list(encoded.message.edge_verifier.preserve_ops) == [
        codec.op_name(op) for op in want._preserve_ops]
    assert not encoded.message.edge_verifier.use_dim_order
    assert encoded.message.edge_verifier.check_ir_validity
    decoded.validate()  # the default Edge verifier refuses aten.linear here
    got = decoded.verifiers[0]()
    assert (got.enable, got.use_dim_order, got._preserve_ops,
            got._core_aten_ops_exception_list) == (
        want.enable, want.use_dim_order, want._preserve_ops,
        want._core_aten_ops_exception_list)

    # Without the field, exir's deserializer takes the Edge verifier class the process built
    # last (torch registers verifier classes by dialect): process history, not the program.
    # With a default one last, that verifier refuses the operator the program keeps.
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    blobs = {h: bytes(b) for h, b in encoded.blobs.items()}
    message = copy.deepcopy(encoded.message)
    message.ClearField("edge_verifier")
    EXIREdgeDialectVerifier(class_only=True)
    default = codec.decode_program(message, lambda d: blobs[d.hash])
    assert not default.verifiers[0]()._preserve_ops
    with pytest.raises(Exception, match=r"aten\.linear"):
        default.validate()
    # With it, the same history does not matter.
    EXIREdgeDialectVerifier(class_only=True)
    codec.decode_program(encoded.message, lambda d: blobs[d.hash]).validate()

    for bad in ("builtins::eval.default", "aten::no_such_op.default", "os.system"):
        message = copy.deepcopy(encoded.message)
        message.edge_verifier.preserve_ops[0] = bad
        with pytest.raises(codec.ProgramDecodeError, match="Edge verifier"):
            codec.decode_program(message, lambda d: blobs[d.hash])

    aten = codec.encode_program(programs()["aten"])
    assert not aten.message.HasField("edge_verifier")
    message = copy.deepcopy(aten.message)
    message.edge_verifier.check_ir_validity = True
    aten_blobs = {h: bytes(b) for h, b in aten.blobs.items()}
    with pytest.raises(codec.ProgramDecodeError, match="cannot carry an Edge verifier"):
        codec.decode_program(message, lambda d: aten_blobs[d.hash])


@pytest.mark.parametrize("kind", ["aten", "edge"])
def test_custom_node_metadata_crosses(kind: str) -> None:
    """``node.meta["custom"]`` (JSON data a backend keeps through export: Arm's quantizer marks
    quantized nodes there and Arm's partitioner reads the mark) crosses for every node, Edge
    programs included (exir's serializer drops it; torch's keeps it)."""
    ep = programs()[kind]
    marked = {}
    for i, node in enumerate(ep.graph.nodes):
        if node.op in ("placeholder", "call_function"):
            node.meta["custom"] = {"_arm_annotation_info": {"quantized": i % 2 == 0}, "n": i}
            marked[node.name] = node.meta["custom"]
    try:
        _, decoded = _roundtrip(ep)
    finally:
        for node in ep.graph.nodes:
            node.meta.pop("custom", None)
    got = {n.name: n.meta.get("custom") for n in decoded.graph.nodes if n.name in marked}
    assert got == marked
    assert any(n.op == "call_function" for n in ep.graph.nodes if n.name in marked)
