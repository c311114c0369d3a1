"""The graph blob, read by the ecosystem's own deserializers.

The inverse of :mod:`~remote_partitioner.proto.codec.serializers`. The JSON is checked by
:func:`~remote_partitioner.proto.graph_check.checked_graph_json` before any deserializer sees it.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.export import ExportedProgram

from remote_partitioner.proto.codec.serializers import GET_ATTR_MARKER, LOWERED_MARKER
from remote_partitioner.proto.graph_check import checked_graph_json
from remote_partitioner.proto.program_errors import ProgramDecodeError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

if TYPE_CHECKING:
    from remote_partitioner.proto.codec.decode import Decoder

__all__ = ["deserialize_aten", "deserialize_edge", "memoize_schema_type_hints"]


_SCHEMA_MODULES = frozenset({"torch._export.serde.schema", "executorch.exir.serde.schema"})


def memoize_schema_type_hints() -> None:
    """Make ``typing.get_type_hints`` remember its answer for the export schemas' classes.

    The schema deserializers (``_dict_to_dataclass``, in torch and in ExecuTorch) ask for the
    type hints of a schema class once per *object* they build, and resolving them was half of
    the time it took to read a graph. A class's hints never change, so for the schema modules'
    classes (and only those) they are computed once per process. Installed once; idempotent.
    """
    original = typing.get_type_hints
    if getattr(original, "_remote_partitioner_memo", False):
        return
    memo: dict[tuple[type, int], dict[str, Any]] = {}

    def get_type_hints(
        obj: Any, globalns: Any = None, localns: Any = None, include_extras: bool = False
    ) -> dict[str, Any]:
        if (
            isinstance(obj, type)
            and obj.__module__ in _SCHEMA_MODULES
            and localns is None
            and not include_extras
        ):
            key = (obj, id(globalns))
            hints = memo.get(key)
            if hints is None:
                hints = memo[key] = original(obj, globalns)
            return hints
        return original(obj, globalns, localns, include_extras)

    get_type_hints._remote_partitioner_memo = True  # type: ignore[attr-defined]
    typing.get_type_hints = get_type_hints


def deserialize_aten(
    raw: bytes, state_dict: dict[str, torch.Tensor], constants: dict[str, torch.Tensor]
) -> ExportedProgram:
    from torch._export.serde import serialize as tser

    serialized = tser._dict_to_dataclass(tser.ExportedProgram, checked_graph_json(raw))
    return tser.ExportedProgramDeserializer().deserialize(serialized, state_dict, constants)


def deserialize_edge(
    raw: bytes,
    state_dict: dict[str, torch.Tensor],
    constants: dict[str, torch.Tensor],
    lowered: Mapping[tuple[str, str], pb.LoweredModule],
    module_tensors: Mapping[tuple[str, str], pb.TensorRef],
    decoder: Decoder,
) -> ExportedProgram:
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    from executorch.exir.serde import export_serialize, schema
    from executorch.exir.serde import serialize as eser

    class Deserializer(eser.GraphModuleDeserializer):  # type: ignore[misc,valid-type]
        """exir's deserializer, with lowered modules and get_attr tensors read by reference."""

        def _module_path(self) -> str:
            # Submodule graphs are deserialized into fresh modules; their path is tracked
            # through the stack of graph arguments being read.
            return "." .join(self._path_stack)

        def deserialize_lowered_module(self, arg: Any) -> torch.fx.Node:
            ref = json.loads(arg.arg.value).get(LOWERED_MARKER)
            if not isinstance(ref, dict):
                raise ProgramDecodeError("malformed lowered module reference")
            m = lowered.get((str(ref.get("path")), str(ref.get("name"))))
            if m is None:
                raise ProgramDecodeError(f"lowered module {ref!r} is not in the program")
            original = decoder.program(m.original_program)
            module = LoweredBackendModule(
                original,
                m.backend_id,
                b"",
                [_compile_spec(cs) for cs in m.compile_specs],
            )
            self.module.register_module(m.name, module)
            return self.graph.get_attr(m.name)

        def deserialize_input(self, inp: Any) -> Any:
            if inp.type == "as_string" and inp.value.startswith(GET_ATTR_MARKER):
                ref = json.loads(inp.value[len(GET_ATTR_MARKER):])
                tensor_ref = module_tensors.get((self._module_path(), ref["target"]))
                if tensor_ref is None:
                    raise ProgramDecodeError(f"module tensor {ref!r} is not in the program")
                existing = self._get_attrs.get((id(self.graph), ref["target"]))
                if existing is not None:
                    return existing
                t = decoder.tensor(tensor_ref)
                self.module.register_buffer(ref["target"], t)  # type: ignore[attr-defined]
                node = self.graph.get_attr(ref["target"])
                node.name = ref["name"]
                self._get_attrs[(id(self.graph), ref["target"])] = node
                return node
            if inp.type == "as_graph":
                self._path_stack.append(inp.value.name)
                try:
                    return super().deserialize_input(inp)
                finally:
                    self._path_stack.pop()
            return super().deserialize_input(inp)

    serialized = export_serialize._dict_to_dataclass(
        schema.ExportedProgram, checked_graph_json(raw)
    )
    original_init = Deserializer.__init__

    def init(self: Any) -> None:
        original_init(self)
        self._path_stack = []
        self._get_attrs = {}

    Deserializer.__init__ = init  # type: ignore[method-assign]
    saved = eser.GraphModuleDeserializer
    eser.GraphModuleDeserializer = Deserializer
    try:
        return eser.ExportedProgramDeserializer().deserialize(serialized, state_dict, constants)
    finally:
        eser.GraphModuleDeserializer = saved


def _compile_spec(cs: pb.CompileSpec) -> Any:
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    return CompileSpec(cs.key, bytes(cs.value))
