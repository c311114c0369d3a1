"""The client's unlifted module across the wire and back as edits (proto/codec/modules.py,
module_edits.py).

Each model is exported and unlifted with ``.module()`` as a quantizer sees it, lifted, sent
through the program codec as bytes, rebuilt on the "server" and compared with the client's
module; quantizer edits made on the server copy are applied to the client's module and compared
with the same quantizer step run locally. Real modules, codec and quantizer; no mocks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from functools import reduce
from typing import Any

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from remote_partitioner.proto import codec
from remote_partitioner.proto.codec import module_edits, modules
from remote_partitioner.proto.program_errors import (
    FingerprintMismatch,
    ProgramDecodeError,
    ProgramEncodeError,
    UnrepresentableMeta,
)
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

torch.set_num_threads(1)


class ConvBnRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, bias=False)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class Scalars(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return (y * 2.0 + 1.5) * y + 3.0


class Buffers(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale: torch.Tensor
        self.shift: torch.Tensor
        self.register_buffer("scale", torch.arange(6.0))
        self.register_buffer("shift", torch.ones(6), persistent=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * self.scale + self.shift, y - x


class InPlaceConstant(torch.nn.Module):
    """An in-place operator (kept by torch.export's training dialect) and a ``torch.tensor``
    constant in ``forward`` (``.module()``'s plain attribute ``lifted_tensor_0``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.unsqueeze(0)
        y.squeeze_(0)
        return y * torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def _seeded(cls: type[torch.nn.Module]) -> torch.nn.Module:
    torch.manual_seed(0)
    return cls().eval()


Inputs = tuple[torch.Tensor, ...]


def _client(
    name: str, *, guards: bool = True, seed_model: bool = True
) -> tuple[torch.fx.GraphModule, Inputs]:
    """The module a quantizer sees on the client: ``.module()`` (called from this file, so it
    has a ``_guards_fn`` unless ``guards`` is false), after ``_fuse_conv_bn_``."""
    from torchao.quantization.pt2e.utils import _fuse_conv_bn_

    dynamic: Any = None
    model: torch.nn.Module
    inputs: Inputs
    if name == "conv_bn_relu":
        model, inputs = _seeded(ConvBnRelu), (torch.randn(1, 3, 8, 8),)
    elif name in ("linear", "dead"):
        model, inputs = _seeded(Linear), (torch.randn(2, 6),)
    elif name == "scalars":
        model, inputs = _seeded(Scalars), (torch.randn(2, 6),)
    elif name in ("buffers", "moved_input"):
        model, inputs = _seeded(Buffers), (torch.randn(3, 6), torch.randn(3, 6))
    elif name == "in_place_constant":
        model, inputs = _seeded(InPlaceConstant), (torch.randn(2, 6),)
    elif name == "dynamic":
        model, inputs = _seeded(Linear), (torch.randn(4, 6),)
        dynamic = ({0: torch.export.Dim("batch", min=2, max=64)},)
    else:
        raise AssertionError(name)
    gm = torch.export.export(model, inputs, dynamic_shapes=dynamic, strict=True).module()
    assert isinstance(gm, torch.fx.GraphModule)
    _fuse_conv_bn_(gm)
    guards_nodes = gm.graph.find_nodes(op="call_module", target="_guards_fn")
    assert len(guards_nodes) == 1  # .module() called from a path without "executorch"
    if not guards:
        gm.graph.erase_node(guards_nodes[0])
        delattr(gm, "_guards_fn")
        gm.recompile()
    if name == "moved_input":
        # As Arm's InsertInt32CastsAfterInt64PlaceholdersPass does: a node right after the
        # first placeholder, taking its uses, so that the second placeholder follows it.
        x = gm.graph.find_nodes(op="placeholder")[0]
        with gm.graph.inserting_after(x):
            cast = gm.graph.call_function(torch.ops.aten.clone.default, (x,))
        cast.meta["val"] = x.meta["val"]
        # With a module stack: a node without one is read back with an empty one (torch's
        # deserializer adds it), and the guards call's stack is the first call_function's.
        first = next(n for n in gm.graph.nodes if n.op == "call_function" and n is not cast)
        cast.meta["nn_module_stack"] = first.meta["nn_module_stack"]
        x.replace_all_uses_with(cast, delete_user_cb=lambda u: u is not cast
                                and u.op != "call_module")
        gm.recompile()
    if name == "dead":  # a node nothing uses
        x = gm.graph.find_nodes(op="placeholder")[0]
        out = gm.graph.output_node()
        with gm.graph.inserting_before(out):
            dead = gm.graph.call_function(torch.ops.aten.relu.default, (x,))
        dead.meta["val"] = x.meta["val"]
        gm.recompile()
    return gm, inputs


class _Withheld:
    """Withheld tensors rebuilt as fakes of a mode of their own (``codec.WithheldTensors``)."""

    def __init__(self) -> None:
        self.fake_mode = FakeTensorMode()

    def mark(self, t: torch.Tensor, name: str) -> torch.Tensor:
        return t


def _send(gm: torch.fx.GraphModule, *, withhold: bool = False) -> torch.fx.GraphModule:
    """Lift, encode, message bytes, decode and unlift: the server's copy of ``gm``."""
    before = modules.module_fingerprint(gm)
    ep, table = modules.lift_module(gm)
    assert modules.module_fingerprint(gm) == before  # gm untouched
    encoded = codec.encode_program(ep, withhold=withhold)
    blobs = {h: bytes(b) for h, b in encoded.blobs.items()}
    message = pb.Program.FromString(encoded.message.SerializeToString())
    decoded = codec.decode_program(
        message, lambda d: blobs[d.hash], withheld=_Withheld() if withhold else None
    )
    return modules.unlift_program(decoded, pb.UnliftTable.FromString(table.SerializeToString()))


def _names(value: Any) -> Any:
    return torch.fx.node.map_arg(value, lambda n: f"%{n.name}")


def _vals(node: torch.fx.Node) -> list[tuple[str, torch.dtype]]:
    val = node.meta.get("val")
    flat = val if isinstance(val, (list, tuple)) else [val]
    out = []
    for v in flat:
        if isinstance(v, torch.Tensor):
            assert isinstance(v, FakeTensor), node.name
            out.append((str(list(v.shape)), v.dtype))
    return out


def _assert_same(client: torch.fx.GraphModule, server: torch.fx.GraphModule) -> None:
    a, b = list(client.graph.nodes), list(server.graph.nodes)
    assert [n.name for n in a] == [n.name for n in b]
    for x, y in zip(a, b, strict=True):
        assert (x.op, str(x.target)) == (y.op, str(y.target)), x.name
        assert _names(x.args) == _names(y.args) and _names(x.kwargs) == _names(y.kwargs), x.name
        assert _vals(x) == _vals(y), x.name
        for key in ("source_fn_stack", "stack_trace"):
            assert str(x.meta.get(key)) == str(y.meta.get(key)), (x.name, key)
        # The codec renumbers nn_module_stack's keys (module ids, different in every process).
        stacks = [list((n.meta.get("nn_module_stack") or {}).values()) for n in (x, y)]
        assert stacks[0] == stacks[1], x.name
        assert sorted(u.name for u in x.users) == sorted(u.name for u in y.users), x.name
        assert x.is_impure() == y.is_impure(), x.name
    for name in modules.lift_module(client)[1].attribute_names:
        assert hasattr(server, name), name
    assert list(client.state_dict()) == list(server.state_dict()) or sorted(
        client.state_dict()
    ) == sorted(server.state_dict())
    assert client.code == server.code


def _calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function"]


MODELS = ["conv_bn_relu", "linear", "scalars", "buffers", "dead", "dynamic", "in_place_constant",
          "moved_input"]


@pytest.mark.parametrize("guards", [True, False], ids=["guards", "no-guards"])
@pytest.mark.parametrize("name", MODELS)
def test_module_round_trip(name: str, guards: bool) -> None:
    client, inputs = _client(name, guards=guards)
    server = _send(client)
    _assert_same(client, server)
    if guards:
        node = server.graph.find_nodes(op="call_module")[0]
        assert node.is_impure() and isinstance(server._guards_fn, modules.InertGuards)
    ours, theirs = client.state_dict(), server.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    for n in client.graph.find_nodes(op="get_attr"):  # constants are plain attributes there too
        ours_t, theirs_t = (reduce(getattr, str(n.target).split("."), m) for m in (client, server))
        assert type(theirs_t) is type(ours_t) and torch.equal(theirs_t, ours_t), n.target
    assert client._non_persistent_buffers_set == server._non_persistent_buffers_set
    torch.testing.assert_close(server(*inputs), client(*inputs), rtol=0, atol=0)
    if name == "dynamic":
        bigger = (torch.randn(9, 6),)
        torch.testing.assert_close(server(*bigger), client(*bigger), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["conv_bn_relu", "buffers", "dynamic"])
def test_module_round_trip_withheld(name: str) -> None:
    client, _ = _client(name)
    server = _send(client, withhold=True)
    _assert_same(client, server)
    for _, t in server.named_parameters():
        assert isinstance(t, FakeTensor)


def test_get_attrs_keep_their_positions() -> None:
    """``_fuse_conv_bn_`` puts ``conv_weight_bias`` after the placeholders (and the guards)."""
    client, _ = _client("conv_bn_relu")
    order = [n.name for n in client.graph.nodes]
    assert order.index("conv_weight_bias") > order.index("_guards_fn")
    _, table = modules.lift_module(client)
    assert {a.name: a.after for a in table.attrs}["conv_weight_bias"] == "_guards_fn"
    assert [n.name for n in _send(client).graph.nodes] == order


def test_inputs_after_other_nodes_keep_their_positions() -> None:
    """A placeholder that follows a ``call_function`` node (Arm's quantizer casts an int64
    input right after its placeholder) goes back there: the program holds inputs first."""
    client, _ = _client("moved_input", guards=False)
    order = [n.name for n in client.graph.nodes]
    ops = [n.op for n in client.graph.nodes if n.op != "get_attr"]
    assert ops[:3] == ["placeholder", "call_function", "placeholder"]
    _, table = modules.lift_module(client)
    y = client.graph.find_nodes(op="placeholder")[1]
    assert [(m.name, m.after) for m in table.moved_inputs] == [(y.name, y.prev.name)]
    assert [n.name for n in _send(client).graph.nodes] == order
    # The program holds its inputs first; without the table's entry, the rebuilt module is
    # another one, and says so.
    ep, table = modules.lift_module(client)
    assert [n.op for n in ep.graph.nodes][:4] == ["placeholder"] * 4
    del table.moved_inputs[:]
    with pytest.raises(modules.FingerprintMismatch, match="covers node order"):
        modules.unlift_program(ep, table)


def _xnnpack() -> Any:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    return XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))


