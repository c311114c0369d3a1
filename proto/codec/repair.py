"""What the deserializers change or drop, put back as the client had it.

The client's fingerprint is the reference for :func:`repair` (argument kinds, unused ``getitem``
nodes, placeholder targets, list/tuple operands, node order); the ``NodeMetadata`` messages are
the reference for :func:`restore_metadata`; the hints of the placeholders' sizes are the
reference for :func:`restore_symbol_hints`.
"""

from __future__ import annotations

import keyword
import operator
from typing import Any

import sympy
import torch
import torch.fx
from torch.export import ExportedProgram

from remote_partitioner.proto.codec.fingerprint import arg_text, args_text
from remote_partitioner.proto.codec.graphs import graph_modules
from remote_partitioner.proto.program_errors import ProgramDecodeError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = ["repair", "restore_metadata", "restore_symbol_hints"]


def repair(ep: ExportedProgram, expected: list[pb.NodeFingerprint]) -> None:
    """Undo what the serializers change, using the client's fingerprint as the reference.

    Each graph of ``ep`` gets, in turn, the repairs below; a graph any of them changed is
    linted and recompiled. What no repair can make as the client had it is left for the
    fingerprint check to name.

    Raises:
        ProgramDecodeError: a placeholder target in the fingerprint is not an identifier.
    """
    by_graph: dict[str, list[pb.NodeFingerprint]] = {}
    for entry in expected:
        by_graph.setdefault(entry.graph, []).append(entry)
    for path, gm in graph_modules(ep.graph_module):
        want = by_graph.get(path, [])
        names: dict[str, pb.NodeFingerprint] = {e.name: e for e in want}
        graph = gm.graph
        changed = _erase_invented_getitems(graph, names)
        changed |= _restore_placeholder_targets(graph, names)
        changed |= _restore_argument_kinds(graph, names)
        changed |= _restore_sequence_types(graph, names)
        # Node order, as the client had it: the deserializers put get_attr nodes where they
        # are first used and getitem nodes right after their producer. If the client's order
        # is not an order of these nodes that FX can run, leave the order: the fingerprint
        # check (after this) names the difference.
        by_name = {n.name: n for n in graph.nodes}
        if _is_an_order_of(want, by_name):
            changed |= _reorder(want, by_name)
        if changed:
            graph.lint()
            gm.recompile()


def _erase_invented_getitems(graph: torch.fx.Graph, names: dict[str, pb.NodeFingerprint]) -> bool:
    """Erase the unused getitem nodes the serializer invented (the client has no node of that
    name); True if any was."""
    changed = False
    for node in list(graph.nodes):
        if (
            node.name not in names
            and node.op == "call_function"
            and node.target is operator.getitem
            and not node.users
        ):
            graph.erase_node(node)
            changed = True
    return changed


def _restore_placeholder_targets(
    graph: torch.fx.Graph, names: dict[str, pb.NodeFingerprint]
) -> bool:
    """Give placeholders the client's targets (the deserializers name the target after the
    node); True if any changed. FX writes a placeholder's target into the generated
    ``forward()``: only an identifier is taken, :class:`ProgramDecodeError` otherwise."""
    changed = False
    for node in graph.nodes:
        f = names.get(node.name)
        if f is None:
            continue
        if node.op == "placeholder" and node.target != f.target:
            if not f.target.isidentifier() or keyword.iskeyword(f.target):
                raise ProgramDecodeError(
                    f"placeholder {node.name!r}: target {f.target[:100]!r} is not an "
                    "identifier"
                )
            node.target = f.target
            changed = True
    return changed


def _restore_argument_kinds(graph: torch.fx.Graph, names: dict[str, pb.NodeFingerprint]) -> bool:
    """Pass arguments by position or by keyword as the client did (``exir.serde`` does not
    record which); True if any call changed."""
    changed = False
    for node in graph.nodes:
        f = names.get(node.name)
        if f is None or node.op != "call_function":
            continue
        if len(node.args) == f.num_args and list(node.kwargs) == list(f.kwarg_names):
            continue
        values = list(node.args) + list(node.kwargs.values())
        keys = [None] * len(node.args) + list(node.kwargs)
        if len(values) != f.num_args + len(f.kwarg_names):
            continue
        kw = dict(zip(keys[len(node.args):], values[len(node.args):], strict=True))
        pos = list(node.args)
        # Move trailing keyword arguments to positions, or positions to keywords.
        while len(pos) < f.num_args and kw:
            pos.append(kw.pop(next(iter(kw))))
        if len(pos) == f.num_args and set(kw) == set(f.kwarg_names):
            node.args = tuple(pos)
            node.kwargs = {k: kw[k] for k in f.kwarg_names}
            changed = True
    return changed


