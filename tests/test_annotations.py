"""The annotation codec: the real hosted quantizers' annotations cross as bytes and come back
structurally identical, with the same sharing, and drive torchao's prepare and convert to the
same result; what cannot cross is refused, naming it."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from executorch.backends.vulkan.quantizer import vulkan_quantizer
from executorch.backends.xnnpack.quantizer import xnnpack_quantizer
from torchao.quantization.pt2e import fake_quantize, observer
from torchao.quantization.pt2e.observer import MinMaxObserver, PartialWrapper
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    Quantizer,
    SharedQuantizationSpec,
)

from remote_partitioner.proto import codec
from remote_partitioner.proto.codec import annotations as annotations_module
from remote_partitioner.proto.codec.annotations import (
    ALLOWED_CONSTRUCTORS,
    UnknownConstructor,
    apply_annotations,
    encode_annotations,
)
from remote_partitioner.proto.program_errors import ProgramDecodeError, UnrepresentableMeta
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

KEY = "quantization_annotation"


# --------------------------------------------------------------------------------------------
# Models and the annotations the real quantizers write


class _ConvNet(torch.nn.Module):
    """conv+bn+relu, a second conv, add, mul, cat, adaptive_avg_pool2d, flatten, linear: the
    patterns that give shared specs (edges and nodes) besides plain ones."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(3, 4, 3)
        self.lin = torch.nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.bn(self.conv(x)))
        b = self.conv2(x)
        c = torch.cat([a + b, a * b], dim=1)
        d = torch.nn.functional.adaptive_avg_pool2d(c, 1).flatten(1)
        return self.lin(d)


class _Linear(torch.nn.Module):
    """One linear layer and a relu."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def _conv_inputs() -> tuple[torch.Tensor]:
    return (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(0)),)


def _linear_inputs() -> tuple[torch.Tensor]:
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(0)),)


def _exported(
    model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], *, train: bool = False
) -> torch.fx.GraphModule:
    torch.manual_seed(0)
    model = model.train() if train else model.eval()
    return torch.export.export(model, inputs, strict=True).module()


def _annotated(
    quantizer: Quantizer, gm: torch.fx.GraphModule
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """(a copy of the module taken just before ``annotate``, the annotated module)."""
    gm = quantizer.transform_for_annotation(copy.deepcopy(gm))
    before = copy.deepcopy(gm)
    quantizer.annotate(gm)
    assert [n.name for n in before.graph.nodes] == [n.name for n in gm.graph.nodes]
    return before, gm


def _over_the_wire(gm: torch.fx.GraphModule, onto: torch.fx.GraphModule) -> pb.Annotations:
    """Encode ``gm``'s annotations, send them as bytes, apply them onto ``onto``."""
    msg = pb.Annotations.FromString(encode_annotations(gm).SerializeToString())
    apply_annotations(onto, msg)
    return msg


def _xnnpack(**config: bool) -> Quantizer:
    return xnnpack_quantizer.XNNPACKQuantizer().set_global(
        xnnpack_quantizer.get_symmetric_quantization_config(**config)
    )


def _vulkan(**config: bool) -> Quantizer:
    return vulkan_quantizer.VulkanQuantizer().set_global(
        vulkan_quantizer.get_symmetric_quantization_config(**config)
    )


# --------------------------------------------------------------------------------------------
# The structural comparison (written here, independently of the codec)


def _is_constructor(value: Any) -> bool:
    return isinstance(value, type) or type(value) is PartialWrapper


def _objects(gm: torch.fx.GraphModule) -> Iterator[tuple[str, Any]]:
    """Every annotation, spec and constructor reachable from ``gm``'s annotations, each with
    the position it is met at, in a fixed order."""

    def constructor(ctr: Any, where: str) -> Iterator[tuple[str, Any]]:
        yield where, ctr
        if type(ctr) is PartialWrapper:
            yield from constructor(ctr.p.func, f"{where}.func")
            for name, value in ctr.p.keywords.items():
                if _is_constructor(value):
                    yield from constructor(value, f"{where}.{name}")
            for name, value in ctr.callable_args.items():
                yield from constructor(value, f"{where}.callable_args.{name}")

    def spec(s: Any, where: str) -> Iterator[tuple[str, Any]]:
        yield where, s
        if isinstance(s, QuantizationSpec):
            yield from constructor(s.observer_or_fake_quant_ctr, f"{where}.ctr")

    for node in gm.graph.nodes:
        if KEY not in node.meta:
            continue
        ann = node.meta[KEY]
        yield node.name, ann
        for input_node, s in ann.input_qspec_map.items():
            if s is not None:
                yield from spec(s, f"{node.name}.input[{input_node.name}]")
        if ann.output_qspec is not None:
            yield from spec(ann.output_qspec, f"{node.name}.output")