def _wire(edits: pb.GraphEdits) -> pb.GraphEdits:
    return pb.GraphEdits.FromString(edits.SerializeToString())


def test_transform_edits_equal_local_transform() -> None:
    client, inputs = _client("scalars")
    local, _ = _client("scalars")
    server = _send(client)
    snapshot = module_edits.ModuleSnapshot(server)
    server = _xnnpack().transform_for_annotation(server)
    edits = _wire(snapshot.edits(server))
    assert [t.target for t in edits.tensors] == ["_tensor_constant_0", "_tensor_constant_1",
                                                 "_tensor_constant_2"]
    assert [n.op for n in edits.inserted] == ["get_attr"] * 3 and edits.changed
    module_edits.apply_edits(client, edits)
    local = _xnnpack().transform_for_annotation(local)
    assert client.code == local.code
    assert [n.name for n in client.graph.nodes] == [n.name for n in local.graph.nodes]
    ours, theirs = dict(client.named_buffers()), dict(local.named_buffers())
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype for k in ours)
    modes = {id(n.meta["val"].fake_mode) for n in client.graph.nodes if "val" in n.meta}
    assert len(modes) == 1
    for x, y in zip(client.graph.nodes, local.graph.nodes, strict=True):
        assert _vals(x) == _vals(y), x.name
    assert modules.module_fingerprint(client) == modules.module_fingerprint(local)
    torch.testing.assert_close(client(*inputs), local(*inputs), rtol=0, atol=0)


