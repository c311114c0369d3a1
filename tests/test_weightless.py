"""Weights stay home: hooks run on programs whose tensors the client withheld, exactly.

``RemotePartitioner`` sends each hook's program without tensor data; the server rebuilds the
withheld tensors as FakeTensors and watches the hook (server/value_reads.py). These tests host
partitioners that branch on weight values in every way we know of, each swallowing whatever a
FakeTensor raises, so that an unwatched server would silently answer differently from the local
partitioner: the remote ``.pte`` must still equal the local one, because the server noticed and
asked for the data. A partitioner that reads only metadata must get its answer without any
tensor byte crossing.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import _serve, plugin_distribution  # (tests/ is on sys.path)
from executorch.exir import to_edge, to_edge_transform_and_lower
from torch.export import ExportedProgram, export

from remote_partitioner.client import RemotePartitioner
from remote_partitioner.proto import codec
from remote_partitioner.proto.v1 import remote_partitioner_pb2 as pb

#: How each hosted partitioner reads values (see _PLUGIN's ``_peek``).
READS = ["item", "data_ptr", "tolist", "numpy", "repr", "equal", "disabled_torch_function",
         "filter_item", "storage_bytes"]
#: The tests on the plugin server (its own process, a lowering each) are ``slow``; the fast
#: lane keeps the watch's unit test, the codec's and XNNPACK's lowering on the session server.
slow = pytest.mark.slow

_PLUGIN = '''
"""Hosted XNNPACK partitioners whose hooks read weight values and swallow the exceptions a
FakeTensor raises: each delegates only when its look at the values says so."""
import torch
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
from executorch.exir.backend.partitioner import PartitionResult

from remote_partitioner.server.registry import HostedPartitioner


def _tensors(ep):
    return [*ep.state_dict.values(), *ep.constants.values()]


def _peek(how, tensors):
    """True when the values look as the test model's do; never raises (None if unreadable)."""
    try:
        if how in ("item", "filter_item"):
            return all(bool((t > 0).all()) for t in tensors)
        if how == "data_ptr":  # a FakeTensor answers 0: every tensor would seem to alias
            return len({t.data_ptr() for t in tensors}) == len(tensors)
        if how == "tolist":
            return all(min(t.flatten().tolist()) > 0 for t in tensors)
        if how == "numpy":
            return all(float(t.detach().numpy().min()) > 0 for t in tensors)
        if how == "repr":  # a FakeTensor's repr shows no values
            return all("tensor(" in repr(t) for t in tensors)
        if how == "equal":
            return all(torch.equal(t, t.abs()) for t in tensors)
        if how == "disabled_torch_function":
            with torch._C.DisableTorchFunction():
                return all(bool((t > 0).all()) for t in tensors)
        if how == "storage_bytes":
            return all(len(bytes(t.untyped_storage())) > 0 for t in tensors)
        if how == "shapes":
            return all(t.dim() >= 1 and t.dtype == torch.float32 for t in tensors)
    except Exception:
        return None
    raise ValueError(how)


class PeekingPartitioner(XnnpackPartitioner):
    how = "item"

    def ops_to_not_decompose(self, ep):
        ops, check = super().ops_to_not_decompose(ep)
        if self.how == "filter_item":
            tensors = _tensors(ep)

            def filter_(node):
                return bool(_peek(self.how, tensors)) and (check is None or check(node))

            return ops, filter_
        if not _peek(self.how, _tensors(ep)):
            return [], None
        return ops, check

    def partition(self, ep):
        # Locally, partition() sees the program's state_dict as FakeTensors (to_backend's fake
        # copy) and its constants real: it peeks at what it can read there.
        if self.how != "filter_item" and not _peek(self.how, list(ep.constants.values())):
            return PartitionResult(tagged_exported_program=ep, partition_tags={})
        return super().partition(ep)


