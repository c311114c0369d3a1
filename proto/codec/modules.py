"""A client's unlifted ``GraphModule`` across the wire (the edits a quantizer makes to it:
:mod:`.module_edits`).

A torchao PT2E ``Quantizer`` sees an unlifted ``torch.fx.GraphModule`` (what
``ExportedProgram.module()`` returns, usually already rewritten by ``prepare_pt2e``'s
``_fuse_conv_bn_``): parameters and buffers are ``get_attr`` nodes, user inputs are
placeholders, the code is pytree code, and a ``call_module`` ``_guards_fn`` node may follow the
placeholders. To run a hosted quantizer on it:

* the client lifts a deep copy into an ATen ``ExportedProgram`` (:func:`lift_module`) which the
  program codec carries as it is, plus an ``UnliftTable`` saying how to undo the lift;
* the server decodes the program and rebuilds the client's module (:func:`unlift_program`),
  checked against the client's :func:`module_fingerprint`;
* the server takes a ``ModuleSnapshot`` (:mod:`.module_edits`) before each quantizer step
  and states what the step changed as ``GraphEdits`` (``ModuleSnapshot.edits``): new
  tensors, inserted ``get_attr`` nodes, changed arguments, erased nodes -- and refuses
  anything else
  (:class:`UnrepresentableMeta`);
* the client applies the edits to its own module, in place (``apply_edits``), and checks
  that its fingerprint then equals the server's. The client's module is never replaced, so
  its node metadata that does not cross (``seq_nr``, ``original_aten``, ``example_value``,
  ``from_node``) and its objects' identity are kept.

Nothing here evaluates or imports anything named on the wire: ``get_attr`` targets are
attribute paths on the module being rebuilt or edited, checked to be dotted identifiers
(no dunder parts), and the server's ``_guards_fn`` is an inert module.
"""

from __future__ import annotations

import copy
import hashlib
import json
import keyword
from collections.abc import Iterator
from typing import Any

import torch
import torch.fx
from torch._export.verifier import TrainingIRVerifier
from torch.export import ExportedProgram
from torch.export.exported_program import ModuleCallEntry, ModuleCallSignature
from torch.export.graph_signature import (
    ConstantArgument,
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    SymIntArgument,
    TensorArgument,
)

from remote_partitioner.proto.codec.graphs import target_name
from remote_partitioner.proto.program_errors import (
    CodecError,
    FingerprintMismatch,
    ProgramDecodeError,
    ProgramEncodeError,
)
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = [
    "AbsentAttribute",
    "EditConflict",
    "InertGuards",
    "lift_module",
    "module_fingerprint",
    "unlift_program",
]

#: The name ``.module()`` gives the guards function's submodule (and its ``call_module`` node).
GUARDS_NAME = "_guards_fn"
#: The one meta key a quantizer step may add or change freely (the annotations cross apart).
ANNOTATION_KEY = "quantization_annotation"


class EditConflict(CodecError, ValueError):
    """``GraphEdits`` cannot be applied to this module: a tensor's target is already taken, or
    an inserted node did not get its name."""


class InertGuards(torch.nn.Module):
    """The server's stand-in for the client's ``_guards_fn``: no code from the wire, it checks
    nothing and returns ``None`` (the client's guards checked the inputs, not the graph)."""

    def forward(self, *args: Any) -> None:
        return None