def test_no_edits_when_nothing_changes() -> None:
    client, _ = _client("conv_bn_relu")
    server = _send(client)
    snapshot = module_edits.ModuleSnapshot(server)
    edits = snapshot.edits(_xnnpack().transform_for_annotation(server))
    assert not (edits.tensors or edits.inserted or edits.changed or edits.erased)
    before = client.code
    module_edits.apply_edits(client, _wire(edits))
    assert client.code == before


def test_erased_nodes() -> None:
    client, _ = _client("dead")
    server = _send(client)
    snapshot = module_edits.ModuleSnapshot(server)
    server.graph.eliminate_dead_code()
    server.recompile()
    edits = _wire(snapshot.edits(server))
    dead = [n.name for n in client.graph.nodes if n.op == "call_function" and not n.users]
    assert list(edits.erased) == dead == ["relu_default"]
    module_edits.apply_edits(client, edits)
    assert "relu_default" not in {n.name for n in client.graph.nodes}


def _change(action: Callable[[torch.fx.GraphModule], None]) -> pb.GraphEdits:
    server = _send(_client("linear")[0])
    snapshot = module_edits.ModuleSnapshot(server)
    action(server)
    return snapshot.edits(server)


def test_changed_target_is_refused() -> None:
    def act(gm: torch.fx.GraphModule) -> None:
        _calls(gm)[0].target = torch.ops.aten.mm.default

    with pytest.raises(UnrepresentableMeta, match="'linear'"):
        _change(act)


