"""``RemotePartitioner``: an ExecuTorch ``Partitioner`` whose hooks run on a remote server."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from operator import getitem
from typing import Any

import grpc
import torch
import torch.fx
from executorch.exir.backend.backend_details import PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import (
    DelegationSpec,
    Partitioner,
    PartitionResult,
)
from torch.export import ExportedProgram

from remote_partitioner.client import preprocess as preprocess_routes
from remote_partitioner.client import report
from remote_partitioner.client.connection import (
    ServerConnection,
    apply_rng_state,
    listed_entry,
)
from remote_partitioner.client.errors import (
    PartitionerNotFoundError,
    RemotePartitionerError,
    remote_exception,
)
from remote_partitioner.proto import codec, errors
from remote_partitioner.proto.digests import digest_of
from remote_partitioner.proto.spec import SpecScalar, spec_entries
from remote_partitioner.proto.transport import hook_from_wire
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb


class RemotePartitioner(Partitioner, ServerConnection):
    """A ``Partitioner`` that proxies every hook to a partitioner hosted by a remote server.

    It can stand wherever the hosted partitioner would: in
    ``to_edge_transform_and_lower(ep, partitioner=[RemotePartitioner(...)])`` and in
    ``to_edge(ep).to_backend(RemotePartitioner(...))``, and gives the same program, hence the
    same ``.pte`` bytes, as the local partitioner built with the same spec.

    Contract of each hook, as for the local partitioner:

    * ``partition(ep)`` tags ``ep``'s own nodes in place (``node.meta["delegation_tag"]``),
      applies every other ``node.meta`` entry the hosted partitioner added, changed or removed,
      and returns ``PartitionResult(ep, partition_tags)``; the graph itself is untouched.
    * ``ops_to_not_decompose(ep)`` returns real ``OpOverload``s and a filter, or ``None``
      exactly when the hosted partitioner's filter is ``None``; the filter answers, on every
      node of ``ep``, what the hosted filter answered (and raises what it raised).
    * ``transform_for_pre_decomposition(ep)`` returns the remotely transformed program, or
      ``ep`` itself when the hosted partitioner does not transform.

    Hooks that the hosted partitioner does not override are answered locally with the base
    class's answer, without a round trip. An exception raised by the hosted partitioner is
    raised here with the same built-in class and message, the remote traceback chained.

    Args:
        target: any gRPC target string: ``host:port``, ``ipv4:a:p1,b:p2``, ``dns:///name:port``.
        partitioner: the hosted partitioner's name (``ListPartitioners``), e.g. ``"xnnpack"``.
        spec: the hosted partitioner's spec keys and values (bool, int, float, str or bytes).
        timeout: per-call deadline in seconds; None waits as long as the call takes.
        channel: an existing channel to use instead of opening one to ``target``.
        credentials: channel credentials for TLS; None opens an insecure channel.
        options: extra channel options.
        check_versions: refuse a server whose torch or ExecuTorch version differs from ours.
        token: a bearer token, sent as ``authorization: Bearer <token>`` metadata on every call.
        max_retries: how many times a call refused with a ``RetryInfo`` (server overloaded)
            is retried after the delay the server asks for; and how many times a hook call
            that failed with UNAVAILABLE (its replica went away) is made again, blobs included.
        memoize: answer a hook called again on the same, unchanged program object from the
            previous answer, without encoding it or calling the server (see ``stats``).
        remote_preprocess: run the backend's ``preprocess`` on the server even when this
            process can import the backend. Without it, preprocess runs on the server only for
            a backend this process cannot import (see :mod:`remote_partitioner.client.preprocess`).
        withhold_tensors: send each hook's program without its tensors' data (metadata only)
            to a server that accepts it, and send the data only when the server answers that
            the hosted hook used the values (``TENSOR_DATA_REQUIRED``). The answer is the same
            either way; with it, a model's weights are neither hashed nor uploaded for hooks
            that decide from the graph, shapes and dtypes. ``Preprocess`` always sends them.
            To a server that accepts it, an already lowered module goes without its original
            program too (the hook ExecuTorch calls after lowering looks at the outer graph).

    After each ``partition()``, ``rejections`` lists every call_function node the hosted
    partitioner left untagged, with why (:class:`~remote_partitioner.client.report.Rejection`:
    name, target, reason, source; the reason is never empty), and ``delegated`` maps each
    backend id to what it took (:class:`~remote_partitioner.client.report.Delegated`:
    partitions, nodes). Both describe the last call only.
    """

    def __init__(
        self,
        target: str,
        partitioner: str,
        spec: Mapping[str, SpecScalar] | None = None,
        *,
        timeout: float | None = None,
        channel: grpc.Channel | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        options: Sequence[tuple[str, Any]] = (),
        check_versions: bool = True,
        token: str | None = None,
        max_retries: int = 5,
        memoize: bool = True,
        remote_preprocess: bool = False,
        withhold_tensors: bool = True,
    ) -> None:
        Partitioner.__init__(self, dict(spec or {}))
        ServerConnection.__init__(
            self, target, timeout=timeout, channel=channel, credentials=credentials,
            options=options, check_versions=check_versions, token=token,
            max_retries=max_retries, memoize=memoize, withhold_tensors=withhold_tensors,
        )
        self.partitioner_name = partitioner
        self._spec_msg = spec_entries(spec)
        self.remote_preprocess = remote_preprocess
        #: Backend ids whose preprocess ``partition()`` routed to the server.
        self._remote_backends: set[str] = set()
        self._info: pb.PartitionerInfo | None = None
        #: The last partition()'s untagged call_function nodes and why (see the class doc).
        self.rejections: list[report.Rejection] = []
        #: The last partition()'s delegation by backend id (see the class doc).
        self.delegated: dict[str, report.Delegated] = {}
        #: Counters (see :attr:`ServerConnection.stats`), and: Preprocess calls, bytes of
        #: results read back with ``ReadBlobs`` and processed bytes received.
        self.stats.update({"preprocess_calls": 0, "bytes_read": 0, "processed_bytes": 0})

    # ------------------------------------------------------------------ plumbing

    def __repr__(self) -> str:
        return f"RemotePartitioner({self.target!r}, {self.partitioner_name!r}, {self.spec!r})"

    def __setstate__(self, state: dict[str, Any]) -> None:
        ServerConnection.__setstate__(self, state)
        self._remote_backends = set(state.get("_remote_backends", ()))

    def __deepcopy__(self, memo: dict[int, Any]) -> RemotePartitioner:
        # A partitioner is configuration plus a connection; copies share neither state nor
        # channel, and open their own channel on first use.
        clone = RemotePartitioner.__new__(RemotePartitioner)
        clone.__setstate__(self.__getstate__())
        return clone

    @property
    def info(self) -> pb.PartitionerInfo:
        """The hosted partitioner's description (fetched once)."""
        if self._info is None:
            listing = self._server_listing()
            self._info = listed_entry(
                listing, listing.partitioners, self.partitioner_name, self.target,
                "partitioner", PartitionerNotFoundError, errors.Reason.UNKNOWN_PARTITIONER,
            )
            try:
                self._environment_info()  # its environment's versions checked before any use
            except RemotePartitionerError:
                self._info = None
                raise
        return self._info

    def _entry_environment(self) -> str:
        if not self.partitioner_name:  # a connection for Preprocess only (to_backend_remotely)
            return super()._entry_environment()
        return self.info.environment

    def overrides(self, hook: str) -> bool:
        """Whether the hosted partitioner overrides ``hook`` (else the base answer holds)."""
        return hook in {hook_from_wire(h) for h in self.info.overridden_hooks}

    def _ref(self) -> pb.PartitionerRef:
        return pb.PartitionerRef(name=self.partitioner_name, spec=self._spec_msg)

    # ------------------------------------------------------------------ hooks

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        response, _ = self._call_hook(
            "Partition",
            lambda ref: pb.PartitionRequest(partitioner=self._ref(), program_digest=ref),
            exported_program,
        )
        nodes = _nodes_by_ref(exported_program)
        for t in response.tags:
            _node(nodes, t.node).meta["delegation_tag"] = t.tag
        for u in response.meta_updates:
            node = _node(nodes, u.node)
            if u.removed:
                node.meta.pop(u.key, None)
            else:
                node.meta[u.key] = codec.decode_meta_value(u.value)
        partition_tags = {
            p.tag: DelegationSpec(
                p.delegation_spec.backend_id,
                [CompileSpec(cs.key, bytes(cs.value)) for cs in p.delegation_spec.compile_specs],
            )
            for p in response.partition_tags
        }
        for spec in partition_tags.values():
            self._route_backend(spec.backend_id)
        self.rejections = report.rejections(response.rejections)
        self.delegated = _delegated(nodes, response.tags, partition_tags)
        return PartitionResult(
            tagged_exported_program=exported_program, partition_tags=partition_tags
        )

    def _route_backend(self, backend_id: str) -> None:
        """Make sure ``to_backend`` finds a ``BackendDetails`` for ``backend_id``: the backend
        itself, imported as importing the local partitioner would have (only ExecuTorch's own
        modules are imported), or, when ``remote_preprocess`` is set or the backend cannot be
        imported here but the server hosts it, one whose preprocess runs on the server."""
        if backend_id in self._remote_backends:
            return
        if self.remote_preprocess:
            self._check_hosted_backend(backend_id)
            self._remote_backends.add(backend_id)
            preprocess_routes.install(backend_id, self, wrap_real=True)
            return
        if preprocess_routes.backend_class(backend_id, real=True) is not None:
            return
        module = self.info.backend_module
        failure = ""
        if module.startswith("executorch.") and all(p.isidentifier() for p in module.split(".")):
            try:
                importlib.import_module(module)
            except ImportError as e:
                failure = f" ({type(e).__name__}: {e})"
            if preprocess_routes.backend_class(backend_id, real=True) is not None:
                return
        if backend_id in {b.backend_id for b in self._server_listing().backends}:
            self._remote_backends.add(backend_id)
            preprocess_routes.install(backend_id, self, wrap_real=False)
            return
        raise RemotePartitionerError(
            f"backend {backend_id!r} is not available in this process{failure} and the server "
            f"at {self.target} does not preprocess it: import the module that defines it "
            f"({module or 'unknown'}) before lowering",
            grpc.StatusCode.FAILED_PRECONDITION,
        )

    def _check_hosted_backend(self, backend_id: str) -> None:
        hosted = [b.backend_id for b in self._server_listing().backends]
        if backend_id not in hosted:
            raise RemotePartitionerError(
                f"the server at {self.target} hosts no backend {backend_id!r}; hosted: "
                f"{', '.join(hosted) or '(none)'}",
                grpc.StatusCode.NOT_FOUND, errors.Reason.UNKNOWN_BACKEND.value,
            )

    # ------------------------------------------------------------------ preprocess

    def routes_backend(self, backend_id: str) -> bool:
        """Whether this partitioner's ``partition()`` routed ``backend_id``'s preprocess
        to the server (see :mod:`remote_partitioner.client.preprocess`)."""
        return backend_id in self._remote_backends

    def remote_preprocess_multimethod(
        self,
        backend_id: str,
        programs: Mapping[str, Sequence[ExportedProgram]],
        compile_specs: Mapping[str, Sequence[Sequence[CompileSpec]]],
        multimethod: bool,
    ) -> dict[str, list[PreprocessResult]]:
        """Run backend ``backend_id``'s ``preprocess_multimethod(programs, compile_specs)``
        (``multimethod``) or ``preprocess`` (one program) on the server; return its
        ``PreprocessResult`` s by method, as the local backend would.

        Tensors cross once: storages the server holds (from any earlier call) are not
        uploaded, and named data buffers this client sent are not read back. An exception the
        backend raised is raised here with the same built-in class and message.
        """
        self._check_hosted_backend(backend_id)
        blobs: dict[str, memoryview | bytes] = {}
        graphs: set[str] = set()
        request = pb.PreprocessRequest(backend_id=backend_id, multimethod=multimethod)
        for name, eps in programs.items():
            specs = compile_specs[name]
            if len(specs) != len(eps):
                raise ValueError(
                    f"method {name!r} has {len(eps)} programs and {len(specs)} compile spec lists"
                )
            method = request.methods.add(name=name)
            for ep, program_specs in zip(eps, specs, strict=True):
                encoded = self._encode(ep)
                try:
                    node_meta = codec.extra_node_meta(ep)
                except codec.UnrepresentableMeta as e:
                    raise RemotePartitionerError(
                        f"the program cannot be sent for preprocess: {e}",
                        grpc.StatusCode.INVALID_ARGUMENT, errors.Reason.INVALID_PROGRAM.value,
                    ) from e
                message = encoded.message.SerializeToString(deterministic=True)
                ref = digest_of(message)
                blobs.update(encoded.blobs)
                blobs[ref.hash] = message
                graphs |= {d.hash for d in codec.graph_digests(encoded.message)} | {ref.hash}
                method.programs.add(
                    program_digest=ref,
                    compile_specs=[pb.CompileSpec(key=c.key, value=bytes(c.value))
                                   for c in program_specs],
                    node_meta=node_meta,
                )
        digests = [pb.Digest(hash=h, size_bytes=memoryview(b).nbytes) for h, b in blobs.items()]
        # As for the hooks: the backend draws from the caller's generator state, and the
        # state it left comes back (Vulkan's preprocess draws while it traces its patterns).
        request.rng_state = torch.get_rng_state().numpy().tobytes()
        self.stats["preprocess_calls"] += 1
        response = self._call_with_blobs(
            self.stub.Preprocess, lambda: request, blobs, digests, graphs
        )
        apply_rng_state(response)

        def blob(d: pb.Digest) -> bytes:
            local = blobs.get(d.hash)
            if local is not None and memoryview(local).nbytes == d.size_bytes:
                return bytes(local)
            data = self._read_blob(d)
            self.stats["bytes_read"] += len(data)
            return data

        out = {
            m.name: [codec.decode_preprocess_result(r, blob) for r in m.results]
            for m in response.methods
        }
        self.stats["processed_bytes"] += sum(
            r.processed_bytes.size_bytes for m in response.methods for r in m.results
        )
        return out

    def ops_to_not_decompose(
        self, ep: ExportedProgram
    ) -> tuple[list[torch._ops.OpOverload], Callable[[torch.fx.Node], bool] | None]:
        if not self.overrides("ops_to_not_decompose"):
            return super().ops_to_not_decompose(ep)
        response, _ = self._call_hook(
            "OpsToNotDecompose",
            lambda ref: pb.OpsToNotDecomposeRequest(
                partitioner=self._ref(), program_digest=ref
            ),
            ep,
        )
        try:
            ops = [codec.op_from_name(name) for name in response.ops]
        except ValueError as e:
            raise RemotePartitionerError(
                f"the server named an operator this client does not have: {e}"
            ) from e
        if not response.has_filter:
            return ops, None
        nodes = _nodes_by_ref(ep)
        answers: dict[torch.fx.Node, bool | pb.RemoteException] = dict.fromkeys(
            nodes.values(), False
        )
        for ref in response.supported:
            answers[_node(nodes, ref)] = True
        for failure in response.failures:
            answers[_node(nodes, failure.node)] = failure.exception
        return ops, _RemoteFilter(answers, self.partitioner_name)

    def transform_for_pre_decomposition(self, exported_program: ExportedProgram) -> ExportedProgram:
        if not self.overrides("transform_for_pre_decomposition"):
            return super().transform_for_pre_decomposition(exported_program)
        response, encoded = self._call_hook(
            "TransformForPreDecomposition",
            lambda ref: pb.TransformForPreDecompositionRequest(
                partitioner=self._ref(), program_digest=ref
            ),
            exported_program,
        )
        if response.unchanged:
            return exported_program

        def blob(d: pb.Digest) -> bytes | memoryview:
            local = encoded.blobs.get(d.hash)
            return local if local is not None else self._read_blob(d)

        return codec.decode_program(response.program, blob)