def _sharing(gm: torch.fx.GraphModule) -> list[tuple[str, int]]:
    """Each position with the first position holding the same object: two positions hold one
    object iff their numbers are equal."""
    first: dict[int, int] = {}
    out = []
    for i, (where, obj) in enumerate(_objects(gm)):
        out.append((where, first.setdefault(id(obj), i)))
    return out


def _names(value: Any) -> Any:
    """A node, edge or list of them by node name."""
    if isinstance(value, torch.fx.Node):
        return value.name
    if isinstance(value, tuple):
        return tuple(_names(v) for v in value)
    if isinstance(value, list):
        return [_names(v) for v in value]
    raise AssertionError(f"not a node or edge: {value!r}")


def _assert_same_constructor(a: Any, b: Any, where: str) -> None:
    if isinstance(a, type) or isinstance(b, type):
        assert a is b, where
        return
    assert type(a) is type(b) is PartialWrapper, where
    assert type(a.p) is type(b.p) is functools.partial, where
    assert a.p.args == b.p.args == (), where
    assert list(a.p.keywords) == list(b.p.keywords), where
    for name, va in a.p.keywords.items():
        vb = b.p.keywords[name]
        if _is_constructor(va):
            _assert_same_constructor(va, vb, f"{where}.{name}")
        else:
            assert type(va) is type(vb) and va == vb, f"{where}.{name}: {va!r} != {vb!r}"
    assert list(a.callable_args) == list(b.callable_args), where
    for name, va in a.callable_args.items():
        _assert_same_constructor(va, b.callable_args[name], f"{where}.callable_args.{name}")
    assert ("__module__" in vars(a)) == ("__module__" in vars(b)), where
    assert vars(a).get("__module__") == vars(b).get("__module__"), where
    _assert_same_constructor(a.p.func, b.p.func, f"{where}.func")


def _assert_same_spec(a: Any, b: Any, where: str) -> None:
    assert (a is None) == (b is None), where
    if a is None:
        return
    assert type(a) is type(b), where
    for name in a.__dataclass_fields__:
        va, vb = getattr(a, name), getattr(b, name)
        if name == "observer_or_fake_quant_ctr":
            _assert_same_constructor(va, vb, f"{where}.{name}")
        elif name in ("edge_or_node", "derived_from"):
            assert _names(va) == _names(vb), f"{where}.{name}"
        elif name == "derive_qparams_fn":
            assert va is vb, f"{where}.{name}"
        else:
            assert type(va) is type(vb) and va == vb, f"{where}.{name}: {va!r} != {vb!r}"
    assert set(vars(a)) == set(vars(b)), where


def assert_same_annotations(a: torch.fx.GraphModule, b: torch.fx.GraphModule) -> None:
    """Same annotated nodes, same input keys in the same order, equal specs and equivalent
    constructors, and the same sharing: two positions hold one object in ``a`` iff they do
    in ``b``."""
    annotated_a = [n.name for n in a.graph.nodes if KEY in n.meta]
    annotated_b = [n.name for n in b.graph.nodes if KEY in n.meta]
    assert annotated_a == annotated_b
    assert annotated_a, "nothing was annotated"
    nodes_b = {n.name: n for n in b.graph.nodes}
    for node in a.graph.nodes:
        if KEY not in node.meta:
            continue
        qa, qb = node.meta[KEY], nodes_b[node.name].meta[KEY]
        assert type(qa) is type(qb) is QuantizationAnnotation, node.name
        assert [k.name for k in qa.input_qspec_map] == [k.name for k in qb.input_qspec_map]
        for k in qb.input_qspec_map:
            assert k.graph is b.graph
        pairs = zip(qa.input_qspec_map.items(), qb.input_qspec_map.values(), strict=True)
        for (ka, sa), sb in pairs:
            _assert_same_spec(sa, sb, f"{node.name}.input[{ka.name}]")
        _assert_same_spec(qa.output_qspec, qb.output_qspec, f"{node.name}.output")
        assert qa.allow_implicit_sharing is qb.allow_implicit_sharing, node.name
        assert qa._annotated is qb._annotated, node.name
        assert set(vars(qa)) == set(vars(qb)), node.name
    assert _sharing(a) == _sharing(b)


