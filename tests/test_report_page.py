"""The delegation report page (client/report_page.py): one self-contained HTML file, checked in a
real browser. Debian's Chromium, driven headless by playwright-core through
``client/node/tools/report-page.mjs``, opens the file:// page; the tests assert on what it
rendered: the CPU nodes and their reasons, every partition in its backend's colour, the drawing's
geometry (every label inside its box, no box over a module it is not part of), the title, no
console error, no request of any kind. The reports come from real lowerings
(tests/report_inputs.py); the screenshots are left in the test's tmp dir.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from remote_partitioner.client.report_page import (
    backend_colour,
    render_html,
    report_title,
    write_report,
)

ROOT = Path(__file__).resolve().parent.parent
NODE_DIR = ROOT / "client" / "node"
TOOL = NODE_DIR / "tools" / "report-page.mjs"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _rgb(hex_colour: str) -> str:
    """``#rrggbb`` as the browser's computed style writes it."""
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


@pytest.fixture(scope="module")
def browser() -> None:
    """Chromium and playwright-core are there; skipped only outside CI (in CI they must be)."""
    missing = []
    if not Path(CHROMIUM).exists():
        missing.append(f"{CHROMIUM} (apt-get install chromium; .ci/run installs it)")
    if shutil.which("node") is None:
        missing.append("node")
    if not (NODE_DIR / "node_modules" / "playwright-core").is_dir():
        missing.append("client/node/node_modules/playwright-core (make node-client)")
    if missing:
        if IN_CI:
            pytest.fail(f"CI=true but missing: {', '.join(missing)}")
        pytest.skip(f"missing: {', '.join(missing)}")


