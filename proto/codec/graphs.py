"""Walking a program's graphs, and naming what their nodes call.

:func:`graph_modules` is the one order in which every part of the codec (and the client and
server) visits a program's graphs; :func:`target_name` is how a node's target is written in a
fingerprint; :func:`op_name` and :func:`op_from_name` name operators on the wire.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from remote_partitioner.proto.program_errors import ProgramEncodeError

__all__ = ["graph_modules", "op_from_name", "op_name", "target_name"]


def graph_modules(gm: torch.fx.GraphModule) -> list[tuple[str, torch.fx.GraphModule]]:
    """Every graph module of a program's module tree, root first, as (path, module).

    The path is "" for the root and the dotted attribute path for a submodule (e.g. the
    branches of ``torch.cond``). Modules that are not graph modules (lowered backend modules)
    are not entered.
    """
    out: list[tuple[str, torch.fx.GraphModule]] = []

    def walk(prefix: str, mod: torch.fx.GraphModule) -> None:
        out.append((prefix, mod))
        for name, child in mod.named_children():
            if isinstance(child, torch.fx.GraphModule):
                walk(f"{prefix}.{name}" if prefix else name, child)

    walk("", gm)
    return out


def target_name(target: Any) -> str:
    """A node target's qualified name, as the fingerprint records it."""
    if isinstance(target, str):
        return target
    op = getattr(target, "_op", None)  # EdgeOpOverload wraps an OpOverload
    if isinstance(op, torch._ops.OpOverload) and type(target).__name__ == "EdgeOpOverload":
        return f"edge.{op}"
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"hop.{target.name()}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name is None:
        return type(target).__qualname__
    return f"{module}.{name}" if module else str(name)


# --------------------------------------------------------------------------------------------
# Operators by name


def op_name(op: Any) -> str:
    """``aten.linear.default`` -> ``"aten::linear.default"``."""
    if not isinstance(op, torch._ops.OpOverload):
        raise ProgramEncodeError(f"not an operator overload: {op!r} ({type(op).__name__})")
    return f"{op.namespace}::{op._schema.name.split('::', 1)[1]}.{op._overloadname}"


def op_from_name(name: str) -> torch._ops.OpOverload:
    """The registered ``OpOverload`` named ``"namespace::name.overload"``; ValueError if none."""
    try:
        namespace, rest = name.split("::", 1)
        opname, overload = rest.rsplit(".", 1)
    except ValueError:
        raise ValueError(f"malformed operator name {name!r}") from None
    for part in (namespace, opname, overload):
        if not part.isidentifier() or part.startswith("_" * 2):
            raise ValueError(f"malformed operator name {name!r}")
    try:
        packet = getattr(getattr(torch.ops, namespace), opname)
        op = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise ValueError(f"no registered operator {name!r}") from None
    if not isinstance(op, torch._ops.OpOverload):
        raise ValueError(f"no registered operator {name!r}")
    return op
