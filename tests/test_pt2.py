"""``read_pt2`` reads what ``torch.export.save`` writes into the programs ``torch.export.load``
gives, and refuses what would need unpickling or would turn archive content into code."""

from __future__ import annotations

import copy
import io
import json
import pickle
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir import to_edge_transform_and_lower
from torch.export import Dim, ExportedProgram, export
from torch.export.pt2_archive._package import load_pt2, package_pt2

from remote_partitioner.proto.codec import ProgramDecodeError
from remote_partitioner.server.pt2 import ArchiveError, UnsafeArchiveError, read_pt2

pytestmark = pytest.mark.filterwarnings("ignore")

WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
PROGRAM = "models/model.json"


# --------------------------------------------------------------------------------------------
# Models


class _LinearRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class _Buffers(torch.nn.Module):
    """A persistent buffer, a non-persistent buffer and a lifted tensor constant."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 0.5))
        self.register_buffer("shift", torch.arange(4.0), persistent=False)
        self.const = torch.tensor([1.0, -1.0, 2.0, -2.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale + self.shift + self.const


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(idx))


class _Dynamic(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x).sigmoid() * x.shape[0]


class _Cond(torch.nn.Module):
    """A parameter read in a branch (XNNPACK does not partition inside branches: no Linear)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(
            x.sum() > 0, lambda x: torch.mm(x, self.weight).sin(), lambda x: x.cos(), (x,)
        )


def _export(name: str) -> ExportedProgram:
    torch.manual_seed(0)
    if name == "linear_relu":
        return export(_LinearRelu().eval(), (torch.randn(2, 8),))
    if name == "buffers":
        return export(_Buffers().eval(), (torch.randn(3, 4),))
    if name == "tied":
        return export(_Tied().eval(), (torch.randint(0, 16, (2, 5)),))
    if name == "dynamic":
        batch = Dim("batch", min=2, max=64)
        return export(_Dynamic().eval(), (torch.randn(4, 6),), dynamic_shapes=({0: batch},))
    if name == "cond":
        return export(_Cond().eval(), (torch.randn(2, 4),))
    raise AssertionError(name)


MODELS = ["linear_relu", "buffers", "tied", "dynamic", "cond"]


def _saved(ep: ExportedProgram) -> bytes:
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def archives() -> dict[str, bytes]:
    return {name: _saved(_export(name)) for name in MODELS}


# --------------------------------------------------------------------------------------------
# Round trips


def _same_tensors(got: dict[str, Any], ref: dict[str, Any]) -> None:
    assert list(got) == list(ref)
    for key, r in ref.items():
        g = got[key]
        assert type(g) is type(r), key
        assert g.dtype == r.dtype and g.shape == r.shape and g.stride() == r.stride(), key
        assert g.storage_offset() == r.storage_offset(), key
        assert g.requires_grad == r.requires_grad, key
        assert torch.equal(g.detach(), r.detach()), key
    # the same FQNs share storage
    def groups(d: dict[str, Any]) -> list[list[str]]:
        by_ptr: dict[int, list[str]] = {}
        for k, t in d.items():
            by_ptr.setdefault(t.untyped_storage().data_ptr(), []).append(k)
        return sorted(by_ptr.values())

    assert groups(got) == groups(ref)


def _same_program(got: ExportedProgram, ref: ExportedProgram) -> None:
    assert str(got.graph) == str(ref.graph)
    assert str(got.graph_module.code) == str(ref.graph_module.code)
    assert got.graph_signature == ref.graph_signature
    _same_tensors(dict(got.state_dict), dict(ref.state_dict))
    _same_tensors(dict(got.constants), dict(ref.constants))
    assert {str(k): str(v) for k, v in got.range_constraints.items()} == {
        str(k): str(v) for k, v in ref.range_constraints.items()
    }
    assert got.module_call_graph == ref.module_call_graph
    assert got.verifiers == ref.verifiers
    assert got.example_inputs is None


#: Round trips `make test-fast` leaves out (a few seconds each; `make test` runs them).
SLOW_MODELS = ("cond", "dynamic", "buffers", "tied")


def _lowered(ep: ExportedProgram) -> bytes:
    manager = to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[XnnpackPartitioner()])
    return bytes(manager.to_executorch().buffer)