# --------------------------------------------------------------------------------------------
# torchao driven by the annotations that crossed


class _OverTheWire(Quantizer):
    """Stands in for the remote quantizer: the hosted quantizer annotates a copy of the module
    (as the server does), and its annotations cross as bytes onto the module itself, where
    they must be the same annotations. ``messages``: what crossed, call by call."""

    def __init__(self, hosted: Quantizer) -> None:
        super().__init__()
        self.hosted = hosted
        self.messages: list[pb.Annotations] = []

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return self.hosted.transform_for_annotation(model)

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        server_copy = copy.deepcopy(model)
        self.hosted.annotate(server_copy)
        self.messages.append(_over_the_wire(server_copy, model))
        assert_same_annotations(server_copy, model)
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        self.hosted.validate(model)


def _quantized(
    gm: torch.fx.GraphModule,
    quantizer: Quantizer,
    inputs: tuple[torch.Tensor, ...],
    *,
    qat: bool = False,
) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """(the prepared module's copy after calibration, the converted module)."""
    torch.manual_seed(0)
    prepare = prepare_qat_pt2e if qat else prepare_pt2e
    prepared = prepare(copy.deepcopy(gm), quantizer)
    prepared(*inputs)
    calibrated = copy.deepcopy(prepared)
    return calibrated, convert_pt2e(prepared)


def _assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for name, ta in sa.items():
        assert ta.dtype == sb[name].dtype and torch.equal(ta, sb[name]), name


def assert_drives_torchao_identically(
    gm: torch.fx.GraphModule,
    hosted: Quantizer,
    inputs: tuple[torch.Tensor, ...],
    *,
    qat: bool = False,
) -> pb.Annotations:
    """prepare (or prepare_qat), one calibration run and convert give the same program, the same
    observer statistics and the same quantized weights with the hosted quantizer annotating
    locally and with its annotations crossing the wire (as the same annotations). Returns the
    message that crossed."""
    local_prepared, local = _quantized(gm, hosted, inputs, qat=qat)
    wire = _OverTheWire(hosted)
    remote_prepared, remote = _quantized(gm, wire, inputs, qat=qat)
    assert remote_prepared.code == local_prepared.code
    _assert_same_state(remote_prepared, local_prepared)
    assert remote.code == local.code
    _assert_same_state(remote, local)
    assert "quantize_per" in local.code
    assert torch.equal(remote(*inputs), local(*inputs))
    (msg,) = wire.messages
    return msg


# --------------------------------------------------------------------------------------------
# The hosted quantizers' annotations


@pytest.fixture(scope="module")
def conv_net() -> torch.fx.GraphModule:
    return _exported(_ConvNet(), _conv_inputs())


@pytest.fixture(scope="module")
def conv_net_train() -> torch.fx.GraphModule:
    return _exported(_ConvNet(), _conv_inputs(), train=True)