def to_backend_remotely(
    server: RemotePartitioner | str,
    backend_id: str,
    edge_program: ExportedProgram,
    compile_specs: Sequence[CompileSpec],
    **options: Any,
) -> Any:
    """Whole-program lowering with the preprocess on the server: what
    ``executorch.exir.backend.backend_api.to_backend(backend_id, edge_program, compile_specs)``
    returns (a ``LoweredBackendModule``), in a process that need not import the backend.

    Args:
        server: a ``RemotePartitioner`` whose connection to use, or a target string (then
            ``options`` are ``RemotePartitioner``'s keyword arguments: ``timeout``, ``token``,
            ``credentials``, ...).
        backend_id: the backend, e.g. ``"XnnpackBackend"``; the server must host it
            (``ListPartitionersResponse.backends``), else ``RemotePartitionerError`` with
            reason ``UNKNOWN_BACKEND`` naming the hosted ids.
        edge_program: an Edge-dialect program.
        compile_specs: the backend's compile specs.
    """
    from executorch.exir.backend.backend_api import to_backend

    client = server if isinstance(server, RemotePartitioner) else RemotePartitioner(
        server, "", **options
    )
    client._check_hosted_backend(backend_id)
    preprocess_routes.install(backend_id, None, wrap_real=True)
    with preprocess_routes.scoped_route(backend_id, client):
        return to_backend(backend_id, edge_program, list(compile_specs))