@pytest.mark.parametrize(
    "name", [pytest.param(m, marks=pytest.mark.slow if m in SLOW_MODELS else ()) for m in MODELS]
)
def test_round_trip_matches_torch_export_load(archives: dict[str, bytes], name: str) -> None:
    data = archives[name]
    programs = read_pt2(data)
    assert list(programs) == ["model"]
    got = programs["model"]
    ref = torch.export.load(io.BytesIO(data))
    _same_program(got, ref)
    assert _lowered(got) == _lowered(ref)


class _Layouts(torch.nn.Module):
    """An empty buffer, views of one buffer, a transposed parameter, bfloat16, a ModuleList."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("empty", torch.zeros(0, 3))
        self.register_buffer("base", torch.arange(12.0))
        self.t = torch.nn.Parameter(torch.randn(4, 4).t())
        self.bf16 = torch.nn.Parameter(torch.randn(4).to(torch.bfloat16), requires_grad=False)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.empty.sum() + self.base[:4] + self.base.view(3, 4)[1]
        y = y @ self.t + self.bf16.float()
        for layer in self.layers:
            y = layer(y)
        return y


def test_layouts_round_trip() -> None:
    data = _saved(export(_Layouts(), (torch.randn(2, 4),)))
    got = read_pt2(data)["model"]
    ref = torch.export.load(io.BytesIO(data))
    _same_program(got, ref)
    x = torch.randn(2, 4)
    assert torch.equal(got.module()(x), ref.module()(x))


def test_tied_weights_share_storage(archives: dict[str, bytes]) -> None:
    got = read_pt2(archives["tied"])["model"]
    params = [t for t in got.state_dict.values() if isinstance(t, torch.nn.Parameter)]
    assert params and all(p.requires_grad for p in params)
    ptrs = {t.untyped_storage().data_ptr() for t in got.state_dict.values()}
    assert len(ptrs) == 1  # embed.weight and head.weight are one tensor


def test_memoryview_and_several_programs() -> None:
    eps = {"first": _export("linear_relu"), "second": _export("buffers")}
    buf = io.BytesIO()
    package_pt2(buf, exported_programs=eps)
    programs = read_pt2(memoryview(buf.getvalue()))
    assert sorted(programs) == ["first", "second"]
    ref = load_pt2(io.BytesIO(buf.getvalue())).exported_programs
    for name in eps:
        _same_program(programs[name], ref[name])


def test_reads_without_any_unpickling(
    archives: dict[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    monkeypatch.setattr(torch._C, "_pickle_load_obj", refuse)
    for data in archives.values():
        assert read_pt2(data)["model"].example_inputs is None
    with pytest.raises(AssertionError, match="unpickled"):  # the patches do catch torch's reader
        torch.export.load(io.BytesIO(archives["linear_relu"]))


# --------------------------------------------------------------------------------------------
# Crafting archives


def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, value in members.items():
            z.writestr(name, value)
    return buf.getvalue()


def _edit(data: bytes, edits: dict[str, Callable[[bytes], bytes | None]]) -> bytes:
    """The archive with members (named without the root folder) rewritten by their edit
    function; None removes the member."""
    out: dict[str, bytes] = {}
    for name, value in _members(data).items():
        _, _, rest = name.partition("/")
        if rest in edits:
            new = edits[rest](value)
            if new is not None:
                out[name] = new
        else:
            out[name] = value
    return _zip(out)


def _edit_json(fn: Callable[[Any], None]) -> Callable[[bytes], bytes]:
    def edit(raw: bytes) -> bytes:
        value = json.loads(raw)
        fn(value)
        return json.dumps(value).encode()

    return edit


def _walk(value: Any) -> Iterator[dict[str, Any]]:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            yield v
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


class _CreatesFile:
    """Unpickling this creates ``path`` (``open(path, "w")``)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.path), "w"))


def _with_program(data: bytes, fn: Callable[[Any], None]) -> bytes:
    return _edit(data, {PROGRAM: _edit_json(fn)})


# --------------------------------------------------------------------------------------------
# Pickles