def test_xnnpack_static_per_channel(conv_net: torch.fx.GraphModule) -> None:
    """Static per-channel XNNPACK: plain specs, specs shared by node and by edge, a None
    bias key; the round trip keeps all of it, and torchao gives the same quantized program."""
    hosted = _xnnpack(is_per_channel=True)
    before, gm = _annotated(hosted, conv_net)
    msg = _over_the_wire(gm, before)
    assert_same_annotations(gm, before)

    kinds = {s.WhichOneof("kind") for s in msg.specs}
    assert kinds == {"quantization", "shared"}
    shared = {s.shared.edge_or_node.WhichOneof("kind") for s in msg.specs if s.HasField("shared")}
    assert shared == {"node", "edge"}
    assert any(not i.HasField("spec") for n in msg.nodes for i in n.inputs)
    # One entry per distinct object: the config's activation spec is one object, used often.
    assert len(msg.specs) < sum(len(n.inputs) + 1 for n in msg.nodes)
    # Post-order: a partial names only earlier constructors.
    for i, c in enumerate(msg.constructors):
        if c.HasField("partial"):
            assert c.partial.func < i

    assert_drives_torchao_identically(conv_net, hosted, _conv_inputs())


def test_encode_is_deterministic_and_idempotent(conv_net: torch.fx.GraphModule) -> None:
    """Encoding the rebuilt annotations states the same message, byte for byte."""
    before, gm = _annotated(_xnnpack(is_per_channel=True), conv_net)
    msg = _over_the_wire(gm, before)
    assert encode_annotations(before).SerializeToString(deterministic=True) == (
        msg.SerializeToString(deterministic=True)
    )
    assert encode_annotations(gm) == msg


@pytest.mark.slow  # prepare_qat_pt2e and convert_pt2e export conv-bn patterns (about 20 s)
@pytest.mark.usefixtures("torchao_qat_memo")  # the local run exports them, the wire run copies
def test_xnnpack_qat(conv_net_train: torch.fx.GraphModule) -> None:
    """QAT: fake-quantize constructors whose wrapper carries ``__module__`` and an observer
    class as a keyword; prepare_qat_pt2e folds conv+bn reading the annotations."""
    hosted = _xnnpack(is_qat=True)
    before, gm = _annotated(hosted, conv_net_train)
    msg = _over_the_wire(gm, before)
    assert_same_annotations(gm, before)
    partials = [c.partial for c in msg.constructors if c.HasField("partial")]
    assert all(p.module_attribute == "torchao.quantization.pt2e.fake_quantize" for p in partials)
    assert any(k.HasField("constructor") for p in partials for k in p.keywords)

    assert_drives_torchao_identically(conv_net_train, hosted, _conv_inputs(), qat=True)


def test_xnnpack_dynamic(conv_net: torch.fx.GraphModule) -> None:
    """Dynamic quantization: ``is_dynamic`` specs over PlaceholderObserver."""
    hosted = _xnnpack(is_dynamic=True)
    before, gm = _annotated(hosted, conv_net)
    msg = _over_the_wire(gm, before)
    assert_same_annotations(gm, before)
    assert any(s.quantization.is_dynamic for s in msg.specs)

    assert_drives_torchao_identically(conv_net, hosted, _conv_inputs())


def test_xnnpack_qat_dynamic(conv_net_train: torch.fx.GraphModule) -> None:
    """QAT and dynamic: a FakeQuantize partial whose ``observer`` keyword is itself a partial."""
    before, gm = _annotated(_xnnpack(is_qat=True, is_dynamic=True), conv_net_train)
    msg = _over_the_wire(gm, before)
    assert_same_annotations(gm, before)
    nested = [
        k
        for c in msg.constructors
        if c.HasField("partial")
        for k in c.partial.keywords
        if k.HasField("constructor") and msg.constructors[k.constructor].HasField("partial")
    ]
    assert nested


def test_vulkan_weight_only_keeps_none_keys() -> None:
    """Vulkan's weight-only config writes the activation key with None: the key and the order of
    keys survive."""
    gm0 = _exported(_Linear(), _linear_inputs())
    hosted = _vulkan()
    before, gm = _annotated(hosted, gm0)
    msg = _over_the_wire(gm, before)
    assert_same_annotations(gm, before)
    linear = next(n for n in msg.nodes if n.node == "linear")
    assert [(i.input, i.HasField("spec")) for i in linear.inputs] == [
        (k.name, v is not None)
        for k, v in next(n for n in gm.graph.nodes if n.name == "linear")
        .meta[KEY]
        .input_qspec_map.items()
    ]
    assert any(not i.HasField("spec") for i in linear.inputs)

    assert_drives_torchao_identically(gm0, hosted, _linear_inputs())


