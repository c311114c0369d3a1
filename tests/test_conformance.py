"""A fixed, representative subset of ExecuTorch's backend conformance suite, each test run
with its flow and the flow's remote twin against a real server (``scripts/conformance.py``;
``make conformance`` runs all of it): the same outcome, ``.pte`` bytes and random generator
state after lowering, for XNNPACK (float and quantized), Core ML and Vulkan."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from script_modules import conformance_script

ROOT = Path(__file__).resolve().parent.parent
#: (flows, -k expression, more arguments): six operator tests over XNNPACK (float and
#: quantized), Core ML, quantized Vulkan and WebGPU, in two processes sharing the server as `make
#: conformance` runs; and Vulkan's with the backend's preprocess on the server too (it draws
#: from the random generator). The bidirectional LSTM the suite found
#: is tests/test_conformance_regressions.py's; Core ML's quantized flow is left to
#: `make conformance`: one of its tests takes almost 3 minutes. Then quantized XNNPACK and
#: Vulkan with the quantize stage remote too (``--remote-quantizer``) on an add, a linear and a
#: conv (Vulkan's default quantizer quantizes linear weights only; XNNPACK's all three).
SUBSET: tuple[tuple[list[str], str, list[str]], ...] = (
    # Five flows in one run (each run starts by importing the suite and every backend).
    (["xnnpack", "xnnpack_static_int8_per_tensor", "coreml", "vulkan_static_int8_per_channel",
      "webgpu"],
     "(test_add_f32_alpha and not int8_per_tensor) or (test_conv2d_basic and xnnpack)",
     ["--jobs", "2"]),
    (["vulkan"], "test_add_f32_alpha", ["--remote-preprocess"]),
    (["xnnpack_static_int8_per_channel", "vulkan_static_int8_per_channel"],
     "test_add_f32_alpha or test_linear_unbatched or test_conv2d_basic", ["--remote-quantizer"]),
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flows", "keyword", "more"), SUBSET,
    ids=["+".join(s[0]) + "".join(s[2]).replace("--remote-preprocess", "-server-preprocess")
         .replace("--remote-quantizer", "-remote-quantizer").replace("--jobs", "-jobs")
         for s in SUBSET],
)
def test_conformance_subset(
    flows: list[str], keyword: str, more: list[str], server_address: str, tmp_path: Path
) -> None:
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "conformance.py"), "--server", server_address,
         "--suite", "operators", "--flows", *flows, "-k", keyword, "--json", str(out), *more],
        capture_output=True, text=True, timeout=1500, check=False,
    )
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    compared = result["comparisons"]
    assert compared, proc.stdout[-3000:]
    conformance = conformance_script()
    suffix = conformance.flow_suffix(
        remote_quantizer="--remote-quantizer" in more,
        remote_preprocess="--remote-preprocess" in more)
    assert {c["flow"] for c in compared} == {f + suffix for f in flows}, proc.stdout[-3000:]
    differing = [c for c in compared if not c["identical"]]
    assert not differing, json.dumps(differing, indent=1)
    assert proc.returncode == 0, proc.stdout[-3000:]
    finished = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()
                if '"complete"' in line]
    assert any(t["outcome"] == "passed" for t in finished), finished
    if "--remote-quantizer" in more:
        # The twin quantized with the RemoteQuantizer that rebuilds the flow's quantizer, the
        # flow with its own, and the two programs lowered to the same bytes.
        specs = {"xnnpack_static_int8_per_channel":
                 "RemoteQuantizer('xnnpack', {'is_per_channel': True})",
                 "vulkan_static_int8_per_channel": "RemoteQuantizer('vulkan', {})"}
        for c in compared:
            flow = c["flow"].removesuffix(suffix)
            assert c["remote"]["quantizer"] == specs[flow], c
            assert c["local"]["quantizer"] in ("XNNPACKQuantizer", "VulkanQuantizer"), c
            assert c["local"]["pte_sha256"] == c["remote"]["pte_sha256"] is not None, c
    if "--jobs" in more:
        # Each test ran in exactly one of the processes, and the merged report holds them all.
        jobs = int(more[more.index("--jobs") + 1])
        complete = [json.loads(line)["test"] for line in out.with_suffix(".jsonl")
                    .read_text().splitlines() if '"complete"' in line]
        assert len(complete) == len(set(complete)) == 6, complete
        assert {c["test"] for c in compared} == set(complete)
        assert all(f"[{i}/{jobs}] " in proc.stdout for i in range(1, jobs + 1)), proc.stdout
        assert not list(tmp_path.glob("*.shard*.json"))  # merged, then removed


def test_remote_quantizer_spec_is_derived_from_the_quantizer_object() -> None:
    """``--remote-quantizer`` replaces a quantize stage's quantizer by the ``RemoteQuantizer``
    whose hosted quantizer and spec rebuild that very object (``quantizer_spec``): the spec
    whose ``get_symmetric_quantization_config`` call returns the quantizer's global config
    itself (XNNPACK, Vulkan), or ``{}`` for the Core ML tester's config; each quantizing flow's
    stage gets its own spec, and a quantizer no spec rebuilds (a config made by another call,
    another setting) is a TypeError naming it, never another quantizer."""
    pytest.importorskip("coremltools")
    import torch
    from executorch.backends.test.harness.stages import StageType
    from executorch.backends.test.suite.flow import all_flows
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    conformance = conformance_script()
    spec_of = conformance.quantizer_spec
    flows = all_flows()
    specs = {}
    for name in conformance.QUANTIZING_FLOWS:
        if name not in conformance.HOSTED_FLOWS:  # another environment's (test_openvino.py)
            continue
        flow = flows[name]
        if flow.quantize_stage_factory is not None:  # what the suite's runner quantizes with
            stage = flow.quantize_stage_factory()
        else:  # the tester's default stage (Core ML)
            tester = flow.tester_factory(torch.nn.Linear(2, 2), (torch.randn(1, 2),))
            stage = tester._get_default_stage(StageType.QUANTIZE)
        specs[name] = spec_of(stage.quantizer)
    assert specs == {
        "xnnpack_static_int8_per_channel": ("xnnpack", {"is_per_channel": True}),
        "xnnpack_static_int8_per_tensor": ("xnnpack", {"is_per_channel": False}),
        "xnnpack_dynamic_int8_per_channel": ("xnnpack", {"is_per_channel": True,
                                                         "is_dynamic": True}),
        "coreml_static_int8": ("coreml", {}),
        "vulkan_static_int8_per_channel": ("vulkan", {}),
    }
    assert {f for f, flow in flows.items() if flow.quantize and f in
            conformance.HOSTED_FLOWS} == set(specs)
    config = get_symmetric_quantization_config
    for quantizer in (
        XNNPACKQuantizer().set_global(config(True)),  # positional: another cache entry
        XNNPACKQuantizer().set_global(config(act_qmin=-127)),  # not a candidate
        XNNPACKQuantizer().set_global(config(is_per_channel=True))
        .set_module_type(torch.nn.Linear, None),
        XNNPACKQuantizer(),
        torch.nn.Linear(2, 2),
    ):
        with pytest.raises(TypeError, match=type(quantizer).__name__):
            spec_of(quantizer)


@pytest.mark.slow
def test_a_test_that_times_out_stops_the_run(server_address: str, tmp_path: Path) -> None:
    """A pytest-timeout leaves torch broken for the rest of the process: the run stops at the
    first, says so, exits non-zero, and logs nothing it did not compare as complete."""
    out = tmp_path / "conformance.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "conformance.py"), "--server", server_address,
         "--suite", "operators", "--flows", "xnnpack", "-k",
         "test_add_f32_alpha or test_conv2d_basic", "--timeout-factor", "0.001",  # 0.12 s
         "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "timed out" in proc.stdout and "--resume" in proc.stdout, proc.stdout[-3000:]
    lines = [json.loads(line) for line in out.with_suffix(".jsonl").read_text().splitlines()]
    # Which test times out depends on the machine and on what the shared server has cached
    # (a cached answer can beat any timeout): whichever it is, it is the only one and the last
    # one logged (the run stopped there), and its comparisons do not count.
    timed_out = [line["test"] for line in lines if line.get("timed_out")]
    assert len(timed_out) == 1 and lines[-1]["test"] == timed_out[0], lines
    stopped_at = timed_out[0]
    assert f"stopped after {stopped_at} timed out" in proc.stdout, proc.stdout[-3000:]
    log = conformance_script().read_log([out.with_suffix(".jsonl")])
    assert stopped_at not in {t["test"] for t in log["complete"]}, log
    assert stopped_at in {t["test"] for t in log["uncompared"]}, log
    assert not [c for c in log["comparisons"] if c["test"] == stopped_at], log


def test_coreml_counter_named_operations_compare_by_position() -> None:
    """Two local Core ML lowerings in one process name the transposes and constants
    coremltools' ``reduce_transposes`` pass creates in an order of their own (measured: the
    suite's ``convnext_small``, four lowerings from coremltools' fresh state, four programs).
    ``normalize_coreml`` renumbers exactly those names, by first appearance, and leaves every
    other difference: other numbers, and ExecuTorch's own node names."""
    normalize = conformance_script().normalize_coreml

    def program(*names: str) -> bytes:  # protobuf string fields, as the MIL program holds names
        return b"".join(b"\x0a" + bytes([len(n)]) + n.encode() for n in names)

    local = program("transpose_0", "transpose_0_perm_0", "const_357_to_fp16", "transpose_2",
                    "transpose_2_perm_0", "const_355_to_fp16", "aten_add_tensor_1",
                    "aten_add_tensor_2", "my_const_1", "my_const_2")
    remote = program("transpose_2", "transpose_2_perm_0", "const_355_to_fp16", "transpose_0",
                     "transpose_0_perm_0", "const_357_to_fp16", "aten_add_tensor_1",
                     "aten_add_tensor_2", "my_const_1", "my_const_2")
    assert local != remote
    assert normalize(local) == normalize(remote)
    assert normalize(local, across_processes=True) == normalize(remote, across_processes=True)
    assert normalize(local) != normalize(local.replace(b"transpose_2", b"transpose_3"))

    def swap(data: bytes, a: bytes, b: bytes) -> bytes:
        return data.replace(a, b"\0").replace(b, a).replace(b"\0", b)

    for swapped in (swap(local, b"aten_add_tensor_1", b"aten_add_tensor_2"),
                    swap(local, b"my_const_1", b"my_const_2")):
        assert swapped != local
        assert normalize(swapped) != normalize(local)