def test_pickled_weight_is_refused_and_never_loaded(
    archives: dict[str, bytes], tmp_path: Path
) -> None:
    touched = tmp_path / "touched"

    def to_pickle(config: Any) -> None:
        config["config"]["fc.weight"]["use_pickle"] = True

    path_name = json.loads(_members(archives["linear_relu"])[f"archive/{WEIGHTS_CONFIG}"])[
        "config"]["fc.weight"]["path_name"]
    data = _edit(archives["linear_relu"], {
        WEIGHTS_CONFIG: _edit_json(to_pickle),
        f"data/weights/{path_name}": lambda _: pickle.dumps(_CreatesFile(touched)),
    })
    with pytest.raises(UnsafeArchiveError, match=rf"data/weights/{path_name}.*'fc.weight'"):
        read_pt2(data)
    assert not touched.exists()
    # the archive is what it claims: torch's own reader runs the pickle
    with pytest.raises(Exception):  # noqa: B017 - the unpickled object is not a tensor
        torch.export.load(io.BytesIO(data))
    assert touched.exists()


@pytest.mark.parametrize("prefix", ["custom_obj_", "opaque_obj_"])
def test_custom_and_opaque_objects_are_refused(
    archives: dict[str, bytes], tmp_path: Path, prefix: str
) -> None:
    touched = tmp_path / "touched"

    def add_object(config: Any) -> None:
        config["config"]["obj"] = {
            "path_name": f"{prefix}0", "is_param": False, "use_pickle": True, "tensor_meta": None,
        }

    members = _members(_edit(archives["buffers"], {CONSTANTS_CONFIG: _edit_json(add_object)}))
    members[f"archive/data/constants/{prefix}0"] = pickle.dumps(_CreatesFile(touched))
    with pytest.raises(UnsafeArchiveError, match=rf"data/constants/{prefix}0.*'obj'"):
        read_pt2(_zip(members))
    assert not touched.exists()


def test_legacy_pt_weights_are_refused(archives: dict[str, bytes], tmp_path: Path) -> None:
    members = _members(archives["linear_relu"])
    members["archive/data/weights/model.pt"] = pickle.dumps(_CreatesFile(tmp_path / "touched"))
    with pytest.raises(UnsafeArchiveError, match=r"data/weights/model\.pt"):
        read_pt2(_zip(members))
    assert not (tmp_path / "touched").exists()


def test_pre_pt2_archive_is_refused() -> None:
    data = _zip({"serialized_exported_program.json": b"{}", "serialized_state_dict.pt": b"x"})
    with pytest.raises(UnsafeArchiveError, match=r"serialized_state_dict\.pt"):
        read_pt2(data)


# --------------------------------------------------------------------------------------------
# Program JSON that would be code


def test_non_operator_target_is_refused(archives: dict[str, bytes]) -> None:
    def to_system(program: Any) -> None:
        program["graph_module"]["graph"]["nodes"][0]["target"] = "os.system"

    with pytest.raises(ArchiveError, match=r"os\.system") as info:
        read_pt2(_with_program(archives["linear_relu"], to_system))
    assert isinstance(info.value.__cause__, ProgramDecodeError)


def test_operator_argument_naming_a_function_is_refused(archives: dict[str, bytes]) -> None:
    def add_operator_argument(program: Any) -> None:
        node = program["graph_module"]["graph"]["nodes"][0]
        node["inputs"].append({"name": "fn", "arg": {"as_operator": "torch.load"}, "kind": 1})

    with pytest.raises(ArchiveError, match=r"torch\.load"):
        read_pt2(_with_program(archives["linear_relu"], add_operator_argument))


def test_symbolic_expression_is_never_evaluated(archives: dict[str, bytes], tmp_path: Path) -> None:
    touched = tmp_path / "touched"

    def inject(program: Any) -> None:
        values = program["graph_module"]["graph"]["tensor_values"]
        values["x"]["sizes"][0] = {"as_expr": {
            "expr_str": f"__import__('os').system('touch {touched}')", "hint": {"as_int": 2},
        }}

    with pytest.raises(ArchiveError, match="symbolic expression"):
        read_pt2(_with_program(archives["linear_relu"], inject))
    assert not touched.exists()


def test_symbolic_expression_must_be_a_string(archives: dict[str, bytes]) -> None:
    def inject(program: Any) -> None:  # sympify would eval each string of a list
        values = program["graph_module"]["graph"]["tensor_values"]
        values["x"]["sizes"][0] = {"as_expr": {"expr_str": ["1"], "hint": {"as_int": 2}}}

    with pytest.raises(ArchiveError, match=r"export schema|is not a string"):
        read_pt2(_with_program(archives["linear_relu"], inject))