def test_vulkan_dynamic() -> None:
    gm0 = _exported(_Linear(), _linear_inputs())
    before, gm = _annotated(_vulkan(is_dynamic=True), gm0)
    _over_the_wire(gm, before)
    assert_same_annotations(gm, before)


@pytest.mark.slow
def test_coreml() -> None:
    """Core ML: FakeQuantize partials with dtype and qscheme keywords, with the config of
    ExecuTorch's Core ML tester (the hosted quantizer's default: test_quantizers.py)."""
    from executorch.backends.apple.coreml.quantizer import CoreMLQuantizer
    from executorch.backends.apple.coreml.test.tester import _get_static_int8_linear_qconfig

    from remote_partitioner.server.pattern_memo import memoize_coreml_pattern_graphs

    config = _get_static_int8_linear_qconfig()
    gm0 = _exported(_Linear(), _linear_inputs())
    # Two annotate calls, not three: the message and the comparison of the annotations are the
    # ones the wire quantizer made. Each strictly exports 405 pattern graphs (about 48 s here);
    # with the server's pattern memo installed, the local call is its miss (exactly the
    # unmemoized export, by the memo's contract) and the wire call its hits (deep copies), so
    # the test also checks that the memo quantizes as Core ML's own export does, in half the
    # time.
    from executorch.backends.apple.coreml.quantizer import _coreml_quantizer_utils

    assert not getattr(_coreml_quantizer_utils._get_aten_graph_module, "memoized", False)
    restore = memoize_coreml_pattern_graphs()
    assert restore is not None
    try:
        msg = assert_drives_torchao_identically(gm0, CoreMLQuantizer(config), _linear_inputs())
    finally:
        restore()
    keywords = {k.WhichOneof("value") for c in msg.constructors for k in c.partial.keywords}
    assert {"dtype", "qscheme", "constructor"} <= keywords


# --------------------------------------------------------------------------------------------
# Fixed and derived specs, shared annotation objects (written by hand: no hosted quantizer
# writes a derived spec, and only Core ML's slow test a fixed one)