class AbsentAttribute:
    """The value of a top-level attribute the client's module has and the rebuilt one would
    not (``UnliftTable.attribute_names``): present so that ``hasattr`` answers as on the client
    (a quantizer picking a free name picks the client's), and never meant to be used."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"AbsentAttribute({self.name!r})"


# --------------------------------------------------------------------------------------------
# Fingerprint


def _literal(value: Any) -> list[Any]:
    """A node argument as JSON: nodes by name, containers recursively, literals by type+repr."""
    if isinstance(value, torch.fx.Node):
        return ["node", value.name]
    if isinstance(value, (list, tuple)):
        return [type(value).__name__, [_literal(v) for v in value]]
    if isinstance(value, dict):
        return ["dict", [[_literal(k), _literal(v)] for k, v in value.items()]]
    if isinstance(value, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)) or (
        callable(value) and not isinstance(value, type) and hasattr(value, "__qualname__")
    ):
        return ["callable", target_name(value)]
    kind = type(value)
    return [f"{kind.__module__}.{kind.__qualname__}", repr(value)]


def _node_entry(node: torch.fx.Node) -> list[Any]:
    target = target_name(node.target) if node.op == "call_function" else str(node.target)
    return [node.op, node.name, target, _literal(node.args), _literal(node.kwargs)]


def _tensor_entries(gm: torch.nn.Module) -> list[list[Any]]:
    """The module's registered parameters and buffers, sorted by name: (name, kind,
    persistent, dtype, shape)."""
    out: list[list[Any]] = []
    for name, kind, persistent, t in _registered_tensors(gm):
        out.append([name, kind, persistent, str(t.dtype), [str(s) for s in t.shape]])
    return sorted(out)


def _registered_tensors(gm: torch.nn.Module) -> Iterator[tuple[str, str, bool, torch.Tensor]]:
    """(fqn, "parameter" | "buffer", persistent, tensor) of every registered tensor, shared
    ones at each of their names, in ``named_modules`` order then registration order."""
    for prefix, mod in gm.named_modules(remove_duplicate=False):
        dot = f"{prefix}." if prefix else ""
        for name, p in mod._parameters.items():
            if p is not None:
                yield dot + name, "parameter", True, p
        for name, b in mod._buffers.items():
            if b is not None:
                yield dot + name, "buffer", name not in mod._non_persistent_buffers_set, b


def module_fingerprint(gm: torch.fx.GraphModule) -> str:
    """The module's structure as a hex SHA-256, the same in every process.

    It covers ``gm.graph``'s nodes in order -- op, name, target (the qualified operator name
    for ``call_function``, the string for the other ops), args and kwargs (nodes by name,
    literals by type and ``repr``, callables by qualified name) -- and the module's registered
    parameters and buffers (name, parameter or buffer, persistent, dtype, shape; sorted by
    name). Node metadata and tensor values are not covered.
    """
    doc = [[_node_entry(n) for n in gm.graph.nodes], _tensor_entries(gm)]
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _fingerprint_problem(gm: torch.fx.GraphModule, expected: str, what: str) -> str | None:
    actual = module_fingerprint(gm)
    if actual == expected:
        return None
    nodes = len(gm.graph.nodes)
    tensors = len(_tensor_entries(gm))
    return (
        f"{what} differs from the fingerprint it should have: {actual} instead of {expected} "
        f"(it has {nodes} nodes and {tensors} registered tensors; the fingerprint covers node "
        "order, names, ops, targets and arguments, and the registered tensors' names, kinds, "
        "dtypes and shapes)"
    )


# --------------------------------------------------------------------------------------------
# Attribute paths


def _check_path(path: str, what: str, error: type[Exception] = ProgramDecodeError) -> list[str]:
    """``path`` split at dots, each part an identifier that is not a keyword or a dunder, or
    the decimal index of a container's child (``layers.0.weight``: ``nn.Sequential``,
    ``ModuleList``, ``ParameterList``)."""
    parts = path.split(".")
    for part in parts:
        if part.isascii() and part.isdigit():
            continue
        if (
            not part.isidentifier()
            or keyword.iskeyword(part)
            or (part.startswith("__") and part.endswith("__"))
        ):
            raise error(f"{what}: {path!r} is not an attribute path")
    return parts


def _owner(root: torch.nn.Module, parts: list[str], create: bool) -> torch.nn.Module | None:
    """The submodule holding attribute ``parts[-1]``; created (as ``torch.nn.Module``) when
    ``create``, else None if absent."""
    mod = root
    for part in parts[:-1]:
        child = mod._modules.get(part)
        if child is None:
            if not create or hasattr(mod, part):
                return None
            child = torch.nn.Module()
            mod.add_module(part, child)
        mod = child
    return mod


def _tensor_kind(root: torch.nn.Module, target: str) -> tuple[str, bool, torch.Tensor] | None:
    """(kind, persistent, tensor) of the parameter, buffer or plain tensor attribute
    ("constant": what ``.module()`` makes of a constant torch.export lifted) at ``target``,
    else None."""
    mod = _owner(root, target.split("."), create=False)
    if mod is None:
        return None
    field = target.rsplit(".", 1)[-1]
    p = mod._parameters.get(field)
    if p is not None:
        return "parameter", True, p
    b = mod._buffers.get(field)
    if b is not None:
        return "buffer", field not in mod._non_persistent_buffers_set, b
    c = vars(mod).get(field)
    if isinstance(c, torch.Tensor) and not isinstance(c, torch.nn.Parameter):
        return "constant", False, c
    return None


# --------------------------------------------------------------------------------------------
# Lift (client)

#: The program input a lifted attribute of each kind (:func:`_tensor_kind`) becomes.
_INPUT_KINDS = {
    "parameter": InputKind.PARAMETER,
    "buffer": InputKind.BUFFER,
    "constant": InputKind.CONSTANT_TENSOR,
}


def _attribute_names(gm: torch.nn.Module) -> list[str]:
    names = [*gm._parameters, *gm._buffers, *gm._modules]
    names += [k for k in vars(gm) if not k.startswith("__")]
    return sorted(set(names))


def _argument_of(node: torch.fx.Node) -> TensorArgument | SymIntArgument:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return TensorArgument(name=node.name)
    if isinstance(val, torch.SymInt):
        return SymIntArgument(name=node.name)
    raise ProgramEncodeError(
        f"node {node.name!r} ({node.op}): cannot lift, its meta 'val' is "
        f"{type(val).__name__}, not a tensor or SymInt"
    )


def _range_constraints(gm: torch.fx.GraphModule) -> dict[Any, Any]:
    existing = getattr(gm, "range_constraints", None)
    if isinstance(existing, dict):
        return dict(existing)
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode(tuple(n.meta.get("val") for n in gm.graph.nodes))
    shape_env = getattr(fake_mode, "shape_env", None)
    out: dict[Any, Any] = {}
    if shape_env is None:
        return out
    for n in gm.graph.find_nodes(op="placeholder"):
        val = n.meta.get("val")
        sizes = list(val.shape) if isinstance(val, torch.Tensor) else [val]
        for s in sizes:
            if isinstance(s, torch.SymInt):
                for sym in s.node.expr.free_symbols:
                    if sym in shape_env.var_to_range:
                        out[sym] = shape_env.var_to_range[sym]
    return out


def lift_module(gm: torch.fx.GraphModule) -> tuple[ExportedProgram, pb.UnliftTable]:
    """Lift a deep copy of ``gm`` (``gm`` itself is untouched) into an ATen ExportedProgram
    the program codec carries, and the table that undoes the lift.

    * Every ``get_attr`` node reading a parameter or buffer becomes a placeholder of the same
      name before the user inputs (``InputSpec`` PARAMETER / BUFFER with the attribute's FQN and
      persistent flag); the table's ``LiftedAttr`` records the node it followed in ``gm``. A
      ``get_attr`` of a plain tensor attribute (a constant torch.export lifted, which
      ``.module()`` sets as one: ``lifted_tensor_0``) becomes a CONSTANT_TENSOR placeholder,
      its tensor one of the program's ``constants``.
    * Registered tensors no ``get_attr`` node reads become unused placeholders (after the
      lifted ones; named ``_unused_<fqn>``, made unique), absent from the table: the server
      registers them and adds no node.
    * A ``call_module`` ``_guards_fn`` node is dropped and recorded as the table's
      ``GuardsCall`` (its ``_is_impure`` is the guards submodule's).
    * A user input whose placeholder comes after a ``call_function`` node in ``gm`` (a pass
      put a node between the placeholders) is recorded as a ``MovedInput`` with the node it
      followed: the program holds its inputs before its other nodes.
    * The output becomes a plain tuple; the program's in/out specs are ``gm``'s
      ``_in_spec``/``_out_spec``, its ``forward_arg_names`` the pytree code's argument names,
      its range constraints ``gm.range_constraints`` (else those of the symbols in the
      placeholders' ``val``).

    The table also holds ``gm``'s top-level attribute names (``_parameters``, ``_buffers``,
    ``_modules`` keys and instance attributes) and :func:`module_fingerprint` of ``gm``.

    Raises:
        ProgramEncodeError: naming the node, for anything that cannot be lifted: another
            ``call_module``, a ``get_attr`` of anything but a registered tensor, a placeholder
            or output that is not a tensor or SymInt, tensor mutations.
    """
    in_spec = getattr(gm, "_in_spec", None)
    out_spec = getattr(gm, "_out_spec", None)
    if in_spec is None:
        raise ProgramEncodeError("the module has no pytree input spec (_in_spec): not unlifted")
    # A deep copy of everything but the tensors (shared, not copied: the program reads them).
    # GraphModule's deepcopy loses non-persistent flags: kinds come from gm itself.
    memo: dict[int, Any] = {id(t): t for _, _, _, t in _registered_tensors(gm)}
    source = copy.deepcopy(gm, memo)
    table = pb.UnliftTable(
        attribute_names=_attribute_names(gm), fingerprint=module_fingerprint(gm)
    )
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    used = {n.name for n in source.graph.nodes}
    attr_specs: list[InputSpec] = []
    user_specs: list[InputSpec] = []
    state_dict: dict[str, torch.Tensor] = {}
    constants: dict[str, Any] = {}
    read: set[str] = set()
    previous = ""
    nodes = list(source.graph.nodes)

    def add_tensor(kind: str, persistent: bool, target: str, t: torch.Tensor) -> None:
        if kind == "constant" or (kind == "buffer" and not persistent):
            constants[target] = t
        else:
            state_dict[target] = t

    def spec(kind: str, persistent: bool, name: str, target: str) -> InputSpec:
        return InputSpec(
            kind=_INPUT_KINDS[kind],
            arg=TensorArgument(name=name),
            target=target,
            persistent=persistent if kind == "buffer" else None,
        )

    # Lifted tensors first, in gm's order.
    for node in nodes:
        if node.op != "get_attr":
            continue
        target = str(node.target)
        found = _tensor_kind(gm, target)
        if found is None:
            raise ProgramEncodeError(
                f"node {node.name!r}: get_attr {target!r} does not read a registered parameter "
                "or buffer or a tensor attribute"
            )
        if target in read:
            raise ProgramEncodeError(f"node {node.name!r}: {target!r} is read by two nodes")
        read.add(target)
        kind, persistent, t = found
        p = graph.create_node("placeholder", node.name, name=node.name)
        p.meta = copy.copy(node.meta)
        env[node] = p
        attr_specs.append(spec(kind, persistent, node.name, target))
        add_tensor(kind, persistent, target, t)
    for fqn, kind, persistent, t in _registered_tensors(gm):
        if fqn in read or fqn in state_dict or fqn in constants:
            continue
        base = "_unused_" + fqn.replace(".", "_")
        name, i = base, 0
        while name in used:
            i += 1
            name = f"{base}_{i}"
        used.add(name)
        p = graph.create_node("placeholder", name, name=name)
        from torch._guards import detect_fake_mode

        fake_mode = detect_fake_mode(tuple(n.meta.get("val") for n in nodes))
        if fake_mode is not None:
            p.meta["val"] = fake_mode.from_tensor(t, static_shapes=True)
        attr_specs.append(spec(kind, persistent, name, fqn))
        add_tensor(kind, persistent, fqn, t)

    output_args: list[TensorArgument | SymIntArgument | ConstantArgument] = []
    # The first call_function node copied: a placeholder after it is a moved input.
    first_computed: torch.fx.Node | None = None
    for node in nodes:
        if node.op == "get_attr":
            target = str(node.target)
            kind, persistent, _ = _tensor_kind(gm, target) or ("", False, None)
            table.attrs.append(
                pb.LiftedAttr(
                    name=node.name, target=target, after=previous,
                    parameter=kind == "parameter", persistent=persistent,
                    constant=kind == "constant",
                )
            )
        elif node.op == "placeholder":
            if first_computed is None:
                p = graph.node_copy(node, lambda n: env[n])
            else:  # inputs first, as in any program; the table says where it was
                with graph.inserting_before(first_computed):
                    p = graph.node_copy(node, lambda n: env[n])
                table.moved_inputs.append(pb.MovedInput(name=node.name, after=previous))
            env[node] = p
            user_specs.append(
                InputSpec(kind=InputKind.USER_INPUT, arg=_argument_of(node), target=None)
            )
        elif node.op == "call_module":
            if node.target != GUARDS_NAME or table.HasField("guards") or node.users:
                raise ProgramEncodeError(
                    f"node {node.name!r}: call_module {node.target!r} cannot be lifted (only a "
                    f"{GUARDS_NAME} node without users)"
                )
            if node.kwargs or not all(
                isinstance(a, torch.fx.Node) and a.op == "placeholder" for a in node.args
            ):
                raise ProgramEncodeError(
                    f"node {node.name!r}: {GUARDS_NAME}'s arguments are not placeholders"
                )
            table.guards.CopyFrom(
                pb.GuardsCall(
                    name=node.name, target=GUARDS_NAME, after=previous,
                    args=[a.name for a in node.args],  # type: ignore[union-attr]
                    impure=bool(getattr(source.get_submodule(GUARDS_NAME), "_is_impure", False)),
                )
            )
        elif node.op == "output":
            flat = node.args[0]
            flat = tuple(flat) if isinstance(flat, (list, tuple)) else (flat,)
            for a in flat:
                if isinstance(a, torch.fx.Node):
                    output_args.append(_argument_of(a))
                elif a is None or isinstance(a, (int, float, bool, str)):
                    output_args.append(ConstantArgument(name="", value=a))
                else:
                    raise ProgramEncodeError(
                        f"node {node.name!r}: output {a!r} is not a node or a literal"
                    )
            out = graph.output(tuple(env[a] if isinstance(a, torch.fx.Node) else a for a in flat))
            out.meta = copy.copy(node.meta)
        elif node.op == "call_function":
            env[node] = graph.node_copy(node, lambda n: env[n])
            if first_computed is None:
                first_computed = env[node]
        else:
            raise ProgramEncodeError(f"node {node.name!r}: op {node.op!r} cannot be lifted")
        previous = node.name
    renamed = [n.name for n in graph.nodes if n.op != "output" and n.name not in used]
    if renamed:
        raise ProgramEncodeError(f"nodes renamed while lifting: {renamed}")

    root = torch.fx.GraphModule(torch.nn.Module(), graph)
    codegen = getattr(source.graph, "_codegen", None)
    pytree_info = getattr(codegen, "pytree_info", None)
    arg_names = list(pytree_info.orig_args) if pytree_info is not None else None
    signature = ExportGraphSignature(
        input_specs=attr_specs + user_specs,
        output_specs=[OutputSpec(OutputKind.USER_OUTPUT, a, None) for a in output_args],
    )
    try:
        ep = ExportedProgram(
            root=root,
            graph=graph,
            graph_signature=signature,
            state_dict=state_dict,
            range_constraints=_range_constraints(gm),
            module_call_graph=[
                ModuleCallEntry(
                    "",
                    ModuleCallSignature(
                        inputs=[], outputs=[], in_spec=in_spec,
                        out_spec=out_spec,  # type: ignore[arg-type]  # None: no outputs
                        forward_arg_names=arg_names,
                    ),
                )
            ],
            example_inputs=None,
            constants=constants,
            # torch.export's own dialect for what ``.module()`` came from: in-place operators
            # (``squeeze_``, ``index_put_``) are allowed, as they are in the module.
            verifiers=[TrainingIRVerifier],
        )
    except CodecError:
        raise
    except Exception as e:
        raise ProgramEncodeError(
            f"the lifted module is not a valid program: {type(e).__name__}: {e}"
        ) from e
    return ep, table


# --------------------------------------------------------------------------------------------
# Unlift (server)


def _register(
    root: torch.nn.Module, target: str, t: torch.Tensor, kind: InputKind, persistent: bool
) -> None:
    parts = _check_path(target, "tensor target")
    owner = _owner(root, parts, create=True)
    if owner is None or hasattr(owner, parts[-1]):
        raise ProgramDecodeError(f"tensor target {target!r} is taken or not under a module")
    if kind == InputKind.CONSTANT_TENSOR:
        # As ``.module()`` sets a lifted constant: a plain attribute.
        setattr(owner, parts[-1], t)
    elif kind == InputKind.PARAMETER:
        if not isinstance(t, torch.nn.Parameter):
            t = torch.nn.Parameter(t, requires_grad=t.requires_grad)
        owner.register_parameter(parts[-1], t)
    else:
        owner.register_buffer(parts[-1], t, persistent=persistent)


def _positions(
    base: list[torch.fx.Node], items: list[tuple[str, str]]
) -> list[torch.fx.Node | str]:
    """``base`` with each item (name, after) placed right after the node or item it names
    ("" = first); items following the same one keep the table's order."""
    following: dict[str, list[str]] = {}
    for name, after in items:
        following.setdefault(after, []).append(name)
    out: list[torch.fx.Node | str] = []
    placed: set[str] = set()

    def emit(name: str) -> None:
        # Depth first, without recursion: a module's get_attr nodes usually follow one another,
        # a chain as long as the module has tensors.
        stack = list(reversed(following.pop(name, [])))
        while stack:
            item = stack.pop()
            if item in placed:
                raise ProgramDecodeError(f"unlift table: node {item!r} is placed twice")
            placed.add(item)
            out.append(item)
            stack.extend(reversed(following.pop(item, [])))

    emit("")
    for node in base:
        out.append(node)
        emit(node.name)
    if following:
        raise ProgramDecodeError(
            "unlift table: nodes placed after unknown nodes: "
            + ", ".join(f"{n} after {a!r}" for a, ns in following.items() for n in ns)
        )
    return out


def unlift_program(
    ep: ExportedProgram, table: pb.UnliftTable, *, guards_module: torch.nn.Module | None = None
) -> torch.fx.GraphModule:
    """Rebuild the client's module from the decoded lifted program (the server's side; also
    the client's, for a module a quantizer's transform returned whole, with
    ``guards_module`` its own guards function).

    The result is a ``torch.export._unlift._StatefulGraphModule`` like ``.module()`` returns:

    * the placeholders the table names become ``get_attr`` nodes of the same name and target,
      at the table's positions, with the placeholders' meta;
    * the program's tensors (``ep.state_dict`` / ``ep.constants`` entries: real tensors, or the
      ``FakeTensor`` s a withheld decode made -- kept as given) are registered at their FQNs
      on ``torch.nn.Module`` containers, as parameters or buffers with their persistent flag,
      or (CONSTANT_TENSOR inputs, which the table must name) as plain attributes;
      lifted tensors the table does not name (ones the client's graph does not read) are
      registered and get no node;
    * the table's moved inputs go back after the nodes they followed;
    * the guards call, if any, becomes a ``call_module`` node of the table's name, position and
      arguments, calling an :class:`InertGuards` whose ``_is_impure`` is the table's (or
      ``guards_module``, as given), with the ``nn_module_stack`` ``.module()`` gives it (the
      first ``call_function``'s);
    * the pytree code of ``.module()`` (in/out specs and argument names of the program's
      module call graph), so ``gm(*args)`` takes the client's arguments, the range
      constraints, and ``.module()``'s input check;
    * top-level attribute names of the table the module would lack are set to
      :class:`AbsentAttribute` so that ``hasattr`` answers as on the client.

    Raises:
        ProgramDecodeError: the table does not fit the program (names a placeholder that is
            absent or not a parameter/buffer of that target and kind, a position after an
            unknown node, an attribute path that is not one, a name that cannot be kept).
        FingerprintMismatch: the rebuilt module's :func:`module_fingerprint` differs from
            ``table.fingerprint``.
    """
    from torch.export._unlift import (
        _check_input_constraints_pre_hook,
        _get_codegen,
        _StatefulGraphModule,
    )

    specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
    placeholders = {n.name: n for n in ep.graph.find_nodes(op="placeholder")}
    lifted: dict[str, pb.LiftedAttr] = {}
    for attr in table.attrs:
        s = specs.get(attr.name)
        if attr.name not in placeholders or s is None:
            raise ProgramDecodeError(f"unlift table: no placeholder {attr.name!r} in the program")
        if attr.name in lifted:
            raise ProgramDecodeError(f"unlift table: {attr.name!r} is named twice")
        if attr.constant and (attr.parameter or attr.persistent):
            raise ProgramDecodeError(
                f"unlift table: {attr.name!r} is a constant and a parameter or buffer"
            )
        want = _INPUT_KINDS[
            "constant" if attr.constant else "parameter" if attr.parameter else "buffer"
        ]
        if s.kind != want or s.target != attr.target:
            raise ProgramDecodeError(
                f"unlift table: placeholder {attr.name!r} is {s.kind.name} {s.target!r} in the "
                f"program, not {want.name} {attr.target!r}"
            )
        if want == InputKind.BUFFER and bool(s.persistent) != attr.persistent:
            raise ProgramDecodeError(f"unlift table: {attr.name!r}'s persistent flag differs")
        _check_path(attr.target, f"unlift table: {attr.name!r}'s target")
        lifted[attr.name] = attr
    moved: dict[str, pb.MovedInput] = {}
    for m in table.moved_inputs:
        s = specs.get(m.name)
        if m.name not in placeholders or s is None or s.kind != InputKind.USER_INPUT:
            raise ProgramDecodeError(f"unlift table: moved input {m.name!r} is not a user input")
        if m.name in moved:
            raise ProgramDecodeError(f"unlift table: moved input {m.name!r} is named twice")
        moved[m.name] = m
    guards = table.guards if table.HasField("guards") else None
    if guards is not None:
        if guards.target != GUARDS_NAME:
            raise ProgramDecodeError(f"unlift table: guards target {guards.target!r} refused")
        for a in guards.args:
            if a not in placeholders or a in lifted:
                raise ProgramDecodeError(f"unlift table: guards argument {a!r} is not an input")

    # The tensors.
    root = torch.nn.Module()
    for s in ep.graph_signature.input_specs:
        if s.kind not in _INPUT_KINDS.values():
            if s.kind != InputKind.USER_INPUT:
                raise ProgramDecodeError(f"placeholder {s.arg.name!r} is {s.kind.name}: refused")
            continue
        assert s.target is not None
        persistent = s.kind == InputKind.PARAMETER or bool(s.persistent)
        source = ep.state_dict if persistent else ep.constants
        if s.target not in source:
            raise ProgramDecodeError(f"the program has no tensor {s.target!r}")
        node = placeholders[s.arg.name]
        if s.arg.name not in lifted and node.users:
            raise ProgramDecodeError(
                f"placeholder {s.arg.name!r} is used but the unlift table does not name it"
            )
        if s.kind == InputKind.CONSTANT_TENSOR and s.arg.name not in lifted:
            raise ProgramDecodeError(
                f"constant {s.arg.name!r} is not read by the module: the unlift table must name it"
            )
        _register(root, s.target, source[s.target], s.kind, persistent)

    # The graph.
    base = [
        n for n in ep.graph.nodes
        if not (n.op == "placeholder" and n.name in specs
                and (specs[n.name].kind != InputKind.USER_INPUT or n.name in moved))
    ]
    items = [(a.name, a.after) for a in table.attrs]
    items += [(m.name, m.after) for m in table.moved_inputs]
    if guards is not None:
        items.append((guards.name, guards.after))
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    by_name: dict[str, torch.fx.Node] = {}
    guards_node: torch.fx.Node | None = None
    for entry in _positions(base, items):
        if isinstance(entry, str) and entry in moved:
            entry = placeholders[entry]
        if isinstance(entry, str) and entry in lifted:
            attr = lifted[entry]
            new = graph.create_node("get_attr", attr.target, name=attr.name)
            new.meta = copy.copy(placeholders[attr.name].meta)
            env[placeholders[attr.name]] = new
        elif isinstance(entry, str):
            assert guards is not None
            missing = [a for a in guards.args if a not in by_name]
            if missing:
                raise ProgramDecodeError(f"unlift table: guards call before its inputs {missing}")
            new = graph.create_node(
                "call_module", GUARDS_NAME, tuple(by_name[a] for a in guards.args),
                name=guards.name,
            )
            guards_node = new
        else:
            try:
                new = graph.node_copy(entry, lambda n: env[n])
            except KeyError as e:
                raise ProgramDecodeError(
                    f"unlift table: node {entry.name!r} comes before an input it uses"
                ) from e
            env[entry] = new
        wanted = entry if isinstance(entry, str) else entry.name
        if new.name != wanted:
            raise ProgramDecodeError(f"node {wanted!r} cannot keep its name (got {new.name!r})")
        by_name[new.name] = new
    if guards_node is not None:
        from torch.fx._utils import first_call_function_nn_module_stack

        guards_node.meta["nn_module_stack"] = first_call_function_nn_module_stack(graph)

    call = ep.module_call_graph[0].signature if ep.module_call_graph else None
    if call is None or call.in_spec is None:
        raise ProgramDecodeError("the program has no input spec")
    graph._codegen = _get_codegen(call.in_spec, call.out_spec, call.forward_arg_names)
    try:
        graph.lint()
    except Exception as e:
        raise ProgramDecodeError(f"the rebuilt graph is not valid: {e}") from e

    gm = _StatefulGraphModule._create(
        torch.nn.Module(), torch.fx.Graph(), range_constraints=dict(ep.range_constraints)
    )
    for name, child in root._modules.items():
        gm.add_module(name, child)
    for name, p in root._parameters.items():
        gm.register_parameter(name, p)
    for name, b in root._buffers.items():
        gm.register_buffer(name, b, persistent=name not in root._non_persistent_buffers_set)
    for s in ep.graph_signature.input_specs:  # top-level constants: plain attributes of root
        if s.kind == InputKind.CONSTANT_TENSOR and s.target is not None and "." not in s.target:
            setattr(gm, s.target, getattr(root, s.target))
    if guards is not None and guards_module is not None:
        gm.add_module(GUARDS_NAME, guards_module)
    elif guards is not None:
        inert = InertGuards()
        inert._is_impure = guards.impure  # type: ignore[assignment]
        gm.add_module(GUARDS_NAME, inert)
    gm.graph = graph
    gm.register_forward_pre_hook(_check_input_constraints_pre_hook, with_kwargs=True)
    for name in table.attribute_names:
        _check_path(name, "unlift table: attribute name")
        if "." in name:
            raise ProgramDecodeError(f"unlift table: attribute name {name!r} is not top-level")
        if not hasattr(gm, name):
            object.__setattr__(gm, name, AbsentAttribute(name))
    problem = _fingerprint_problem(gm, table.fingerprint, "the module rebuilt on the server")
    if problem is not None:
        raise FingerprintMismatch(problem)
    return gm