def test_graph_input_name_is_never_code(archives: dict[str, bytes], tmp_path: Path) -> None:
    """FX writes placeholder names into ``def forward(...)`` and execs it."""
    touched = tmp_path / "touched"
    evil = f"x=__import__('os').system('touch {touched}')"

    def rename(program: Any) -> None:
        for d in _walk(program):
            for key in ("name", "as_name"):
                if d.get(key) == "x":
                    d[key] = evil
        values = program["graph_module"]["graph"]["tensor_values"]
        values[evil] = values.pop("x")

    with pytest.raises(ArchiveError, match="not a Python identifier"):
        read_pt2(_with_program(archives["linear_relu"], rename))
    assert not touched.exists()


def test_attribute_path_with_quotes_is_refused(archives: dict[str, bytes]) -> None:
    """FX writes non-identifier parts of attribute paths into ``getattr(self, "...")``."""
    evil = 'fc.x"),__import__("os").system("true"),getattr(self,"y'

    def rename(program: Any) -> None:
        for d in _walk(program):
            if d.get("parameter_name") == "fc.weight":
                d["parameter_name"] = evil

    with pytest.raises(ArchiveError, match="attribute path"):
        read_pt2(_with_program(archives["linear_relu"], rename))


def test_forward_arg_names_are_identifiers(archives: dict[str, bytes]) -> None:
    def rename(program: Any) -> None:
        for d in _walk(program):
            if d.get("forward_arg_names"):
                d["forward_arg_names"][0] = "x=print('hi')"

    with pytest.raises(ArchiveError, match="forward_arg_names"):
        read_pt2(_with_program(archives["linear_relu"], rename))


def _in_spec_entry(program: Any) -> dict[str, Any]:
    return next(
        d for d in _walk(program) if isinstance(d.get("in_spec"), str) and d["in_spec"]
    )


def test_in_spec_keyword_names_are_not_code(archives: dict[str, bytes]) -> None:
    """``module()`` writes the keyword names of ``in_spec`` into ``{'name': ...}`` code."""
    def add_kwarg(program: Any) -> None:
        signature = _in_spec_entry(program)
        _, root = json.loads(signature["in_spec"])
        leaf = {"type": None, "context": None, "children_spec": []}
        root["children_spec"][1]["context"] = json.dumps(["y':__import__('os'),'z"])
        root["children_spec"][1]["children_spec"] = [leaf]
        signature["in_spec"] = json.dumps([1, root])

    with pytest.raises(ArchiveError, match="in_spec key"):
        read_pt2(_with_program(archives["linear_relu"], add_kwarg))