def _derive_bias_qparams(obs_or_fqs: list[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    act, weight = obs_or_fqs
    act_scale, _ = act.calculate_qparams()
    weight_scale, _ = weight.calculate_qparams()
    scale = (act_scale * weight_scale).to(torch.float32)
    return scale, torch.zeros_like(scale, dtype=torch.int32)


class _HandQuantizer(Quantizer):
    """Linear with a derived bias spec, sigmoid with a fixed-qparams output."""

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        act = QuantizationSpec(
            dtype=torch.int8,
            quant_min=-128,
            quant_max=127,
            qscheme=torch.per_tensor_affine,
            observer_or_fake_quant_ctr=MinMaxObserver.with_args(eps=2**-12),
        )
        weight = QuantizationSpec(
            dtype=torch.int8,
            quant_min=-127,
            quant_max=127,
            qscheme=torch.per_tensor_symmetric,
            observer_or_fake_quant_ctr=MinMaxObserver,
        )
        for node in model.graph.nodes:
            if node.target == torch.ops.aten.linear.default:
                x, w, b = node.args
                bias = DerivedQuantizationSpec(
                    derived_from=[(x, node), (w, node)],
                    derive_qparams_fn=_derive_bias_qparams,
                    dtype=torch.int32,
                    quant_min=-(2**31),
                    quant_max=2**31 - 1,
                    qscheme=torch.per_tensor_symmetric,
                )
                node.meta[KEY] = QuantizationAnnotation(
                    input_qspec_map={x: act, w: weight, b: bias},
                    output_qspec=act,
                    _annotated=True,
                )
            elif node.target == torch.ops.aten.sigmoid.default:
                node.meta[KEY] = QuantizationAnnotation(
                    input_qspec_map={node.args[0]: SharedQuantizationSpec(node.args[0])},
                    output_qspec=FixedQParamsQuantizationSpec(
                        dtype=torch.uint8,
                        scale=1.0 / 256.0,
                        zero_point=0,
                        quant_min=0,
                        quant_max=255,
                        qscheme=torch.per_tensor_affine,
                    ),
                    allow_implicit_sharing=False,
                )
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        pass


class _LinearSigmoid(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.lin(x))


def _allow_derive(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"{_derive_bias_qparams.__module__}.{_derive_bias_qparams.__qualname__}"
    allowed = {name: _derive_bias_qparams}
    monkeypatch.setattr(annotations_module, "ALLOWED_DERIVE_FUNCTIONS", allowed)


def test_fixed_and_derived_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    _allow_derive(monkeypatch)
    gm0 = _exported(_LinearSigmoid(), _linear_inputs())
    before, gm = _annotated(_HandQuantizer(), gm0)
    msg = _over_the_wire(gm, before)
    assert_same_annotations(gm, before)
    assert {s.WhichOneof("kind") for s in msg.specs} == {
        "quantization",
        "fixed",
        "shared",
        "derived",
    }
    assert_drives_torchao_identically(gm0, _HandQuantizer(), _linear_inputs())


def test_derive_function_not_allowed() -> None:
    """Without the allow-list entry, encoding a derived spec names the function; so does
    applying a message that names one."""
    gm0 = _exported(_LinearSigmoid(), _linear_inputs())
    before, gm = _annotated(_HandQuantizer(), gm0)
    name = f"{_derive_bias_qparams.__module__}.{_derive_bias_qparams.__qualname__}"
    with pytest.raises(UnknownConstructor, match="derive_qparams_fn") as raised:
        encode_annotations(gm)
    assert raised.value.name == name
    assert name in str(raised.value) and "allow-list" in str(raised.value)

    with pytest.MonkeyPatch.context() as patch:
        _allow_derive(patch)
        msg = encode_annotations(gm)
    with pytest.raises(UnknownConstructor, match="not on the allow-list"):
        apply_annotations(before, msg)


def test_sharing_of_annotation_and_spec_objects() -> None:
    """Nodes sharing one annotation object share the rebuilt one; equal but distinct specs stay
    distinct, one spec object used twice stays one."""
    gm0 = _exported(_Linear(), _linear_inputs())
    gm = copy.deepcopy(gm0)
    nodes = {n.name: n for n in gm.graph.nodes}
    ctr = MinMaxObserver.with_args(eps=2**-12)
    one = QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=ctr)
    equal = QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=ctr)
    shared = QuantizationAnnotation(output_qspec=one)
    nodes["linear"].meta[KEY] = QuantizationAnnotation(
        input_qspec_map={nodes["x"]: one, nodes["lin_weight"]: equal}, output_qspec=equal
    )
    nodes["relu"].meta[KEY] = shared
    nodes["x"].meta[KEY] = shared
    onto = copy.deepcopy(gm0)
    msg = _over_the_wire(gm, onto)
    assert_same_annotations(gm, onto)
    assert len(msg.specs) == 2 and len(msg.constructors) == 2
    assert [n.object for n in msg.nodes] == [0, 1, 0]
    rebuilt = {n.name: n for n in onto.graph.nodes}
    assert rebuilt["relu"].meta[KEY] is rebuilt["x"].meta[KEY]
    lin = rebuilt["linear"].meta[KEY]
    specs = list(lin.input_qspec_map.values())
    assert specs[0] is not specs[1] and specs[0] == specs[1]  # equal by value: same constructor
    assert lin.output_qspec is specs[1]


def test_apply_replaces_every_annotation(conv_net: torch.fx.GraphModule) -> None:
    """After apply, exactly the nodes the message names are annotated."""
    before, gm = _annotated(_xnnpack(), conv_net)
    stale = next(n for n in before.graph.nodes if n.op == "output")
    stale.meta[KEY] = QuantizationAnnotation()
    _over_the_wire(gm, before)
    assert KEY not in stale.meta
    assert_same_annotations(gm, before)


# --------------------------------------------------------------------------------------------
# The allow-list


def test_allow_list_is_torchaos_observer_and_fake_quantize_classes() -> None:
    """ALLOWED_CONSTRUCTORS is every concrete ObserverBase / FakeQuantizeBase subclass that
    torchao.quantization.pt2e.observer and .fake_quantize define, by qualified name."""
    defined = {}
    for module in (observer, fake_quantize):
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and value.__module__ == module.__name__
                and issubclass(value, (observer.ObserverBase, fake_quantize.FakeQuantizeBase))
                and not inspect.isabstract(value)
            ):
                defined[f"{value.__module__}.{value.__qualname__}"] = value
    assert dict(ALLOWED_CONSTRUCTORS) == defined
    assert "torchao.quantization.pt2e.fake_quantize.FusedMovingAvgObsFakeQuantize" in defined
    with pytest.raises(TypeError):
        ALLOWED_CONSTRUCTORS["os.system"] = object  # type: ignore[index]