class _RemoteFilter:
    """The remote ``ops_to_not_decompose`` filter's answers, node by node."""

    def __init__(
        self, answers: dict[torch.fx.Node, bool | pb.RemoteException], partitioner: str
    ) -> None:
        self._answers = answers
        self._partitioner = partitioner

    def __call__(self, node: torch.fx.Node) -> bool:
        try:
            answer = self._answers[node]
        except KeyError:
            raise RemotePartitionerError(
                f"the filter of remote partitioner {self._partitioner!r} was asked about node "
                f"{node.name!r}, which is not in the program it was computed on"
            ) from None
        if isinstance(answer, pb.RemoteException):
            raise remote_exception(
                answer.type, answer.message, answer.traceback, answer.without_arguments
            )
        return answer


def _delegated(
    nodes: Mapping[tuple[str, str], torch.fx.Node],
    tags: Sequence[pb.NodeTag],
    partition_tags: Mapping[str, DelegationSpec],
) -> dict[str, report.Delegated]:
    """Per backend id: its tags, and its tagged call_function nodes (getitem excluded)."""
    partitions: dict[str, set[str]] = {}
    counts: dict[str, int] = {}
    for t in tags:
        spec = partition_tags.get(t.tag)
        if spec is None:
            continue
        partitions.setdefault(spec.backend_id, set()).add(t.tag)
        node = nodes.get((t.node.graph, t.node.name))
        if node is not None and node.op == "call_function" and node.target is not getitem:
            counts[spec.backend_id] = counts.get(spec.backend_id, 0) + 1
    return {
        backend: report.Delegated(partitions=len(tags_), nodes=counts.get(backend, 0))
        for backend, tags_ in sorted(partitions.items())
    }


def _nodes_by_ref(ep: ExportedProgram) -> dict[tuple[str, str], torch.fx.Node]:
    return {
        (path, node.name): node
        for path, gm in codec.graph_modules(ep.graph_module)
        for node in gm.graph.nodes
    }


def _node(nodes: Mapping[tuple[str, str], torch.fx.Node], ref: pb.NodeRef) -> torch.fx.Node:
    try:
        return nodes[(ref.graph, ref.name)]
    except KeyError:
        raise RemotePartitionerError(
            f"the server answered for node {ref.name!r} of graph {ref.graph or '<root>'!r}, "
            "which the program does not have",
            grpc.StatusCode.INTERNAL,
        ) from None