def test_inserted_call_function_is_refused() -> None:
    def act(gm: torch.fx.GraphModule) -> None:
        lin = _calls(gm)[0]
        with gm.graph.inserting_after(lin):
            gm.graph.call_function(torch.ops.aten.relu.default, (lin,), name="extra_relu")

    with pytest.raises(UnrepresentableMeta, match="extra_relu"):
        _change(act)


def test_plain_meta_crosses_other_meta_is_refused_annotations_are_ignored() -> None:
    def annotate(gm: torch.fx.GraphModule) -> None:
        _calls(gm)[0].meta["quantization_annotation"] = object()

    assert not _change(annotate).changed and not _change(annotate).meta

    class Info(dict):  # type: ignore[type-arg]  # a mapping type, as Arm's ArmAnnotationInfo
        pass

    def mark(gm: torch.fx.GraphModule) -> None:
        node = _calls(gm)[0]
        node.meta["custom"] = {"info": Info(quantized=True), "n": [1, 2.5, None]}
        node.meta["disallow_tfa"] = False
        node.meta.pop("nn_module_stack")

    edits = _wire(_change(mark))
    name = _calls(_client("linear")[0])[0].name
    assert [(m.node, m.key, m.removed) for m in edits.meta] == [
        (name, "custom", False), (name, "disallow_tfa", False), (name, "nn_module_stack", True),
    ]
    client = _client("linear")[0]
    assert "nn_module_stack" in _calls(client)[0].meta
    module_edits.apply_edits(client, edits)
    node = _calls(client)[0]
    assert node.meta["custom"] == {"info": {"quantized": True}, "n": [1, 2.5, None]}
    assert type(node.meta["custom"]["info"]) is dict  # the subclass arrives as a dict
    assert node.meta["disallow_tfa"] is False
    assert "nn_module_stack" not in node.meta

    def opaque(gm: torch.fx.GraphModule) -> None:
        _calls(gm)[0].meta["other"] = object()

    with pytest.raises(UnrepresentableMeta, match="'other'"):
        _change(opaque)

    def fake_value(gm: torch.fx.GraphModule) -> None:
        node = _calls(gm)[0]
        node.meta["val"] = node.meta["val"].sum()

    with pytest.raises(UnrepresentableMeta, match="'val'"):
        _change(fake_value)

    # A message that edits `val` (or names a node that is not there) is refused on apply.
    bad = _wire(_change(mark))
    bad.meta[0].key = "val"
    with pytest.raises(codec.ProgramDecodeError, match="cannot be edited"):
        module_edits.apply_edits(_client("linear")[0], bad)
    bad = _wire(_change(mark))
    bad.meta[0].node = "no_such_node"
    with pytest.raises(FingerprintMismatch, match="no_such_node"):
        module_edits.apply_edits(_client("linear")[0], bad)


