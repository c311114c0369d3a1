"""The graph blob, read by the ecosystem's own deserializers.

The inverse of :mod:`~remote_partitioner.proto.codec.serializers`. The JSON is checked by
:func:`~remote_partitioner.proto.graph_check.checked_graph_json` before any deserializer sees it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
from torch.export import ExportedProgram

from remote_partitioner.proto.codec.pytree_names import return_type_names
from remote_partitioner.proto.codec.serializers import (
    GET_ATTR_MARKER,
    LOWERED_MARKER,
    edge_metadata_deserializer_class,
)
from remote_partitioner.proto.codec.shared_patch import SharedPatch
from remote_partitioner.proto.graph_check import checked_graph_json
from remote_partitioner.proto.program_errors import ProgramDecodeError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

if TYPE_CHECKING:
    from remote_partitioner.proto.codec.decode import Decoder

__all__ = ["deserialize_aten", "deserialize_edge", "schema_type_hints_memoized"]


_SCHEMA_MODULES = frozenset({"torch._export.serde.schema", "executorch.exir.serde.schema"})

#: Type hints of the schema modules' classes, by (class, id of the globals passed), once per
#: process: a class's hints never change.
_SCHEMA_HINTS: dict[tuple[type, int], dict[str, Any]] = {}
#: (the function replaced, its replacement) while a schema_type_hints_memoized() block runs.
_hints_swap: list[Callable[..., dict[str, Any]]] = []


def _memoized_type_hints(original: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``original`` (``typing.get_type_hints``), answering from :data:`_SCHEMA_HINTS` for the
    export schemas' classes and passing every other call through unchanged."""

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
            hints = _SCHEMA_HINTS.get(key)
            if hints is None:
                hints = _SCHEMA_HINTS[key] = original(obj, globalns)
            return hints
        return original(obj, globalns, localns, include_extras)

    return get_type_hints


def _install_memoized_hints() -> None:
    original = typing.get_type_hints
    installed = _memoized_type_hints(original)
    typing.get_type_hints = installed
    _hints_swap[:] = [original, installed]


def _restore_type_hints() -> None:
    original, installed = _hints_swap
    if typing.get_type_hints is installed:
        typing.get_type_hints = original  # type: ignore[assignment]
    _hints_swap.clear()


_memoized_hints = SharedPatch(_install_memoized_hints, _restore_type_hints)


def schema_type_hints_memoized() -> contextlib.AbstractContextManager[None]:
    """Within the block, ``typing.get_type_hints`` remembers its answer for the export schemas'
    classes; on leaving it (the last of nested or concurrent blocks), the function is the one
    it was before.

    The schema deserializers (``_dict_to_dataclass``, in torch and in ExecuTorch) ask for the
    type hints of a schema class once per *object* they build, and resolving them was half of
    the time it took to read a graph; they find the function as the attribute of the ``typing``
    module, so it is that attribute that is replaced. Only the decoder's deserializing is
    wrapped, so a process that never decodes (a client) never sees ``typing`` patched.

    While a block runs the replacement is visible to every thread of the process; it answers
    like the original, and for a schema class with no ``localns`` and no ``include_extras``
    it returns the one remembered dict, which callers must not mutate (the deserializers only
    read it). If something else replaced ``typing.get_type_hints`` meanwhile, it is left alone.
    """
    return _memoized_hints()


#: Held while exir's module-level GraphModuleDeserializer is replaced (see deserialize_edge).
_exir_deserializer_lock = threading.RLock()


def deserialize_aten(
    raw: bytes, state_dict: dict[str, torch.Tensor], constants: dict[str, torch.Tensor]
) -> ExportedProgram:
    """The ATen program whose export-schema JSON is ``raw``, read by torch's deserializer with
    the given tensors (``raw`` is checked by ``checked_graph_json`` first).

    Raises:
        ProgramDecodeError: ``raw`` is refused by the checks. Whatever torch's deserializer
            raises on a malformed document passes through (the decoder wraps it).
    """
    from torch._export.serde import serialize as tser

    value = checked_graph_json(raw)
    with schema_type_hints_memoized(), return_type_names():
        serialized = tser._dict_to_dataclass(tser.ExportedProgram, value)
        return tser.ExportedProgramDeserializer().deserialize(serialized, state_dict, constants)