def test_coreml_maps_compare_in_any_order_among_other_bytes() -> None:
    """Across processes, runs of protobuf map entries (the Core ML model's metadata, a MIL
    operation's inputs and attributes) compare in any order, nested too, wherever they sit among
    other bytes (weights: random bytes, where tags occur by chance), and nothing else does."""
    sorted_entries = conformance_script()._sorted_entries
    rng = random.Random(0)
    noise = bytes(rng.randrange(256) for _ in range(1 << 16))

    def entry(tag: bytes, key: bytes, value: bytes) -> bytes:  # a map entry: key 1, value 2
        payload = b"\x0a" + bytes([len(key)]) + key + b"\x12" + bytes([len(value)]) + value
        return tag + bytes([len(payload)]) + payload

    def program(inner: list[bytes], outer: list[bytes]) -> bytes:
        run = [entry(b"\x1a", b"conv", b"".join(inner)), *outer]
        return noise[:40000] + b"".join(run) + noise[40000:]

    inner = [entry(b"\x22", b"x", b"a"), entry(b"\x22", b"weight", b"bb")]
    outer = [entry(b"\x1a", b"k%d" % i, b"v%d" % i) for i in range(3)]
    a = program(inner, outer)
    b = program(inner[::-1], [outer[2], outer[0], outer[1]])
    assert a != b
    assert sorted_entries(a) == sorted_entries(b)
    assert len(sorted_entries(a)) == len(a)
    changed = program(inner, [*outer[:2], entry(b"\x1a", b"k2", b"v3")])
    assert sorted_entries(changed) != sorted_entries(a)
    assert sorted_entries(a[:-1] + b"\x00") != sorted_entries(a)