def test_apply_onto_another_module_is_refused() -> None:
    client, _ = _client("scalars")
    server = _send(client)
    snapshot = module_edits.ModuleSnapshot(server)
    edits = snapshot.edits(_xnnpack().transform_for_annotation(server))
    other, _ = _client("dead")  # another module: the same nodes the edits name, and one more
    expected = modules.module_fingerprint(_client("scalars")[0])
    with pytest.raises(FingerprintMismatch, match="before the edits"):
        module_edits.apply_edits(other, _wire(edits), expected=expected)
    other, _ = _client("scalars")
    x = other.graph.find_nodes(op="placeholder")[0]
    with other.graph.inserting_before(other.graph.output_node()):
        other.graph.call_function(torch.ops.aten.relu.default, (x,))
    other.recompile()
    with pytest.raises(FingerprintMismatch):
        module_edits.apply_edits(other, _wire(edits))
    taken, _ = _client("scalars")
    taken.register_buffer("_tensor_constant_0", torch.zeros(()))
    with pytest.raises(modules.EditConflict, match="_tensor_constant_0"):
        module_edits.apply_edits(taken, _wire(edits))
    assert isinstance(modules.EditConflict("x"), ValueError)


def test_table_naming_an_absent_placeholder_is_refused() -> None:
    client, _ = _client("linear")
    ep, table = modules.lift_module(client)
    encoded = codec.encode_program(ep)
    decoded = codec.decode_program(encoded.message, lambda d: encoded.blobs[d.hash])
    bad = copy.deepcopy(table)
    bad.attrs.add(name="nowhere", target="lin.nowhere", parameter=True)
    with pytest.raises(ProgramDecodeError, match="nowhere"):
        modules.unlift_program(decoded, bad)
    bad = copy.deepcopy(table)
    bad.attrs[0].after = "missing_node"
    with pytest.raises(ProgramDecodeError, match="missing_node"):
        modules.unlift_program(decoded, bad)
    bad = copy.deepcopy(table)
    bad.fingerprint = "0" * 64
    with pytest.raises(FingerprintMismatch):
        modules.unlift_program(decoded, bad)


def test_lift_refuses_other_call_modules() -> None:
    client, _ = _client("linear")
    x = client.graph.find_nodes(op="placeholder")[0]
    client.add_module("other", torch.nn.ReLU())
    with client.graph.inserting_after(x):
        client.graph.call_module("other", (x,))
    with pytest.raises(ProgramEncodeError, match="other"):
        modules.lift_module(client)


def test_fingerprint_is_structural() -> None:
    a, _ = _client("conv_bn_relu")
    b, _ = _client("conv_bn_relu")
    assert modules.module_fingerprint(a) == modules.module_fingerprint(b)
    _calls(b)[-1].args = ()
    assert modules.module_fingerprint(a) != modules.module_fingerprint(b)