def _restore_sequence_types(graph: torch.fx.Graph, names: dict[str, pb.NodeFingerprint]) -> bool:
    """Make lists and tuples of arguments (higher-order operators' operands, the output node's
    values) lists or tuples as the client had them; True if any call changed."""
    changed = False
    for node in graph.nodes:
        f = names.get(node.name)
        if f is None:
            continue
        if node.op in ("call_function", "output") and args_text(node) != f.args:
            args, prefix = [], "("
            for a in node.args:
                choice = a
                if isinstance(a, (list, tuple)):
                    flipped = tuple(a) if isinstance(a, list) else list(a)
                    if not f.args.startswith(prefix + arg_text(a)) and f.args.startswith(
                        prefix + arg_text(flipped)
                    ):
                        choice = flipped
                args.append(choice)
                prefix += arg_text(choice) + ", "
            if arg_text(tuple(args)) + arg_text(dict(node.kwargs)) == f.args:
                node.args = tuple(args)
                changed = True
    return changed


def _tensor_meta(val: Any, m: pb.NodeMetadata) -> Any:
    """``tensor_meta`` rebuilt from ``val``, shaped as the client's (see NodeMetadata)."""
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    if m.tensor_meta_is_none:
        return None
    if isinstance(val, torch.Tensor):
        return _extract_tensor_metadata(val)._replace(requires_grad=m.tensor_meta_requires_grad)
    if isinstance(val, (list, tuple)):
        nones = list(m.tensor_meta_none_items) or [False] * len(val)
        return type(val)(
            _extract_tensor_metadata(v) if isinstance(v, torch.Tensor) and not none else None
            for v, none in zip(val, nones, strict=False)
        )
    return None


def restore_metadata(ep: ExportedProgram, msg: pb.Program) -> None:
    """Put back what the graph JSON dropped (the encoder sends it: ``encode._node_metadata``)."""
    if not msg.node_metadata:
        return
    if msg.dialect == pb.DIALECT_EDGE:
        from remote_partitioner.proto.codec.serializers import edge_metadata_deserializer_class

        deserializer: Any = edge_metadata_deserializer_class()()
    else:
        from torch._export.serde import serialize as tser

        deserializer = tser.GraphModuleDeserializer()
    nodes = {
        (path, n.name): n for path, gm in graph_modules(ep.graph_module) for n in gm.graph.nodes
    }
    for m in msg.node_metadata:
        node = nodes.get((m.node.graph, m.node.name))
        if node is None:
            raise ProgramDecodeError(
                f"metadata for node {m.node.name!r}, which is not in the graph"
            )
        if m.entries:
            try:
                node.meta.update(deserializer.deserialize_metadata(dict(m.entries)))
            except Exception as e:
                raise ProgramDecodeError(
                    f"metadata of node {m.node.name!r} cannot be read: {type(e).__name__}: {e}"
                ) from e
        if m.no_val:
            node.meta.pop("val", None)
        if m.val_is_list and isinstance(node.meta.get("val"), tuple):
            node.meta["val"] = list(node.meta["val"])
        if m.has_tensor_meta and "tensor_meta" not in node.meta:
            node.meta["tensor_meta"] = _tensor_meta(node.meta.get("val"), m)


def _is_an_order_of(want: list[pb.NodeFingerprint], by_name: dict[str, torch.fx.Node]) -> bool:
    """Whether :func:`_reorder` can put the graph in the client's order: it names the graph's
    placeholders first, in the graph's order (they are the program's inputs: never moved), then
    every other node once, each after the nodes it uses, as FX needs. (The fingerprint is
    checked after the repairs: a client's fingerprint that is not such an order must not reach
    :func:`_reorder`.)"""
    if len(want) != len(by_name):
        return False
    placeholders = [n for n in by_name.values() if n.op == "placeholder"]
    order: list[torch.fx.Node] = []
    seen: set[torch.fx.Node] = set()
    for f in want:
        node = by_name.get(f.name)
        if node is None or node in seen or not seen.issuperset(node.all_input_nodes):
            return False
        order.append(node)
        seen.add(node)
    return order[: len(placeholders)] == placeholders