def open_page(
    page: Path, shots: Path, *, expand: bool = False, reveal: bool = False
) -> dict[str, Any]:
    """Open ``page`` in headless Chromium; what it rendered (see report-page.mjs)."""
    args = ["node", str(TOOL), str(page), "--screenshot", str(shots)]
    if expand:
        args.append("--expand")
    if reveal:
        args.append("--reveal")
    done = subprocess.run(args, cwd=NODE_DIR, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    seen: dict[str, Any] = json.loads(done.stdout)
    return seen


def assert_clean(seen: dict[str, Any]) -> None:
    assert seen["console_errors"] == []
    assert seen["page_errors"] == []
    assert seen["requests"] == [], "the page must fetch nothing"


def assert_colours(seen: dict[str, Any], report: dict[str, Any]) -> None:
    """Every delegated node is drawn in its backend's colour, the legend's too; CPU nodes are
    marked as such and drawn in no backend's colour."""
    backends = {d["backend_id"] for m in report["methods"] for d in m.get("delegated", [])}
    assert backends and set(seen["legend"]) == backends
    for b in backends:
        assert seen["legend"][b] == _rgb(backend_colour(b))
    delegated = [n for n in seen["nodes"] if n["backend"]]
    assert delegated
    for n in delegated:
        assert n["fill"] == _rgb(backend_colour(n["backend"])), n
        assert n["partition"], n
    by_name = {n["name"]: n for m in report["methods"] for n in m.get("nodes", [])}
    colours = {_rgb(backend_colour(b)) for b in backends}
    for n in seen["nodes"]:
        assert bool(n["backend"]) == bool(by_name[n["name"]].get("backend_id")), n
        if n["cpu"]:
            assert n["fill"] not in colours and not by_name[n["name"]].get("backend_id")


Box = dict[str, float]
#: How far (px) a box may reach past another before it counts: rounding of sub-pixel layout.
SLACK = 0.5


def _inside(inner: Box, outer: Box) -> bool:
    return (inner["left"] >= outer["left"] - SLACK and inner["right"] <= outer["right"] + SLACK
            and inner["top"] >= outer["top"] - SLACK and inner["bottom"] <= outer["bottom"] + SLACK)


def _overlap(a: Box, b: Box) -> bool:
    return (min(a["right"], b["right"]) - max(a["left"], b["left"]) > SLACK
            and min(a["bottom"], b["bottom"]) - max(a["top"], b["top"]) > SLACK)


def assert_geometry(seen: dict[str, Any]) -> None:
    """The drawing as laid out: every module's labels (title, and a collapsed module's summary)
    inside its box, every node's label inside its box; no node over a module it is not in and
    no module over another it neither holds nor is held by (a module counts with its title
    strip and labels); no two nodes over each other."""
    geometry = seen["geometry"]
    modules = {(m["graph"], m["path"]): m for m in geometry["modules"]}

    def chain(graph: str, path: str) -> set[str]:
        """``path`` and the modules holding it."""
        out = {path}
        while path:
            path = modules[(graph, path)]["parent"]
            out.add(path)
        return out

    for m in geometry["modules"]:
        assert m["labels"], m
        for label in m["labels"]:
            assert _inside(label["box"], m["box"]), (
                f"label {label['text']!r} of module {m['path']!r} spills out of its box", m)
    for i, n in enumerate(geometry["nodes"]):
        assert _inside(n["label"]["box"], n["box"]), (
            f"label {n['label']['text']!r} of node {n['name']!r} spills out of its box", n)
        holders = chain(n["graph"], n["module"])
        for m in geometry["modules"]:
            if m["graph"] == n["graph"] and m["path"] not in holders:
                assert not _overlap(n["box"], m["drawn"]), (
                    f"node {n['name']!r} lies over module {m['path']!r}", n, m)
        for other in geometry["nodes"][i + 1:]:
            if other["graph"] == n["graph"]:
                assert not _overlap(n["box"], other["box"]), (n, other)
    for (graph, path), m in modules.items():
        for (other_graph, other_path), other in modules.items():
            if other_graph != graph or path in chain(graph, other_path):
                continue
            if other_path not in chain(graph, path):
                assert not _overlap(m["drawn"], other["drawn"]), (m, other)


# ----------------------------------------------------------------------------- the file itself


def test_the_vendored_dagre_is_the_pinned_npm_package() -> None:
    """One source of truth: client/report_assets/dagre.min.js is the file npm installs from
    the version package-lock.json pins."""
    vendored = ROOT / "client" / "report_assets" / "dagre.min.js"
    installed = NODE_DIR / "node_modules" / "@dagrejs" / "dagre" / "dist" / "dagre.min.js"
    lock = json.loads((NODE_DIR / "package-lock.json").read_text())
    pinned = lock["packages"]["node_modules/@dagrejs/dagre"]["version"]
    package = json.loads((NODE_DIR / "package.json").read_text())
    assert package["devDependencies"]["@dagrejs/dagre"] == pinned
    if not installed.exists():
        if IN_CI:
            pytest.fail("client/node/node_modules is missing (make node-client)")
        pytest.skip("make node-client has not run")
    installed_version = json.loads(installed.parent.parent.joinpath("package.json").read_text())
    assert installed_version["version"] == pinned
    assert hashlib.sha256(vendored.read_bytes()).hexdigest() == hashlib.sha256(
        installed.read_bytes()
    ).hexdigest()


HOSTILE: dict[str, Any] = {
    "methods": [{
        "method": "forward",
        "total_nodes": 2,
        "delegated": [{"backend_id": "XnnpackBackend", "partitions": 1, "nodes": 1}],
        "cpu_ops": [{"op": "aten.cumsum.default", "count": 1}],
        "nodes": [
            {"name": "x", "op": "placeholder", "kind": "placeholder", "shapes": "f32[2]"},
            {"name": "a</script><script>alert(1)</script>", "op": "aten.relu.default",
             "kind": "call_function", "inputs": ["x"], "backend_id": "XnnpackBackend",
             "partition": "tag0"},
            {"name": "{{SCRIPT}}", "op": "aten.cumsum.default", "kind": "call_function",
             "inputs": ["a</script><script>alert(1)</script>"],
             "reason": "<img src=x onerror=alert(1)> & {{DATA}}",
             "reason_source": "REJECTION_SOURCE_DERIVED"},
        ],
    }],
}


def test_the_page_is_self_contained_and_its_scripts_are_pinned_by_hash() -> None:
    page = render_html(HOSTILE, title="<b>t</b>")
    assert "<title>&lt;b&gt;t&lt;/b&gt;</title>" in page
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)
    assert csp is not None
    policy = html.unescape(csp.group(1))
    assert "default-src 'none'" in policy and "unsafe-inline" not in policy.split("script-src")[1]
    scripts = re.findall(r"<script>(.*?)</script>", page, flags=re.DOTALL)
    assert len(scripts) == 2  # dagre, the page; the data is JSON, not a script
    for s in scripts:
        digest = hashlib.sha256(s.encode()).digest()
        assert f"'sha256-{base64.b64encode(digest).decode()}'" in policy
    # Nothing points outside the file, no source map either.
    assert not re.search(r'\b(src|href)\s*=\s*["\']?(https?:|//)', page)
    assert "sourceMappingURL" not in page
    # The hostile strings stay inside the JSON block, whole, and come back out of it.
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', page,
                     flags=re.DOTALL)
    assert data is not None
    assert json.loads(data.group(1))["report"] == HOSTILE
    assert page.count("<script") == 3