def test_public_names() -> None:
    assert codec.encode_annotations is encode_annotations
    assert codec.apply_annotations is apply_annotations
    assert codec.UnknownConstructor is UnknownConstructor
    assert issubclass(UnknownConstructor, UnrepresentableMeta)


# --------------------------------------------------------------------------------------------
# Refusals


class _CustomObserver(MinMaxObserver):
    """An observer class that is not on the allow-list."""


def _annotated_linear(ctr: Any) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """(the module unannotated, the module with linear's output spec built over ``ctr``)."""
    gm0 = _exported(_Linear(), _linear_inputs())
    gm = copy.deepcopy(gm0)
    linear = next(n for n in gm.graph.nodes if n.name == "linear")
    linear.meta[KEY] = QuantizationAnnotation(
        output_qspec=QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=ctr)
    )
    return gm0, gm


@pytest.mark.parametrize(
    "ctr",
    [
        _CustomObserver,
        _CustomObserver.with_args(eps=0.5),
        MinMaxObserver.with_args(eps=0.5).with_args(averaging_constant=0.1)
        .with_callable_args(observer=_CustomObserver),
        fake_quantize.FakeQuantize.with_args(observer=_CustomObserver),
    ],
    ids=["class", "partial", "callable_args", "keyword"],
)
def test_encode_refuses_a_class_not_allowed(ctr: Any) -> None:
    _, gm = _annotated_linear(ctr)
    name = f"{_CustomObserver.__module__}.{_CustomObserver.__qualname__}"
    with pytest.raises(UnknownConstructor) as raised:
        encode_annotations(gm)
    assert raised.value.name == name
    message = str(raised.value)
    assert name in message and "not on the allow-list" in message
    assert "'linear'" in message and "output_qspec" in message


def test_encode_refuses_a_function_as_constructor() -> None:
    def make_observer() -> MinMaxObserver:
        return MinMaxObserver()

    _, gm = _annotated_linear(make_observer)
    with pytest.raises(UnknownConstructor, match="make_observer"):
        encode_annotations(gm)


@pytest.mark.parametrize(
    "value", [[1, 2], torch.tensor(1.0), object(), 2**70], ids=["list", "tensor", "object", "int"]
)
def test_encode_refuses_a_keyword_of_another_type(value: Any) -> None:
    _, gm = _annotated_linear(MinMaxObserver.with_args(eps=value))
    with pytest.raises(UnrepresentableMeta, match=r"'linear'.*keyword 'eps'") as raised:
        encode_annotations(gm)
    assert not isinstance(raised.value, UnknownConstructor)


def _set_output_spec(gm: torch.fx.GraphModule, spec: Any) -> None:
    linear = next(n for n in gm.graph.nodes if n.name == "linear")
    linear.meta[KEY] = QuantizationAnnotation(output_qspec=spec)


def test_encode_refuses_what_it_cannot_state() -> None:
    gm0 = _exported(_Linear(), _linear_inputs())
    other = _exported(_Linear(), _linear_inputs())
    foreign = next(n for n in other.graph.nodes if n.name == "linear")

    class Spec(QuantizationSpec):
        pass

    cases: list[tuple[Callable[[torch.fx.GraphModule], None], str]] = [
        (lambda gm: _set_output_spec(gm, SharedQuantizationSpec(foreign)), "not in the graph"),
        (
            lambda gm: _set_output_spec(
                gm, SharedQuantizationSpec((next(iter(gm.graph.nodes)), foreign))
            ),
            "not in the graph",
        ),
        (
            lambda gm: _set_output_spec(
                gm, Spec(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver)
            ),
            "class",
        ),
        (
            lambda gm: _set_output_spec(
                gm,
                QuantizationSpec(dtype="int8", observer_or_fake_quant_ctr=MinMaxObserver),  # type: ignore[arg-type]
            ),
            "not a torch.dtype",
        ),
        (
            lambda gm: next(iter(gm.graph.nodes)).meta.__setitem__(KEY, {"output_qspec": None}),
            "QuantizationAnnotation",
        ),
    ]
    for build, match in cases:
        gm = copy.deepcopy(gm0)
        build(gm)
        with pytest.raises(UnrepresentableMeta, match=match):
            encode_annotations(gm)


