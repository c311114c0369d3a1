"""The program codec: ``torch.export.ExportedProgram`` <-> ``remote_partitioner.v1.Program``.

The graph crosses as the export schema's JSON, written and read by the serializers torch and
ExecuTorch ship (``torch._export.serde`` for ATen programs, ``executorch.exir.serde`` for Edge
programs). Tensors cross as raw storage bytes in content-addressed blobs, with dtype, sizes,
strides and storage offset inline; a ``FakeTensor`` crosses as metadata only. Nothing is pickled.

What the serializers get wrong is repaired here, in one place:

* ``exir.serde`` does not record whether an argument was passed by position or by keyword
  (``aten.linear(x, w, b)`` comes back as ``linear(x, w, bias=b)``): the client's fingerprint
  records it, and the decoder restores it.
* ``exir.serde`` adds unused ``getitem`` nodes for multi-output operators: the decoder removes
  the unused ``getitem`` nodes the client's graph does not have.
* ``exir.serde`` refuses ``get_attr`` nodes that read tensors (a ``torch.cond`` branch reading a
  constant): such tensors cross as ``ModuleTensor`` and their nodes are rebuilt.
* Lowered backend modules cross as ``LoweredModule`` (backend id, compile specs, original
  program), never as the pickles ``exir.serde`` would embed.
* ``get_attr`` nodes come back where the deserializer first needs them: the decoder moves them
  back to the client's position.

* The graph JSON holds no metadata for placeholder, get_attr, output and getitem nodes, and
  never ``tensor_meta``: ``NodeMetadata`` carries the serializer's own metadata strings for
  those nodes and the shape of ``tensor_meta``, which is rebuilt from ``val``.

After decoding, the rebuilt program's fingerprint is compared with the client's; any difference
raises :class:`FingerprintMismatch` naming the first differing node.

Node metadata that crosses: ``val``, ``tensor_meta``, ``stack_trace``, ``nn_module_stack``,
``source_fn_stack``, ``torch_fn``, ``debug_handle``, ``from_node`` (Edge), ``custom``. Not
crossing, and read by no hosted partitioner: ``seq_nr``, ``example_value``, ``original_aten``,
``desc``.

This package's public names are the ones below (``from remote_partitioner.proto import codec``,
then ``codec.encode_program(...)``); its modules, each with one job, are internal:

* ``graphs``: walking a program's graphs, target and operator names;
* ``fingerprint``: the structural fingerprint and its first difference;
* ``meta_values``: node metadata values <-> ``MetaValue``;
* ``encode`` and ``serializers``: program -> message and blobs, the graph written by torch's or
  ExecuTorch's serializer;
* ``decode``, ``deserializers`` and ``repair``: message and blobs -> program, the graph read by
  their deserializers, then repaired;
* ``blob_digests``: the blob digests a message names;
* ``modules``: a quantizer's unlifted ``GraphModule`` across the wire (``lift_module`` ->
  program codec -> ``unlift_program``, checked by ``module_fingerprint``), and
  ``module_edits``: the edits a quantizer step made to it (``ModuleSnapshot.edits`` on the
  server, ``apply_edits`` on the client's own module, which is never replaced);
* ``preprocess``: the node metadata ``Preprocess`` sends beside a program, and
  ``PreprocessResult`` <-> ``PreprocessOutput``.

``annotations`` is the ``Quantize`` RPC's codec for a PT2E quantizer's work:
:func:`encode_annotations` states every node's torchao ``QuantizationAnnotation`` as an
``Annotations`` message (constructors, specs and annotation objects as tables, so the sharing
torchao's ``prepare`` reads survives), :func:`apply_annotations` rebuilds them onto a module with
the same node names. Observer and fake-quantize classes cross by qualified name, resolved only
through an allow-list; one not on it raises :class:`UnknownConstructor`.

The exceptions are :mod:`remote_partitioner.proto.program_errors`; the checks that keep a
client's graph from naming code are :mod:`remote_partitioner.proto.graph_check`.
"""

from __future__ import annotations

from remote_partitioner.proto.codec.annotations import (
    UnknownConstructor,
    apply_annotations,
    encode_annotations,
)
from remote_partitioner.proto.codec.blob_digests import (
    graph_digests,
    has_withheld,
    iter_digests,
    nested_programs,
)
from remote_partitioner.proto.codec.decode import WithheldTensors, decode_program
from remote_partitioner.proto.codec.encode import DigestCache, EncodedProgram, encode_program
from remote_partitioner.proto.codec.fingerprint import fingerprint, first_difference
from remote_partitioner.proto.codec.graphs import graph_modules, op_from_name, op_name, target_name
from remote_partitioner.proto.codec.meta_values import decode_meta_value, encode_meta_value
from remote_partitioner.proto.codec.module_edits import ModuleSnapshot, apply_edits
from remote_partitioner.proto.codec.modules import (
    GUARDS_NAME,
    EditConflict,
    lift_module,
    module_fingerprint,
    unlift_program,
)
from remote_partitioner.proto.codec.preprocess import (
    apply_node_meta,
    decode_preprocess_result,
    encode_preprocess_result,
    extra_node_meta,
)
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.graph_check import check_target, checked_graph_json
from remote_partitioner.proto.program_errors import (
    BlobMissing,
    BlobSizeMismatch,
    CodecError,
    FingerprintMismatch,
    ProgramDecodeError,
    ProgramEncodeError,
    UnrepresentableMeta,
)

__all__ = [
    "GUARDS_NAME",
    "BlobMissing",
    "BlobSizeMismatch",
    "CodecError",
    "DigestCache",
    "EditConflict",
    "EncodedProgram",
    "FingerprintMismatch",
    "ModuleSnapshot",
    "ProgramDecodeError",
    "ProgramEncodeError",
    "UnknownConstructor",
    "UnrepresentableMeta",
    "WithheldTensors",
    "apply_annotations",
    "apply_edits",
    "apply_node_meta",
    "check_target",
    "checked_graph_json",
    "decode_meta_value",
    "decode_preprocess_result",
    "decode_program",
    "digest_of",
    "encode_annotations",
    "encode_meta_value",
    "encode_preprocess_result",
    "encode_program",
    "extra_node_meta",
    "fingerprint",
    "first_difference",
    "graph_digests",
    "graph_modules",
    "has_withheld",
    "iter_digests",
    "lift_module",
    "module_fingerprint",
    "nested_programs",
    "op_from_name",
    "op_name",
    "target_name",
    "unlift_program",
]