@pytest.mark.slow  # a browser each (make test runs the page tests)
def test_the_hostile_page_renders_its_strings_as_text(browser: None, tmp_path: Path) -> None:
    write_report(tmp_path / "hostile.html", HOSTILE, title="hostile")
    seen = open_page(tmp_path / "hostile.html", tmp_path / "hostile.png")
    assert_clean(seen)
    assert "<img src=x onerror=alert(1)> & {{DATA}}" in seen["text"]
    drawn = {n["name"] for n in seen["nodes"]}
    assert drawn >= {"{{SCRIPT}}", "a</script><script>alert(1)</script>"}


@pytest.mark.slow  # a browser each (make test runs the page tests)
def test_every_method_gets_its_section(browser: None, tmp_path: Path) -> None:
    """Two methods: both summarized, the first one's graph drawn (the second's when opened),
    node names only unique within a method."""
    second = json.loads(json.dumps(HOSTILE["methods"][0]))
    second["method"] = "decode"
    report = {"methods": [HOSTILE["methods"][0], second]}
    write_report(tmp_path / "two.html", report, title="two methods")
    seen = open_page(tmp_path / "two.html", tmp_path / "two.png")
    assert_clean(seen)
    assert "forward" in seen["text"] and "decode" in seen["text"]
    assert seen["visible"] == [3, 0]


def test_report_command_turns_json_into_the_page(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps(HOSTILE))
    done = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "report", str(tmp_path / "r.json"),
         "-o", str(tmp_path / "r.html"), "--title", "T"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.html").read_text() == render_html(HOSTILE, title="T")
    # Without --title: the report's own title (it names no model: its backend), not the file's.
    done = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "report", str(tmp_path / "r.json"),
         "-o", str(tmp_path / "r.html")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.html").read_text() == render_html(HOSTILE)
    assert "<title>Delegation report (XnnpackBackend)</title>" in render_html(HOSTILE)
    (tmp_path / "bad.json").write_text('{"not": "a report"}')
    done = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "report", str(tmp_path / "bad.json"),
         "-o", str(tmp_path / "bad.html")],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 2 and "no delegation report" in done.stderr


def test_the_title_names_the_model_and_the_partitioners() -> None:
    """The JSON's own ``model`` and ``partitioners`` (both command lines write them); without
    them, the backends the report names; never anything else."""
    methods = [{"method": "forward",
                "delegated": [{"backend_id": "VulkanBackend", "partitions": 1, "nodes": 1}],
                "partitions": [{"id": "lowered_module_0", "backend_id": "XnnpackBackend"}]}]
    named = {"model": "small.pt2", "partitioners": ["xnnpack", "vulkan"], "methods": methods}
    assert report_title(named) == "Delegation report: small.pt2 (xnnpack, vulkan)"
    assert report_title({**named, "model": "/somewhere/else/small.pt2"}) == report_title(named)
    assert report_title({"model": "small.pt2", "methods": methods}) == (
        "Delegation report: small.pt2 (VulkanBackend, XnnpackBackend)")
    assert report_title({"methods": methods}) == (
        "Delegation report (VulkanBackend, XnnpackBackend)")
    assert report_title({"methods": []}) == "Delegation report"
    page = render_html(named)
    assert "<title>Delegation report: small.pt2 (xnnpack, vulkan)</title>" in page
    assert '<h1 id="title">Delegation report: small.pt2 (xnnpack, vulkan)</h1>' in page
    assert "<title>T</title>" in render_html(named, title="T")


# --------------------------------------------------------------------- pages of real lowerings


@pytest.fixture(scope="module")
def small_report() -> dict[str, Any]:
    from report_inputs import small_report

    return small_report()