def _valid_message() -> tuple[torch.fx.GraphModule, pb.Annotations]:
    gm0, gm = _annotated_linear(MinMaxObserver.with_args(eps=0.5))
    return gm0, encode_annotations(gm)


def test_apply_refuses_a_class_not_allowed() -> None:
    gm0, msg = _valid_message()
    assert msg.constructors[0].class_name.endswith("MinMaxObserver")
    msg.constructors[0].class_name = "os.system"
    with pytest.raises(UnknownConstructor, match=r"os\.system .*not on the allow-list") as raised:
        apply_annotations(gm0, msg)
    assert raised.value.name == "os.system"
    assert not any(KEY in n.meta for n in gm0.graph.nodes)


def test_apply_refuses_an_unknown_node() -> None:
    gm0, msg = _valid_message()
    msg.nodes[0].node = "no_such_node"
    with pytest.raises(ProgramDecodeError, match="no_such_node"):
        apply_annotations(gm0, msg)
    assert not any(KEY in n.meta for n in gm0.graph.nodes)


def _malformed(msg: pb.Annotations, case: str) -> str:
    """Break ``msg`` as ``case`` says; the text the error must contain."""
    if case == "spec index":
        msg.nodes[0].output_spec = 7
        return "index 7 out of range"
    if case == "constructor index":
        msg.specs[0].quantization.constructor = 5
        return "index 5 out of range"
    if case == "later constructor":
        msg.constructors[1].partial.func = 1
        return "constructor 1: func: index 1 out of range"
    if case == "dtype":
        msg.specs[0].quantization.dtype = "torch.Tensor"
        return "unknown dtype 'torch.Tensor'"
    if case == "qscheme":
        msg.specs[0].quantization.qscheme = "torch.int8"
        return "unknown qscheme"
    if case == "empty constructor":
        msg.constructors.add()
        return "constructor 2: neither"
    if case == "empty spec":
        msg.specs.add()
        return "spec 1: no kind"
    if case == "empty keyword":
        msg.constructors[1].partial.keywords.add(name="x")
        return "keyword 'x': no value"
    if case == "twice":
        msg.nodes.add().CopyFrom(msg.nodes[0])
        return "annotated twice"
    if case == "input":
        msg.nodes[0].inputs.add(input="ghost")
        return "input 'ghost'"
    if case == "edge":
        msg.specs.add(shared=pb.SharedSpec(edge_or_node=pb.EdgeOrNode(node="ghost")))
        return "spec 1: edge_or_node: no node named 'ghost'"
    if case == "quant range":
        msg.specs[0].quantization.quant_min = 10
        msg.specs[0].quantization.quant_max = 1
        return "quant_min 10 must be <= quant_max 1"
    if case == "object":
        other = msg.nodes.add(node="x", object=msg.nodes[0].object)
        other.annotated = not msg.nodes[0].annotated
        return "object 0 is stated differently"
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "spec index",
        "constructor index",
        "later constructor",
        "dtype",
        "qscheme",
        "empty constructor",
        "empty spec",
        "empty keyword",
        "twice",
        "input",
        "edge",
        "quant range",
        "object",
    ],
)
def test_apply_refuses_a_malformed_message(case: str) -> None:
    gm0, msg = _valid_message()
    match = _malformed(msg, case)
    with pytest.raises(ProgramDecodeError) as raised:
        apply_annotations(gm0, msg)
    assert match in str(raised.value)
    assert not any(KEY in n.meta for n in gm0.graph.nodes)