@pytest.fixture
def evil_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """An importable module whose import creates a file."""
    touched = tmp_path / "imported"
    (tmp_path / "pt2_evil_module.py").write_text(
        f"import enum\nopen({str(touched)!r}, 'w').close()\n"
        "class E(enum.Enum):\n    A = 1\n"
        "factory = list\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "pt2_evil_module", raising=False)
    return "pt2_evil_module", touched


def test_treespec_enum_key_is_never_imported(
    archives: dict[str, bytes], evil_module: tuple[str, Path]
) -> None:
    module, touched = evil_module

    def enum_key(program: Any) -> None:
        signature = _in_spec_entry(program)
        _, root = json.loads(signature["in_spec"])
        leaf = {"type": None, "context": None, "children_spec": []}
        root["children_spec"][1]["context"] = json.dumps(
            [{"__enum__": True, "fqn": f"{module}:E", "name": "A"}]
        )
        root["children_spec"][1]["children_spec"] = [leaf]
        signature["in_spec"] = json.dumps([1, root])

    data = _with_program(archives["linear_relu"], enum_key)
    with pytest.raises(ArchiveError, match="enum keys"):
        read_pt2(data)
    assert not touched.exists()
    # torch's reader imports it
    spec = _in_spec_entry(json.loads(_members(data)[f"archive/{PROGRAM}"]))["in_spec"]
    torch.utils._pytree.treespec_loads(spec)
    assert touched.exists()


def test_treespec_defaultdict_factory_is_never_imported(
    archives: dict[str, bytes], evil_module: tuple[str, Path]
) -> None:
    module, touched = evil_module

    def factory(program: Any) -> None:
        signature = program["graph_module"]["module_call_graph"][0]["signature"]
        _, root = json.loads(signature["out_spec"])
        signature["out_spec"] = json.dumps([1, {
            "type": "collections.defaultdict",
            "context": {"default_factory_module": module, "default_factory_name": "factory",
                        "dict_context": ["k"]},
            "children_spec": [root],
        }])

    with pytest.raises(ArchiveError, match="defaultdict"):
        read_pt2(_with_program(archives["linear_relu"], factory))
    assert not touched.exists()


class _Related(torch.nn.Module):
    """Two dynamic sizes in a relation torch records as ``guards_code``."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        torch._check(x.shape[0] == y.shape[0] + 1)
        return x[1:] + y


def test_shape_guards_are_kept() -> None:
    ep = export(
        _Related(), (torch.randn(5, 3), torch.randn(4, 3)),
        dynamic_shapes=({0: Dim.AUTO}, {0: Dim.AUTO}),
    )
    data = _saved(ep)
    got = read_pt2(data)["model"]
    ref = torch.export.load(io.BytesIO(data))
    assert ref._guards_code and got._guards_code == ref._guards_code
    _same_program(got, ref)


@pytest.mark.parametrize(
    "guard",
    [
        "__import__('os').system('true')",
        "L['x'].size()[0] == 2 or exec('1')",
        "L['x'].__class__",
        "L['x\\'].size()[0] == 1",
        "L['x'].size()[0] == (lambda: 1)()",
        "math.pi.hex()",
    ],
)
def test_guards_code_other_than_shape_guards_is_refused(
    archives: dict[str, bytes], guard: str
) -> None:
    def add_guard(program: Any) -> None:
        program["guards_code"] = ["L['x'].size()[0] >= 2", guard]

    with pytest.raises(UnsafeArchiveError, match="guards_code"):
        read_pt2(_with_program(archives["linear_relu"], add_guard))


# --------------------------------------------------------------------------------------------
# Zip and payload checks


@pytest.mark.parametrize(
    "member", ["archive/../evil", "../evil", "/etc/evil", "archive\\..\\evil", "C:/evil"]
)
def test_path_traversal_member_is_refused(archives: dict[str, bytes], member: str) -> None:
    members = _members(archives["linear_relu"])
    members[member] = b"x"
    with pytest.raises(ArchiveError, match="path traversal"):
        read_pt2(_zip(members))


@pytest.mark.parametrize("cut", [0, 10, 200, -30])
def test_truncated_or_not_zip_is_refused(archives: dict[str, bytes], cut: int) -> None:
    with pytest.raises(ArchiveError):
        read_pt2(archives["linear_relu"][:cut])


def test_not_zip_is_refused() -> None:
    with pytest.raises(ArchiveError, match="not a zip"):
        read_pt2(b"PK\x03\x04 this is not a zip at all")


def test_limits(archives: dict[str, bytes]) -> None:
    data = archives["linear_relu"]
    with pytest.raises(ArchiveError, match="members"):
        read_pt2(data, max_members=3)
    with pytest.raises(ArchiveError, match="uncompressed bytes"):
        read_pt2(data, max_uncompressed_bytes=1000)
    assert read_pt2(data, max_uncompressed_bytes=len(data) * 2)


def test_declared_size_bounds_a_zip_bomb() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/archive_format", b"pt2")
        z.writestr("archive/big", b"\0" * (64 << 20))
    with pytest.raises(ArchiveError, match="uncompressed bytes"):
        read_pt2(buf.getvalue(), max_uncompressed_bytes=1 << 20)


def _edit_weight(name: str, fn: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    return _edit_json(lambda config: fn(config["config"][name]["tensor_meta"]))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m["sizes"].__setitem__(0, {"as_int": 1000}), "beyond"),
        (lambda m: m.__setitem__("storage_offset", {"as_int": 31}), "beyond"),
        (lambda m: m["strides"].__setitem__(0, {"as_int": 9}), "beyond"),
        (lambda m: m["strides"].__setitem__(0, {"as_int": -8}), "non-negative"),
        (lambda m: m["sizes"].pop(), "sizes but"),
        (lambda m: m["sizes"].__setitem__(0, {"as_expr": {"expr_str": "s0"}}), "non-negative"),
        (lambda m: m.__setitem__("dtype", 99), "ScalarType"),
        (lambda m: m.__setitem__("dtype", "7"), "ScalarType"),
        (lambda m: m.__setitem__("dtype", 8), "beyond"),  # float64: twice the payload's bytes
    ],
)
def test_weight_config_beyond_payload_is_refused(
    archives: dict[str, bytes], change: Callable[[dict[str, Any]], None], message: str
) -> None:
    data = _edit(archives["linear_relu"], {WEIGHTS_CONFIG: _edit_weight("fc.weight", change)})
    with pytest.raises(ArchiveError, match=message):
        read_pt2(data)


def test_aliases_of_one_payload_must_agree_on_dtype(archives: dict[str, bytes]) -> None:
    config = json.loads(_members(archives["tied"])[f"archive/{WEIGHTS_CONFIG}"])["config"]
    assert len({meta["path_name"] for meta in config.values()}) == 1 < len(config)
    last = list(config)[-1]
    data = _edit(archives["tied"], {
        WEIGHTS_CONFIG: _edit_weight(last, lambda m: m.__setitem__("dtype", 8)),  # float64
    })
    with pytest.raises(ArchiveError, match="differs"):
        read_pt2(data)


def test_short_payload_is_refused(archives: dict[str, bytes]) -> None:
    config = json.loads(_members(archives["linear_relu"])[f"archive/{WEIGHTS_CONFIG}"])
    path_name = config["config"]["fc.weight"]["path_name"]
    data = _edit(archives["linear_relu"], {f"data/weights/{path_name}": lambda b: b[:-4]})
    with pytest.raises(ArchiveError, match="beyond"):
        read_pt2(data)
    data = _edit(archives["linear_relu"], {f"data/weights/{path_name}": lambda b: b[:-1]})
    with pytest.raises(ArchiveError, match="multiple of element size"):
        read_pt2(data)


def test_empty_payload_of_huge_tensor_is_bounded(archives: dict[str, bytes]) -> None:
    config = json.loads(_members(archives["linear_relu"])[f"archive/{WEIGHTS_CONFIG}"])
    path_name = config["config"]["fc.weight"]["path_name"]

    def huge(meta: dict[str, Any]) -> None:
        meta["sizes"] = [{"as_int": 1 << 20}, {"as_int": 1 << 20}]

    data = _edit(archives["linear_relu"], {
        WEIGHTS_CONFIG: _edit_weight("fc.weight", huge),
        f"data/weights/{path_name}": lambda _: b"",
    })
    with pytest.raises(ArchiveError, match="zero bytes"):
        read_pt2(data, max_uncompressed_bytes=1 << 24)


@pytest.mark.parametrize("path_name", ["../constants/tensor_0", "/etc/passwd", ".."])
def test_payload_names_are_plain(archives: dict[str, bytes], path_name: str) -> None:
    def rename(config: Any) -> None:
        config["config"]["fc.weight"]["path_name"] = path_name

    data = _edit(archives["linear_relu"], {WEIGHTS_CONFIG: _edit_json(rename)})
    with pytest.raises(ArchiveError, match="payload name"):
        read_pt2(data)


@pytest.mark.parametrize(
    "member", [WEIGHTS_CONFIG, CONSTANTS_CONFIG, "archive_format", "archive_version"]
)
def test_missing_files_are_refused(archives: dict[str, bytes], member: str) -> None:
    data = _edit(archives["linear_relu"], {member: lambda _: None})
    with pytest.raises(ArchiveError):
        read_pt2(data)


def test_bad_configs_are_refused(archives: dict[str, bytes]) -> None:
    for bad in (b"not json", b"[]", b'{"config": {"fc.weight": {"path_name": 3}}}'):
        data = _edit(archives["linear_relu"], {WEIGHTS_CONFIG: lambda _, bad=bad: bad})
        with pytest.raises(ArchiveError):
            read_pt2(data)


def test_no_program_is_refused(archives: dict[str, bytes]) -> None:
    with pytest.raises(ArchiveError, match="no exported program"):
        read_pt2(_edit(archives["linear_relu"], {PROGRAM: lambda _: None}))