@pytest.mark.slow
def test_small_model_page(browser: None, small_report: dict[str, Any], tmp_path: Path) -> None:
    method = small_report["methods"][0]
    cpu = [n for n in method["nodes"] if n.get("reason")]
    assert cpu, "the small model must leave nodes on the CPU"
    write_report(tmp_path / "small.html", small_report, title="small model")
    seen = open_page(tmp_path / "small.html", tmp_path / "small.png", reveal=True)
    assert_clean(seen)
    assert_colours(seen, small_report)
    # Drawn whole (see below): the input, the modules and their nodes, none over another.
    assert {"encoder", "encoder.0", "encoder.1", "head"} <= {
        m["path"] for m in seen["geometry"]["modules"]}
    assert "x" in {n["name"] for n in seen["geometry"]["nodes"] if n["io"]}
    assert_geometry(seen)
    # Every CPU node is explained on the page: its name, operator and reason, and it is drawn.
    for n in cpu:
        assert n["name"] in seen["text"] and n["op"] in seen["text"] and n["reason"] in seen["text"]
    drawn_cpu = {n["name"] for n in seen["nodes"] if n["cpu"]}
    assert drawn_cpu == {n["name"] for n in cpu}
    assert seen["revealed"]["selected"] and seen["revealed"]["name"] in {n["name"] for n in cpu}
    # The summary: nodes and partitions per backend.
    for d in method["delegated"]:
        assert re.search(rf"{d['backend_id']}\s+{d['partitions']}\s+{d['nodes']}", seen["text"])
    # Small enough to draw whole: every module open, every non-weight node drawn.
    assert seen["clusters"] == []
    assert len(seen["nodes"]) == sum(
        1 for n in method["nodes"] if not re.match(r"^(p|b|c)_", n["name"])
    )


@pytest.mark.slow
def test_two_partitioner_page(browser: None, tmp_path: Path) -> None:
    """Two partitioners in a row, as the server reports them (tests/report_inputs.py): both
    backends in their colours, the input ``x`` (it feeds a node two modules deep) over no
    module, every module's and node's label inside its box."""
    from report_inputs import two_partitioner_report

    report = two_partitioner_report()
    method = report["methods"][0]
    assert {d["backend_id"] for d in method["delegated"]} == {"XnnpackBackend", "VulkanBackend"}
    write_report(tmp_path / "two.html", report)
    seen = open_page(tmp_path / "two.html", tmp_path / "two.png")
    assert_clean(seen)
    assert_colours(seen, report)
    assert seen["title"] == seen["heading"] == report_title(report)
    assert "VulkanBackend" in seen["title"] and "XnnpackBackend" in seen["title"]
    geometry = seen["geometry"]
    assert {"encoder", "encoder.0", "encoder.1", "head"} <= {m["path"] for m in geometry["modules"]}
    x = next(n for n in geometry["nodes"] if n["name"] == "x")
    assert x["io"] and x["module"] == ""
    assert_geometry(seen)


@pytest.mark.slow
def test_llama2_page_opens_collapsed_and_navigates(browser: None, tmp_path: Path) -> None:
    """ExecuTorch's llama2 example at 8 layers (about 950 nodes, 7 times the page's first
    drawing): the page opens with the layers collapsed, explains every CPU node, and a click
    opens a module. ``make bench-report`` opens it at 32 layers (3,763 nodes) and times it:
    the report alone takes about 160 s to make at that depth, 27 s at this one."""
    from report_inputs import llama2_report

    report = llama2_report(n_layers=8)
    method = report["methods"][0]
    assert len(method["nodes"]) > 900
    write_report(tmp_path / "llama2.html", report, title="llama2")
    seen = open_page(tmp_path / "llama2.html", tmp_path / "llama2.png", expand=True, reveal=True)
    assert_clean(seen)
    assert_colours(seen, report)
    assert 0 < seen["visible"][0] <= 160, "the first drawing must stay small"
    assert len(seen["clusters"]) >= 8  # the transformer blocks, collapsed
    assert_geometry(seen)
    # Every CPU node is named on the page (past the first few of an operator and reason, in a
    # folded "N more"), every reason and operator is in plain sight.
    for n in method["nodes"]:
        if n.get("reason"):
            assert n["name"] in seen["all_text"]
            assert n["reason"] in seen["text"] and n["op"] in seen["text"]
    # A CPU node's name in the list opens the graph on it, inside its collapsed layer.
    revealed = seen["revealed"]
    assert not revealed["was_drawn"]
    assert revealed["drawn"] and revealed["selected"] and revealed["onscreen"], revealed
    assert revealed["name"] in revealed["details"] and "reason" in revealed["details"]
    opened = seen["expanded"]
    assert not opened["still_collapsed"]
    assert opened["visible_after"][0] > opened["visible_before"][0]
    assert opened["onscreen_after"] > 0, "the opened module's nodes are on screen"
    assert_geometry({"geometry": opened["geometry"]})
    assert "operator" in opened["details"] and "module stack" in opened["details"]