def deserialize_edge(
    raw: bytes,
    state_dict: dict[str, torch.Tensor],
    constants: dict[str, torch.Tensor],
    lowered: Mapping[tuple[str, str], pb.LoweredModule],
    module_tensors: Mapping[tuple[str, str], pb.TensorRef],
    decoder: Decoder,
) -> ExportedProgram:
    """The Edge program whose export-schema JSON is ``raw``, read by ExecuTorch's deserializer
    with the given tensors, its lowered modules' original programs decoded by ``decoder`` (or,
    withheld, the decoder's stand-ins) and its ``get_attr`` tensors built by it (``raw`` is
    checked by ``checked_graph_json`` first).

    exir's ``ExportedProgramDeserializer`` builds the module-level ``GraphModuleDeserializer``
    class: it is replaced by a subclass for the call, under a lock (re-entrant: a lowered
    module's program is decoded inside the call), so that concurrent calls do not see each
    other's subclass.

    Raises:
        ProgramDecodeError: ``raw`` is refused by the checks, or names a lowered module or
            module tensor the message does not hold, or a lowered module withholds its
            program where the decoder takes none withheld. Whatever exir's deserializer raises on a
            malformed document passes through (the decoder wraps it).
    """
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    from executorch.exir.serde import export_serialize, schema
    from executorch.exir.serde import serialize as eser

    class Deserializer(edge_metadata_deserializer_class()):  # type: ignore[misc]
        """exir's deserializer, with lowered modules and get_attr tensors read by reference,
        and ``custom`` metadata."""

        def _module_path(self) -> str:
            # Submodule graphs are deserialized into fresh modules; their path is tracked
            # through the stack of graph arguments being read.
            return ".".join(self._path_stack)

        def deserialize_lowered_module(self, arg: Any) -> torch.fx.Node:
            ref = json.loads(arg.arg.value).get(LOWERED_MARKER)
            if not isinstance(ref, dict):
                raise ProgramDecodeError("malformed lowered module reference")
            m = lowered.get((str(ref.get("path")), str(ref.get("name"))))
            if m is None:
                raise ProgramDecodeError(f"lowered module {ref!r} is not in the program")
            compile_specs = [_compile_spec(cs) for cs in m.compile_specs]
            if m.original_withheld:
                module = decoder.withheld_lowered_module(m, compile_specs)
            else:
                original = decoder.program(m.original_program)
                module = LoweredBackendModule(original, m.backend_id, b"", compile_specs)
            self.module.register_module(m.name, module)
            return self.graph.get_attr(m.name)

        def deserialize_node(self, serialized_node: Any, target: Any) -> None:
            # exir names a node that returns several values (a multi-output edge operator,
            # a delegate call with several outputs) by FX's counter, in the order the nodes
            # are read, and ignores the node's name the JSON records; torch's deserializer
            # honours it. Without it, two such nodes of one operator can swap names, and
            # the client's names (the fingerprint, tags, filter answers) would point at
            # the wrong nodes. The first call_function node the call creates (inputs may
            # create get_attr nodes first) is given the recorded name.
            # (A lowered module's program is read while this class is exir's module-level
            # deserializer, so its class derives from this one: name once, in the subclass.)
            name = getattr(serialized_node, "name", None)
            graph = self.graph
            if not name or "create_node" in vars(graph):
                return super().deserialize_node(serialized_node, target)
            create_node = graph.create_node
            named = False

            def create_named(*args: Any, **kwargs: Any) -> torch.fx.Node:
                nonlocal named
                op = args[0] if args else kwargs.get("op")
                if not named and op == "call_function":
                    named = True
                    if len(args) > 4:
                        args = (*args[:4], name, *args[5:])
                    else:
                        kwargs["name"] = name
                return create_node(*args, **kwargs)

            graph.create_node = create_named  # type: ignore[method-assign]
            try:
                super().deserialize_node(serialized_node, target)
            finally:
                del graph.create_node

        def deserialize_input(self, inp: Any) -> Any:
            if inp.type == "as_string" and inp.value.startswith(GET_ATTR_MARKER):
                ref = json.loads(inp.value[len(GET_ATTR_MARKER) :])
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

    value = checked_graph_json(raw)
    with schema_type_hints_memoized(), return_type_names():
        serialized = export_serialize._dict_to_dataclass(schema.ExportedProgram, value)
    original_init = Deserializer.__init__

    def init(self: Any) -> None:
        original_init(self)
        self._path_stack = []
        self._get_attrs = {}

    Deserializer.__init__ = init  # type: ignore[method-assign]
    with _exir_deserializer_lock:
        saved = eser.GraphModuleDeserializer
        eser.GraphModuleDeserializer = Deserializer
        try:
            with schema_type_hints_memoized(), return_type_names():
                return eser.ExportedProgramDeserializer().deserialize(
                    serialized, state_dict, constants
                )
        finally:
            eser.GraphModuleDeserializer = saved


def _compile_spec(cs: pb.CompileSpec) -> Any:
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    return CompileSpec(cs.key, bytes(cs.value))
