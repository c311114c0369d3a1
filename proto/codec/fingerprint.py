"""The structural fingerprint of a program: what the server's rebuilt program is checked
against (per node: graph, name, op, target, argument shape), and the first difference of two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.fx
from torch.export import ExportedProgram

from remote_partitioner.proto.codec.graphs import graph_modules, target_name
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = ["arg_text", "args_text", "fingerprint", "first_difference"]


def arg_text(a: Any) -> str:
    """An argument as the fingerprint writes it: nodes by name, containers with their type,
    scalars by ``repr``, anything else by type name only."""
    if isinstance(a, torch.fx.Node):
        return f"%{a.name}"
    if isinstance(a, tuple):
        return "(" + ", ".join(arg_text(x) for x in a) + ",)"
    if isinstance(a, list):
        return "[" + ", ".join(arg_text(x) for x in a) + "]"
    if isinstance(a, dict):
        return "{" + ", ".join(f"{k!r}: {arg_text(v)}" for k, v in a.items()) + "}"
    if isinstance(a, float):
        return repr(a) if math.isfinite(a) else str(a)
    if a is None or isinstance(a, (bool, int, str, torch.dtype, torch.device, torch.layout)):
        return repr(a)
    if isinstance(a, torch.memory_format):
        return str(a)
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return f"sym:{a}"
    return f"<{type(a).__name__}>"


def args_text(node: torch.fx.Node) -> str:
    """A node's positional and keyword arguments, as :attr:`NodeFingerprint.args` holds them."""
    return arg_text(node.args) + arg_text(dict(node.kwargs))


def fingerprint(ep: ExportedProgram) -> list[pb.NodeFingerprint]:
    """The structural fingerprint of every node of every graph of ``ep``, in graph order."""
    out = []
    for path, gm in graph_modules(ep.graph_module):
        for node in gm.graph.nodes:
            out.append(
                pb.NodeFingerprint(
                    graph=path,
                    name=node.name,
                    op=node.op,
                    target=target_name(node.target),
                    num_args=len(node.args),
                    kwarg_names=list(node.kwargs.keys()),
                    args=args_text(node),
                )
            )
    return out


def first_difference(
    expected: Iterable[pb.NodeFingerprint], actual: Iterable[pb.NodeFingerprint]
) -> str | None:
    """A message naming the first node where two fingerprints differ, or None if equal."""
    exp, act = list(expected), list(actual)
    fields = ("graph", "name", "op", "target", "num_args", "kwarg_names", "args")
    for i, (e, a) in enumerate(zip(exp, act, strict=False)):
        for f in fields:
            ev, av = getattr(e, f), getattr(a, f)
            if f == "kwarg_names":
                ev, av = list(ev), list(av)
            if ev != av:
                where = f"graph {e.graph or '<root>'!r}, node #{i} {e.name!r}"
                return f"{where}: {f} differs: client has {ev!r}, server rebuilt {av!r}"
    if len(exp) != len(act):
        longer, side = (exp, "client") if len(exp) > len(act) else (act, "server")
        extra = longer[min(len(exp), len(act))]
        return (
            f"node counts differ: client has {len(exp)}, server rebuilt {len(act)}; first extra "
            f"node on the {side}: graph {extra.graph or '<root>'!r}, node {extra.name!r}"
        )
    return None