def _reorder(want: list[pb.NodeFingerprint], by_name: dict[str, torch.fx.Node]) -> bool:
    """Move nodes into the client's order; True if any moved."""
    changed = False
    prev: torch.fx.Node | None = None
    for f in want:
        node = by_name[f.name]
        if node.op != "placeholder" and prev is not None and node.prev is not prev:
            prev.append(node)
            changed = True
        prev = node
    return changed


def restore_symbol_hints(ep: ExportedProgram) -> None:
    """Give the shape environment the hints of symbols that appear only inside expressions.

    A dimension exported as a derived ``Dim`` (``Dim("h", min=1, max=16) * 16``) is a linear
    expression of a root symbol (``16*s89``). The export schema records the expression and
    its hint (224), never the root symbol's own hint (14), and neither deserializer gives the
    root symbol one (exir's records no hint for an expression at all; torch's records the
    expression's). The client's shape environment has it, so a guard its value ranges cannot
    decide (``Eq(8*(floor(s89/2) - 1)*(floor(s99/2) - 1), 0)``, XNNPACK's ``numel() == 0``
    after three max-pools) is evaluated from the hint there, and raised a data-dependent
    error on the server (ExecuTorch's suite: ``test_alexnet`` with dynamic shapes, quantized
    XNNPACK flows).

    Each symbol without a hint is solved from a placeholder dimension (size, stride or storage
    offset, in every graph of ``ep``) whose hint is known and whose expression is linear in
    that one unknown symbol, with an integer solution within the symbol's value range;
    repeated until no more can be solved. A symbol no dimension determines is
    left without a hint, as it was. Every symbol is also given the creation stack torch's
    deserializer records for it (exir's records none, and torch's data-dependent error reads
    it: the server raised ``KeyError: 's89'`` in place of the error the client gets).
    """
    from torch.utils._traceback import CapturedTraceback

    dims: list[Any] = []
    for _, gm in graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                dims += _symbolic_dims(node.meta.get("val"))
    progress = True
    while progress:  # each pass solves at least one more symbol, or it is the last
        progress = False
        for dim in dims:
            env, expr, hint = dim.node.shape_env, dim.node.expr, dim.node.hint
            known = env.backed_var_to_val
            unknown = [x for x in expr.free_symbols if x not in known]
            if hint is None or len(unknown) != 1:
                continue
            (symbol,) = unknown
            value = _solve_for(expr.xreplace({x: known[x] for x in expr.free_symbols
                                              if x is not symbol}),
                               symbol, int(hint), env.var_to_range.get(symbol))
            if value is not None:
                env.add_backed_var_to_val(symbol, value)
                progress = True
    for dim in dims:
        env = dim.node.shape_env
        for symbol in dim.node.expr.free_symbols:
            if symbol not in env.var_to_stack:
                env.var_to_stack[symbol] = CapturedTraceback.extract(skip=1)


def _symbolic_dims(val: Any) -> list[Any]:
    """The ``SymInt`` dimensions of a placeholder's value (a tensor's sizes, strides and
    storage offset, or a ``SymInt``)."""
    if isinstance(val, torch.SymInt):
        return [val]
    if isinstance(val, torch.Tensor):
        dims = [*val.shape, *val.stride(), val.storage_offset()]
        return [d for d in dims if isinstance(d, torch.SymInt)]
    return []


def _solve_for(expr: sympy.Expr, symbol: sympy.Symbol, hint: int, bounds: Any) -> int | None:
    """The integer value of ``symbol`` within ``bounds`` (a ``ValueRanges``, or None for any)
    for which ``expr == hint``, if ``expr`` is ``a*symbol + b`` with integers ``a != 0`` and
    ``b`` (a derived dim: export allows no other form); else None. (Linear only, and without
    ``sympy.solve``: the expression comes from the client.)"""
    if not expr.is_polynomial(symbol):
        return None
    a = expr.diff(symbol)
    b = expr.subs(symbol, 0)
    if not (a.is_Integer and b.is_Integer) or a == 0:
        return None
    value, rest = divmod(hint - int(b), int(a))
    if rest or (bounds is not None and not bounds.lower <= value <= bounds.upper):
        return None
    return value