def _hosted(how):
    cls = type(f"Peeking_{how}", (PeekingPartitioner,), {"how": how})
    return HostedPartitioner(
        f"peek_{how}", "XnnpackBackend", {}, lambda spec: cls(), cls,
        f"XNNPACK, delegating only when a {how} look at the weights says so",
    )


class TransformingPartitioner(XnnpackPartitioner):
    """Its pre-decomposition transform doubles every parameter in place, or (``fresh``)
    replaces them with new tensors computed from nothing."""

    fresh = False

    def transform_for_pre_decomposition(self, ep):
        for name, t in list(ep.state_dict.items()):
            new = torch.full_like(t, 0.5) if self.fresh else t * 2
            ep.state_dict[name] = torch.nn.Parameter(new, requires_grad=False)
        return ep


class FreshTransformingPartitioner(TransformingPartitioner):
    fresh = True


def _lowered_nodes(ep):
    """How many nodes the original programs of ``ep``'s lowered modules hold; never raises
    (None if unreadable)."""
    from executorch.exir.lowered_backend_module import LoweredBackendModule

    try:
        return sum(
            len(m.original_module.graph.nodes)
            for m in ep.graph_module.modules() if isinstance(m, LoweredBackendModule)
        )
    except Exception:
        return None


class LoweredPeekingPartitioner(XnnpackPartitioner):
    """Keeps its operators from decomposition only while it can count the nodes of the
    lowered modules' original programs (as ExecuTorch's check after lowering asks it)."""

    def ops_to_not_decompose(self, ep):
        ops, check = super().ops_to_not_decompose(ep)
        if _lowered_nodes(ep) is None:
            return [], None
        return ops, check


def plugins():
    out = [_hosted(how) for how in READS]
    out.append(HostedPartitioner(
        "doubling", "XnnpackBackend", {}, lambda spec: TransformingPartitioner(),
        TransformingPartitioner, "XNNPACK, doubling the weights before decomposition",
    ))
    out.append(HostedPartitioner(
        "fresh_weights", "XnnpackBackend", {}, lambda spec: FreshTransformingPartitioner(),
        FreshTransformingPartitioner, "XNNPACK, replacing the weights before decomposition",
    ))
    out.append(HostedPartitioner(
        "peek_lowered", "XnnpackBackend", {}, lambda spec: LoweredPeekingPartitioner(),
        LoweredPeekingPartitioner, "XNNPACK, reading lowered modules' original programs",
    ))
    return out


