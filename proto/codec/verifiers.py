"""An Edge program's verifier on the wire (``Program.edge_verifier``).

The export schema's JSON names a program's verifiers by dialect only ("EDGE"), and
``executorch.exir.serde`` loads for it the Edge verifier class the process built last (torch
registers verifier classes by dialect): the rebuilt program's verifier would depend on the
server's history. The verifier ``to_edge`` builds is configured: it accepts the operators the
partitioners keep from decomposition (``ops_to_not_decompose``) and follows the
``EdgeCompileConfig``. A backend whose preprocess calls ``ExportedProgram.validate()`` (Arm's
pass manager does) refuses, with another configuration (a default one), what it accepts
locally. So the configuration crosses as data: two flags and two lists of operator names,
resolved on the other side to registered operators only (:func:`~.graphs.op_from_name`).
"""

from __future__ import annotations

from typing import Any

from torch.export import ExportedProgram

from remote_partitioner.proto.codec.graphs import op_from_name, op_name
from remote_partitioner.proto.program_errors import ProgramDecodeError
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

__all__ = ["edge_verifier_class", "edge_verifier_message"]

_FIELDS = ("enable", "use_dim_order", "_core_aten_ops_exception_list", "_preserve_ops")


def edge_verifier_message(ep: ExportedProgram) -> pb.EdgeVerifier | None:
    """The configuration of ``ep``'s Edge verifier, or None when ``ep`` has no Edge verifier
    built by ExecuTorch's ``EXIREdgeDialectVerifier`` (the other side then uses the default).

    The verifier class keeps its configuration in a closure; an instance exposes it as the
    attributes its checks read, so one is made (cheap: it stores references).

    Raises:
        ProgramEncodeError: a listed operator is not an operator overload.
    """
    for cls in ep.verifiers:
        if getattr(cls, "dialect", None) != "EDGE":
            continue
        verifier = cls()
        if not all(hasattr(verifier, f) for f in _FIELDS):
            return None
        return pb.EdgeVerifier(
            check_ir_validity=bool(verifier.enable),
            use_dim_order=bool(verifier.use_dim_order),
            core_aten_ops_exception_list=[
                op_name(op) for op in verifier._core_aten_ops_exception_list
            ],
            preserve_ops=[op_name(op) for op in verifier._preserve_ops],
        )
    return None


def edge_verifier_class(msg: pb.EdgeVerifier) -> Any:
    """The Edge verifier class ``msg`` configures, as ``to_edge`` builds it.

    Raises:
        ProgramDecodeError: an operator name is malformed or names no registered operator.
    """
    from executorch.exir.capture._config import EdgeCompileConfig
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier

    try:
        exceptions = [op_from_name(n) for n in msg.core_aten_ops_exception_list]
        preserved = [op_from_name(n) for n in msg.preserve_ops]
    except ValueError as e:
        raise ProgramDecodeError(f"the program's Edge verifier: {e}") from None
    # A fresh config adds nothing to the lists (its own lists are empty): the client sent them
    # merged, as its verifier holds them.
    config = EdgeCompileConfig(
        _check_ir_validity=msg.check_ir_validity, _skip_dim_order=not msg.use_dim_order
    )
    return EXIREdgeDialectVerifier(
        edge_compile_config=config,
        class_only=True,
        core_aten_ops_exception_list=exceptions,
        preserve_ops=preserved,
    )