def test_accumulated_logs_count_complete_tests_only(tmp_path: Path) -> None:
    """A long run is resumed over several sittings (``--resume``): the summary of the logs
    counts each test's comparisons once (its last complete run) and leaves out a test that was
    interrupted before it completed, one that failed without a comparison (a process a
    pytest-timeout left broken fails every later test before it lowers anything), and one that
    timed out."""
    conformance = conformance_script()

    def comparison(test: str, identical: bool, subtest: int = 0) -> dict[str, object]:
        side = {"result": "SUCCESS", "lower_seconds": 1.0}
        return {"test": test, "flow": "xnnpack", "subtest": subtest, "identical": identical,
                "differences": [] if identical else [".pte: differ"], "local": side,
                "remote": side, "commit": "abc"}

    def complete(test: str, outcome: str = "passed") -> dict[str, object]:
        return {"test": test, "flow": "xnnpack", "complete": True, "outcome": outcome}

    first = tmp_path / "a.jsonl"
    first.write_text("\n".join(json.dumps(x) for x in [
        comparison("t1[xnnpack]", False), complete("t1[xnnpack]"),
        comparison("t2[xnnpack]", True), comparison("t2[xnnpack]", True, 1),
        complete("t2[xnnpack]"),
        comparison("t3[xnnpack]", False),  # interrupted: never complete
        complete("t4[xnnpack]", "failed"),  # failed before any lowering: not complete
        comparison("t5[xnnpack]", True), complete("t5[xnnpack]", "failed"),
        # timed out after a comparison: not complete either (--resume runs it again)
        comparison("t6[xnnpack]", True), {**complete("t6[xnnpack]", "failed"), "timed_out": True},
    ]))
    second = tmp_path / "b.jsonl"  # t1 again, identical now; and a test of the models suite
    model = "test_alexnet[xnnpack-static_shapes-float32]"
    second.write_text("\n".join(json.dumps(x) for x in [
        comparison("t1[xnnpack]", True), complete("t1[xnnpack]"),
        comparison(model, True), complete(model),
        # t7 interrupted after two comparisons, then run again whole: its second run only
        comparison("t7[xnnpack]", False), comparison("t7[xnnpack]", False, 1),
        comparison("t7[xnnpack]", True), complete("t7[xnnpack]")]))
    log = conformance.read_log([first, second])
    assert sorted(c["test"] for c in log["comparisons"]) == [
        "t1[xnnpack]", "t2[xnnpack]", "t2[xnnpack]", "t5[xnnpack]", "t7[xnnpack]", model]
    assert [t["test"] for t in log["uncompared"]] == ["t4[xnnpack]", "t6[xnnpack]"]
    text, differing = conformance.summarize_logs(
        [first, second], ["xnnpack"])
    assert differing == 0, text
    rows = conformance.log_table(log, ["xnnpack"])
    assert list(rows) == ["xnnpack, operators", "xnnpack, models"]
    assert {k: rows["xnnpack, operators"][k] for k in ("complete", "tests", "identical")} == {
        "complete": 4, "tests": 5, "identical": 5}
    assert {k: rows["xnnpack, models"][k] for k in ("complete", "tests", "identical")} == {
        "complete": 1, "tests": 1, "identical": 1}
    assert ("timed out or failed without a comparison (not complete, --resume reruns them): "
            "xnnpack, operators 2") in text
    _, differing = conformance.summarize_logs([first], ["xnnpack"])
    assert differing == 1