@pytest.fixture(scope="module")
def small_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/report_inputs.SmallModel as a PT2 archive (``torch.export.save``)."""
    import torch
    from report_inputs import SmallModel

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("report_page") / "small.pt2"
    ep = torch.export.export(SmallModel().eval(), (torch.randn(2, 8),), strict=False)
    torch.export.save(ep, path)
    return path


@pytest.mark.slow
def test_lower_writes_the_report_page(
    browser: None, server_address: str, small_archive: Path, tmp_path: Path
) -> None:
    """``remote-partitioner lower X.pt2 -o Y.pte --report R.html`` against a real server; the
    Node client's ``--report-json`` gives the same report, which ``report`` turns into a page."""
    page = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "lower", str(small_archive),
         "-o", str(tmp_path / "m.pte"), "--report", str(page), "--partitioner", "xnnpack",
         "--target", server_address, "--json"],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    printed = json.loads(done.stdout)
    printed.pop("output")
    shown = json.loads(re.search(  # type: ignore[union-attr]
        r'<script type="application/json" id="report-data">(.*?)</script>', page.read_text(),
        flags=re.DOTALL).group(1))
    assert shown["report"] == printed
    seen = open_page(page, tmp_path / "lowered.png")
    assert_clean(seen)
    assert seen["title"] == seen["heading"] == report_title(printed)
    assert "small.pt2" in seen["title"] and "xnnpack" in seen["title"]
    method = printed["methods"][0]
    for d in method["delegated"]:
        assert re.search(rf"{d['backend_id']}\s+{d['partitions']}\s+{d['nodes']}", seen["text"])
    for op in method["cpu_ops"]:
        assert op["op"] in seen["text"]
    # This server sends per-node data (the Lower RPC's nodes): the page draws the graph and
    # explains every CPU node.
    assert method.get("nodes") and method.get("partitions"), "the server sent no per-node data"
    assert_colours(seen, printed)
    cpu = [n for n in method["nodes"] if n.get("kind") == "call_function"
           and not n.get("backend_id") and "getitem" not in n["op"]]
    assert {n["op"] for n in cpu} == {"aten.cumsum.default", "aten.sort.default"}
    for n in cpu:
        assert n["name"] in seen["text"] and n.get("reason") and n["reason"] in seen["text"]
    assert {n["name"] for n in seen["nodes"] if n["cpu"]} == {n["name"] for n in cpu}
    assert_geometry(seen)

    # partition --report: the same report, no .pte.
    done = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "partition", str(small_archive),
         "--report", str(tmp_path / "partition.html"), "--partitioner", "xnnpack",
         "--target", server_address],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"wrote {tmp_path / 'partition.html'}" in done.stdout
    shown = json.loads(re.search(  # type: ignore[union-attr]
        r'<script type="application/json" id="report-data">(.*?)</script>',
        (tmp_path / "partition.html").read_text(), flags=re.DOTALL).group(1))
    assert shown["report"] == printed

    if shutil.which("node") is None:
        return
    node_json = tmp_path / "node-report.json"
    node = subprocess.run(
        ["node", "bin/remote-partitioner.js", "lower", str(small_archive), "-o",
         str(tmp_path / "node.pte"), "--partitioner", "xnnpack", "--target", server_address,
         "--report-json", str(node_json)],
        cwd=NODE_DIR, capture_output=True, text=True, timeout=600,
    )
    assert node.returncode == 0, node.stderr[-4000:]
    # The same report's methods (cpu_nodes, a client's own summary of nodes, aside).
    saved = json.loads(node_json.read_text())

    def wire(r: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in m.items() if k != "cpu_nodes"} for m in r["methods"]]

    assert wire(saved) == wire(printed)
    done = subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", "report", str(node_json), "-o",
         str(tmp_path / "node.html")], capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = open_page(tmp_path / "node.html", tmp_path / "node.png")
    assert_clean(seen)
    # Titled by the model and partitioners whichever client wrote the JSON, never by its file.
    assert seen["title"] == seen["heading"] == report_title(saved) == report_title(printed)
    assert node_json.name not in seen["title"]
    assert_geometry(seen)