READS = %r + ["shapes"]
'''


@pytest.fixture(scope="module")
def peeking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    """A server hosting the plugin's partitioners (``peek_<how>``, ``doubling``,
    ``fresh_weights``, ``peek_lowered``), and the plugin module for the local lowerings."""
    root = tmp_path_factory.mktemp("peek_plugin")
    with plugin_distribution(root, "rp_peek_plugin", _PLUGIN % READS,
                             "peek = rp_peek_plugin:plugins"):
        import rp_peek_plugin  # type: ignore[import-not-found]

        with _serve(tmp_path_factory, "--result-cache-bytes", "0") as (_, target):
            yield target, rp_peek_plugin


class _Positive(torch.nn.Module):
    """Two linear layers and two constants, all positive (so every peek says yes)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(p.abs() + 0.01)
        # Non-persistent buffers are constants: real in the program partition() sees.
        self.register_buffer("offset", torch.full((4,), 0.25), persistent=False)
        self.register_buffer("scale", torch.full((4,), 1.5), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.fc2(torch.relu(self.fc1(x))) + self.offset) * self.scale


def _program() -> ExportedProgram:
    torch.manual_seed(0)
    return export(_Positive().eval(), (torch.randn(2, 8),), strict=True)


def _local_pte(partitioner: object, ep: ExportedProgram) -> bytes:
    return bytes(to_edge_transform_and_lower(
        copy.deepcopy(ep), partitioner=[partitioner]
    ).to_executorch().buffer)


def _local_partitioner(plugin: object, name: str) -> object:
    for hosted in plugin.plugins():  # type: ignore[attr-defined]
        if hosted.name == name:
            return hosted.factory({})
    raise KeyError(name)


@pytest.fixture(scope="module")
def shapes_pte(peeking_server: tuple[str, object]) -> bytes:
    """The local ``.pte`` of ``peek_shapes``, which says yes from shapes and dtypes alone:
    what any peek that says yes lowers to (the delegated one)."""
    return _local_pte(_local_partitioner(peeking_server[1], "peek_shapes"), _program())


@slow
@pytest.mark.parametrize("how", READS)
def test_value_reading_hook_gets_the_local_answer(
    peeking_server: tuple[str, object], shapes_pte: bytes, how: str
) -> None:
    """Each way of reading weight values, its exception swallowed, is noticed: the server asks
    for the data and the remote ``.pte`` equals the local one (which is delegated: the peek
    said yes). Without the watch, the hook would have seen no values and delegated nothing."""
    target, plugin = peeking_server
    ep = _program()
    local = _local_pte(_local_partitioner(plugin, f"peek_{how}"), ep)
    assert local == shapes_pte, "the peek said no locally: the test shows nothing"

    remote = RemotePartitioner(target, f"peek_{how}")
    pte = bytes(to_edge_transform_and_lower(ep, partitioner=[remote]).to_executorch().buffer)
    assert pte == local
    # (The weights cross once per server: later variants find them held.)
    assert remote.stats["tensor_data_requests"] >= 1, remote.stats


@slow
def test_peek_would_differ_on_fakes(peeking_server: tuple[str, object]) -> None:
    """The adversary is real: run on the program with its tensors faked, as an unwatched
    server would, each peek answers something other than what it answers on the real one."""
    _, plugin = peeking_server
    ep = _program()
    mode = torch._subclasses.fake_tensor.FakeTensorMode()
    fakes = [mode.from_tensor(t) for t in (*ep.state_dict.values(), *ep.constants.values())]
    real = [*ep.state_dict.values(), *ep.constants.values()]
    for how in READS:
        assert plugin._peek(how, real) is True, how  # type: ignore[attr-defined]
        assert plugin._peek(how, fakes) is not True, how  # type: ignore[attr-defined]


@slow
def test_metadata_only_hooks_send_no_tensor_bytes(
    peeking_server: tuple[str, object], shapes_pte: bytes
) -> None:
    """A partitioner that looks only at shapes and dtypes gets its answer from the withheld
    program: no tensor data is asked for or uploaded, and the ``.pte`` is the local one."""
    target, _ = peeking_server
    ep = _program()
    local = shapes_pte
    remote = RemotePartitioner(target, "peek_shapes")
    pte = bytes(to_edge_transform_and_lower(ep, partitioner=[remote]).to_executorch().buffer)
    assert pte == local
    assert remote.stats["tensor_data_requests"] == 0, remote.stats
    assert remote.stats["tensor_bytes_uploaded"] == 0, remote.stats
    assert remote.stats["withheld_calls"] >= 3, remote.stats


def test_xnnpack_hooks_send_no_tensor_bytes(server_address: str) -> None:
    """The hosted XNNPACK partitioner decides from the graph: a lowering uploads graphs only,
    and gives the local ``.pte``."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    ep = _program()
    local = _local_pte(XnnpackPartitioner(), ep)
    remote = RemotePartitioner(server_address, "xnnpack")
    pte = bytes(to_edge_transform_and_lower(ep, partitioner=[remote]).to_executorch().buffer)
    assert pte == local
    assert remote.stats["tensor_bytes_uploaded"] == 0, remote.stats
    assert remote.stats["tensor_data_requests"] == 0, remote.stats
    assert remote.stats["bytes_uploaded"] == remote.stats["graph_bytes_uploaded"] > 0


@slow
def test_withholding_off_sends_the_weights(server_address: str) -> None:
    """``withhold_tensors=False`` is the v1 behaviour: the weights cross, the answer is the
    same."""
    ep = _program()
    on = RemotePartitioner(server_address, "xnnpack")
    off = RemotePartitioner(server_address, "xnnpack", withhold_tensors=False)
    a = bytes(to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[on])
              .to_executorch().buffer)
    b = bytes(to_edge_transform_and_lower(copy.deepcopy(ep), partitioner=[off])
              .to_executorch().buffer)
    assert a == b
    assert off.stats["withheld_calls"] == 0
    # This model's weights cross only here: the other tests withhold them.
    weights = sum(t.untyped_storage().nbytes() for t in ep.state_dict.values())
    assert off.stats["tensor_bytes_uploaded"] >= weights, off.stats
    assert on.stats["tensor_bytes_uploaded"] == 0, on.stats


@slow
@pytest.mark.parametrize("name", ["doubling", "fresh_weights"])
def test_transform_that_changes_tensors_returns_them(
    peeking_server: tuple[str, object], name: str
) -> None:
    """A pre-decomposition transform that changes the weights (computed from them, or new)
    returns a program with the transformed weights, as the local transform does, and the
    lowering gives the local ``.pte``."""
    target, plugin = peeking_server
    ep = _program()
    local_partitioner = _local_partitioner(plugin, name)
    expected = local_partitioner.transform_for_pre_decomposition(  # type: ignore[attr-defined]
        copy.deepcopy(ep)
    )
    remote = RemotePartitioner(target, name)
    got = remote.transform_for_pre_decomposition(copy.deepcopy(ep))
    assert got.state_dict.keys() == expected.state_dict.keys()
    for key, value in expected.state_dict.items():
        assert torch.equal(got.state_dict[key], value), key
    assert not torch.equal(got.state_dict["fc1.weight"], ep.state_dict["fc1.weight"])
    assert remote.stats["tensor_data_requests"] == 1, remote.stats

    local = _local_pte(_local_partitioner(plugin, name), ep)
    pte = bytes(to_edge_transform_and_lower(
        copy.deepcopy(ep), partitioner=[RemotePartitioner(target, name)]
    ).to_executorch().buffer)
    assert pte == local


def _lowered_program() -> ExportedProgram:
    """``_program()`` lowered to XNNPACK locally: one delegate call and its lowered module."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return to_edge_transform_and_lower(
        _program(), partitioner=[XnnpackPartitioner()]
    ).exported_program()


def test_hooks_on_a_lowered_program_send_no_lowered_program(server_address: str) -> None:
    """The hook ExecuTorch calls after lowering (``ops_to_not_decompose`` on the lowered
    program) sends the lowered module without its original program: XNNPACK's answer, its
    operators and its filter's verdict on every node, is the local one, nothing is asked for
    again, and what is sent is a fraction of the whole encoding."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    lowered = _lowered_program()
    local_ops, local_check = XnnpackPartitioner().ops_to_not_decompose(lowered)
    remote = RemotePartitioner(server_address, "xnnpack")
    ops, check = remote.ops_to_not_decompose(lowered)
    assert set(ops) == set(local_ops) and ops
    assert (check is None) == (local_check is None)
    if check is not None and local_check is not None:
        nodes = [n for n in lowered.graph.nodes if n.op == "call_function"]
        assert [check(n) for n in nodes] == [local_check(n) for n in nodes]
    assert remote.stats["withheld_lowered_modules"] == 1, remote.stats
    assert remote.stats["tensor_data_requests"] == 0, remote.stats

    def size(encoded: codec.EncodedProgram) -> int:
        return sum(len(b) for b in encoded.blobs.values()) + encoded.message.ByteSize()

    # (What the server already holds is not uploaded again: compare what is sent.)
    sent = size(codec.encode_program(lowered, withhold=True, withhold_lowered=True))
    assert sent < size(codec.encode_program(lowered, withhold=True)) / 2


@slow
def test_hook_reading_a_lowered_program_gets_the_local_answer(
    peeking_server: tuple[str, object]
) -> None:
    """A hosted hook that reads a lowered module's original program, swallowing what the
    stand-in raises, is noticed: the server asks for the program whole and the answer is the
    local one (operators kept), as is the whole lowering's ``.pte``. Unwatched, the stand-in
    would have made it keep none."""
    from remote_partitioner.server import value_reads

    target, plugin = peeking_server
    lowered = _lowered_program()
    local = _local_partitioner(plugin, "peek_lowered")
    local_ops, _ = local.ops_to_not_decompose(lowered)  # type: ignore[attr-defined]
    assert local_ops, "the local hook kept no operators: the test shows nothing"
    stand_in = value_reads.withheld_lowered_module_class()("lowered_module_0", "XnnpackBackend", [])
    root = torch.nn.Module()
    root.add_module("lowered_module_0", stand_in)
    unwatched = type("P", (), {"graph_module": root})()
    assert plugin._lowered_nodes(unwatched) is None  # type: ignore[attr-defined]

    remote = RemotePartitioner(target, "peek_lowered")
    ops, _ = remote.ops_to_not_decompose(lowered)
    assert set(ops) == set(local_ops)
    assert remote.stats["tensor_data_requests"] == 1, remote.stats
    assert remote.stats["withheld_lowered_modules"] == 1, remote.stats

    ep = _program()
    pte = bytes(to_edge_transform_and_lower(
        copy.deepcopy(ep), partitioner=[RemotePartitioner(target, "peek_lowered")]
    ).to_executorch().buffer)
    assert pte == _local_pte(_local_partitioner(plugin, "peek_lowered"), ep)


def test_withheld_lowered_programs_are_read_watched_or_refused() -> None:
    """A lowered module sent without its original program decodes, with a withheld mode, to a
    stand-in with the client's backend id and compile specs whose program cannot be read
    unnoticed (the read is recorded even when its exception is swallowed); without a withheld
    mode, or with the program also sent, the message is refused."""
    from remote_partitioner.server import value_reads

    lowered = _lowered_program()
    encoded = codec.encode_program(lowered, withhold=True, withhold_lowered=True)
    (entry,) = encoded.message.lowered_modules
    assert entry.original_withheld and not entry.HasField("original_program")
    assert set(encoded.blobs) == {encoded.message.graph.hash}
    assert codec.has_withheld(encoded.message)

    def decode(message: pb.Program, withheld: object = None) -> ExportedProgram:
        return codec.decode_program(message, lambda d: encoded.blobs[d.hash],
                                    withheld=withheld)  # type: ignore[arg-type]

    decoded = decode(encoded.message, value_reads.Withheld())
    (stand_in,) = [m for _, m in decoded.graph_module.named_children()
                   if type(m) is value_reads.withheld_lowered_module_class()]
    original = lowered.graph_module.lowered_module_0
    assert stand_in.backend_id == original.backend_id
    assert [(c.key, c.value) for c in stand_in.compile_specs] == [
        (c.key, bytes(c.value)) for c in original.compile_specs]
    with value_reads.watching() as reads:
        _ = (stand_in.backend_id, stand_in.compile_specs, stand_in.processed_bytes)
    assert not reads
    for read in (lambda: stand_in.original_module, lambda: stand_in.program(),
                 lambda: copy.deepcopy(stand_in)):
        with value_reads.watching() as reads, contextlib.suppress(Exception):
            read()
        assert reads and reads.tensor == "lowered_module_0", read
        assert "lowered module 'lowered_module_0'" in reads.describe()
    with pytest.raises(value_reads.TensorDataRequired, match="lowered_module_0"):
        _ = stand_in.original_module

    # Its tensors sent, only its lowered program withheld: refused where nothing may be.
    real = codec.encode_program(lowered, withhold_lowered=True)
    assert real.message.lowered_modules[0].original_withheld
    with pytest.raises(codec.ProgramDecodeError, match="withholds its original program"):
        codec.decode_program(real.message, lambda d: real.blobs[d.hash])
    both = pb.Program()
    both.CopyFrom(encoded.message)
    both.lowered_modules[0].original_program.CopyFrom(
        codec.encode_program(lowered, withhold=True).message.lowered_modules[0].original_program
    )
    with pytest.raises(codec.ProgramDecodeError, match="also carries it"):
        decode(both, value_reads.Withheld())


def test_withheld_tensors_keep_their_sharing_and_metadata() -> None:
    """A withheld encoding carries no tensor bytes and no storage digests; decoded with fakes,
    tied weights share one storage again, and every tensor's metadata is the client's."""
    from remote_partitioner.server import value_reads

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Linear(4, 4, bias=False)
            self.b = torch.nn.Linear(4, 4, bias=False)
            self.b.weight = self.a.weight
            base = torch.arange(8.0)
            # Two views of one storage.
            self.register_buffer("evens", base[::2])
            self.register_buffer("odds", base[1::2])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.b(self.a(x)) + self.evens * self.odds

    ep = export(Tied().eval(), (torch.randn(2, 4),), strict=True)
    encoded = codec.encode_program(ep, withhold=True)
    refs = [*encoded.message.state_dict, *encoded.message.constants]
    assert refs and all(r.withheld and not r.HasField("storage") for r in refs)
    assert set(encoded.blobs) == {d.hash for d in codec.graph_digests(encoded.message)}
    assert encoded.withheld_bytes == sum(
        {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
         for t in (*ep.state_dict.values(), *ep.constants.values())}.values()
    )

    decoded = codec.decode_program(encoded.message, lambda d: encoded.blobs[d.hash],
                                   withheld=value_reads.Withheld())
    for name, t in (*ep.state_dict.items(), *ep.constants.items()):
        got = {**decoded.state_dict, **decoded.constants}[name]
        assert value_reads.is_withheld(got), name
        assert (got.shape, got.stride(), got.dtype, got.storage_offset()) == (
            t.shape, t.stride(), t.dtype, t.storage_offset()), name
        assert isinstance(got, torch.nn.Parameter) == isinstance(t, torch.nn.Parameter)

    def sharing(program: ExportedProgram, key: object) -> set[tuple[str, str]]:
        tensors = {**program.state_dict, **program.constants}
        return {(m, n) for m in tensors for n in tensors
                if m < n and key(tensors[m]) == key(tensors[n])}

    shared = sharing(ep, lambda t: t.untyped_storage().data_ptr())
    assert shared == {("a.weight", "b.weight"), ("evens", "odds")}  # tied, and two views
    assert sharing(decoded, lambda t: t.untyped_storage()._cdata) == shared
    assert decoded.state_dict.keys() == ep.state_dict.keys()

    with pytest.raises(codec.ProgramDecodeError, match="withheld"):
        codec.decode_program(encoded.message, lambda d: encoded.blobs[d.hash])


def test_watch_sees_every_use_but_metadata() -> None:
    """The watch records the first use of a withheld tensor that is not metadata, and nothing
    for shape, dtype, strides; tensors that are not withheld are never recorded."""
    from remote_partitioner.server import value_reads

    mode = value_reads.WithheldFakeMode()
    with mode:
        fake = torch.empty(3, 4)
    w = value_reads.mark_withheld(fake, "w")
    other = torch.ones(2)
    with value_reads.watching() as reads:
        _ = (w.shape, w.dtype, w.stride(), w.dim(), w.numel(), w.device, w.size(0), len(w))
        _ = other.sum().item()
    assert not reads
    for use in (lambda: w.data_ptr(), lambda: w + 1, lambda: repr(w), lambda: w.clone(),
                lambda: w.untyped_storage(), lambda: torch.sum(w)):
        with value_reads.watching() as reads, contextlib.suppress(Exception):
            use()
        assert reads and reads.tensor == "w", reads.describe() if reads else use


def test_preprocess_refuses_withheld_programs(server_address: str, tmp_path: Path) -> None:
    """``Preprocess`` needs the data: a program that withholds it is INVALID_ARGUMENT, naming
    the tensor."""
    import grpc

    from remote_partitioner.proto.digests import digest_of
    from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

    ep = to_edge(_program()).exported_program()
    encoded = codec.encode_program(ep, withhold=True)
    message = encoded.message.SerializeToString(deterministic=True)
    ref = digest_of(message)
    blobs = {**encoded.blobs, ref.hash: message}
    with grpc.insecure_channel(server_address) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        for h, data in blobs.items():
            stub.UploadBlobs(iter([pb.UploadBlobsRequest(
                digest=pb.Digest(hash=h, size_bytes=len(data)), offset=0, data=bytes(data))]))
        request = pb.PreprocessRequest(backend_id="XnnpackBackend")
        request.methods.add(name="forward").programs.add(program_digest=ref)
        with pytest.raises(grpc.RpcError) as e:
            stub.Preprocess(request, timeout=120)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "withheld" in (e.value.details() or "")


def test_malformed_withheld_refs_are_refused() -> None:
    """A withheld ref that also names a storage, declares its storage number with two sizes,
    or reaches beyond its declared storage is a ProgramDecodeError naming the tensor."""
    from remote_partitioner.server import value_reads

    ep = export(torch.nn.Linear(4, 3).eval(), (torch.randn(2, 4),), strict=True)
    encoded = codec.encode_program(ep, withhold=True)

    def decode(message: pb.Program) -> None:
        codec.decode_program(message, lambda d: encoded.blobs[d.hash],
                             withheld=value_reads.Withheld())

    decode(encoded.message)  # well-formed
    cases = {
        "also names a storage": lambda r: r.storage.CopyFrom(encoded.message.graph),
        "reaches beyond": lambda r: setattr(r, "withheld_storage_bytes", 4),
        "negative": lambda r: setattr(r, "withheld_storage_bytes", -1),
    }
    for expected, spoil in cases.items():
        message = pb.Program()
        message.CopyFrom(encoded.message)
        spoil(message.state_dict[0])
        with pytest.raises(codec.ProgramDecodeError, match=expected):
            decode(message)
    message = pb.Program()
    message.CopyFrom(encoded.message)
    message.state_dict[1].withheld_storage = message.state_dict[0].withheld_storage
    with pytest.raises(codec.ProgramDecodeError, match="declared with"):
        decode(message)


@slow
def test_tensor_data_required_on_the_wire(peeking_server: tuple[str, object]) -> None:
    """The status a raw client sees: FAILED_PRECONDITION, reason TENSOR_DATA_REQUIRED, the
    tensor and its use named in the message and the ErrorInfo metadata."""
    import grpc

    from remote_partitioner.client.errors import from_rpc_error
    from remote_partitioner.proto.v1 import remote_partitioner_pb2_grpc as pb_grpc

    target, _ = peeking_server
    encoded = codec.encode_program(_program(), withhold=True)
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.RemotePartitionerStub(channel)
        assert stub.ListPartitioners(pb.ListPartitionersRequest()).accepts_withheld_tensors
        for h, data in encoded.blobs.items():  # the graphs: no tensor data
            stub.UploadBlobs(iter([pb.UploadBlobsRequest(
                digest=pb.Digest(hash=h, size_bytes=len(data)), offset=0, data=bytes(data))]))
        with pytest.raises(grpc.RpcError) as e:
            stub.OpsToNotDecompose(pb.OpsToNotDecomposeRequest(
                partitioner=pb.PartitionerRef(name="peek_item"), program=encoded.message,
            ), timeout=120)
    error = from_rpc_error(e.value)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.reason == "TENSOR_DATA_REQUIRED"
    names = {r.name for r in (*encoded.message.state_dict, *encoded.message.constants)}
    assert error.metadata["tensor"] in names
    assert error.metadata["operation"]
    assert error.metadata["tensor"] in (e.value.details() or "")