def _quantizer_memo_case(backend: str) -> tuple[object, str, str, type, int]:
    """(the quantizer's utils module, the name of its pattern export there, the runner's memo
    installer, the backend's tester, the fewest exports a first quantization makes)."""
    if backend == "coreml":
        pytest.importorskip("coremltools")
        from executorch.backends.apple.coreml.quantizer import _coreml_quantizer_utils
        from executorch.backends.apple.coreml.test.tester import CoreMLTester

        return (_coreml_quantizer_utils, "_get_aten_graph_module",
                "memoize_coreml_pattern_graphs", CoreMLTester, 100)
    from executorch.backends.xnnpack.quantizer import xnnpack_quantizer_utils
    from executorch.backends.xnnpack.test.tester import Tester

    return (xnnpack_quantizer_utils, "_get_aten_graph_module_for_pattern",
            "memoize_xnnpack_pattern_graphs", Tester, 4)


@pytest.mark.conformance
@pytest.mark.parametrize("backend", ["coreml", "xnnpack"])
def test_memoized_quantizer_pattern_graphs_quantize_the_same(backend: str) -> None:
    """The runner exports each of a quantizer's pattern graphs once per process
    (``memoize_coreml_pattern_graphs``: without it a ``coreml_static_int8`` test spends a
    minute per lowering exporting them again; ``memoize_xnnpack_pattern_graphs``: XNNPACK's
    conv-batch norm patterns, 64 % of an ``xnnpack_static_int8_per_channel`` test). The
    quantized program, and the random generator after quantizing, are the same as without
    the memo, on a model whose patterns cover the weighted modules (conv, batch norm, linear),
    activations and binary ops."""
    import torch

    utils, name, install, tester_class, fewest = _quantizer_memo_case(backend)
    conformance = conformance_script()

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3)
            self.bn = torch.nn.BatchNorm2d(4)
            self.linear = torch.nn.Linear(6, 5)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn(self.conv(x)))
            return torch.sigmoid(self.linear(y) + 1.0) * y.sum()

    def quantized() -> tuple[str, dict[str, torch.Tensor], torch.Tensor]:
        torch.manual_seed(7)
        model = Model().eval()
        tester = tester_class(model, (torch.randn(1, 3, 8, 8),))
        program = tester.quantize().get_artifact()
        state = {k: v.clone() for k, v in program.state_dict().items()}
        return program.code, state, torch.get_rng_state()

    original = getattr(utils, name)
    exports: list[object] = []

    def export(*args: object, **kwargs: object) -> object:
        exports.append(args[0])
        return original(*args, **kwargs)

    setattr(utils, name, export)
    try:
        # Without the memo (Core ML's takes a minute or two here: its first run with the memo
        # serves as the reference instead, all misses but for keys used twice in one run).
        if backend != "coreml":
            code, state, rng = quantized()
        unmemoized = len(exports)
        assert getattr(conformance, install)()
        # The first quantization with the memo misses on every pattern, and a miss hands the
        # quantizer what its export made (each key exports once); the second is served by
        # the memo's copies alone.
        for run in range(2):
            memo_code, memo_state, memo_rng = quantized()
            if run == 0:
                assert len(exports) - unmemoized >= fewest
                missed = len(exports)
                if backend == "coreml":
                    code, state, rng = memo_code, memo_state, memo_rng
            assert len(exports) == missed  # the second: every pattern from the memo
            assert memo_code == code
            assert memo_state.keys() == state.keys()
            assert all(torch.equal(memo_state[k], state[k]) for k in state)
            assert torch.equal(memo_rng, rng)
    finally:
        setattr(utils, name, original)


def test_results_table_states_what_the_logs_hold() -> None:
    """docs/conformance.md's table of results (a row per flow and suite: tests complete,
    comparisons identical to local) says what the logs in ``conformance/results`` hold, as
    ``--summary`` counts them, and has a row for every flow and suite they hold. (It reads the
    work tree: a run appending to those logs makes it fail until the table says so too.)"""
    conformance = conformance_script()
    logs = sorted((ROOT / "conformance" / "results").glob("*.jsonl"))
    assert logs
    table = conformance.log_table(conformance.read_log(logs), [])
    ran = {label: row for label, row in table.items() if row["complete"]}
    doc = (ROOT / "docs" / "conformance.md").read_text().split("\n## Results\n", 1)[1]
    rows = {}
    for line in doc.split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and ", " in cells[0] and cells[0].split(", ")[1] in ("operators",
                                                                                "models"):
            complete = int(cells[1].split()[0])
            identical, _, compared = cells[2].split()[:3]
            rows[cells[0]] = (complete, int(identical), int(compared))
    assert rows, "no table in docs/conformance.md's Results section"
    assert rows == {label: (int(r["complete"]), int(r["identical"]), int(r["tests"]))
                    for label, r in ran.items()}
