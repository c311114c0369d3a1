"""The delegation report as one self-contained HTML page.

:func:`render_html` turns a delegation report, as JSON (``json_format.MessageToDict(report,
preserving_proto_field_name=True)`` of a ``DelegationReport``: per method ``delegated``,
``cpu_ops`` and, when the server sends them, ``nodes``, ``partitions`` and ``cpu_nodes``), into
one HTML file that needs nothing but a browser: the template, CSS, the page's script and the
graph layout library (``@dagrejs/dagre``, vendored byte for byte from the npm package pinned in
``client/node/package.json``) are inlined from ``client/report_assets/``, and a
Content-Security-Policy forbids every fetch (``default-src 'none'``; only the page's own inline
scripts, by hash, and inline styles run).

The page shows per method: nodes and partitions per backend, the graph (every delegated node in
its backend's colour, CPU nodes marked, grouped by module hierarchy in collapsible clusters,
laid out by dagre as far as it is expanded), the CPU nodes grouped by operator with the reasons
they stayed there, and a node's details (operator, shapes, inputs, module stack, stack trace)
on click.

The page is titled by :func:`report_title`: the model and the partitioners the report names
(top-level ``model`` and ``partitioners``, which both command lines write), whichever client
wrote the JSON.

Every string of the report reaches the page as JSON data read by the script and inserted as
text, never as markup.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = ["BACKEND_COLOURS", "backend_colour", "render_html", "report_title", "write_report"]

#: The colour of each well-known backend's partitions (and of its legend swatch).
BACKEND_COLOURS: Mapping[str, str] = {
    "XnnpackBackend": "#2f7ed8",
    "CoreMLBackend": "#8e44ad",
    "VulkanBackend": "#e67e22",
    "QnnBackend": "#16a085",
    "MPSBackend": "#7f8c2d",
    "EthosUBackend": "#c0398b",
    "OpenvinoBackend": "#5b6bd6",
    "NeuropilotBackend": "#b8860b",
    "CudaBackend": "#4e9a06",
}
#: Colours for any other backend id, picked by a stable hash of the id.
_OTHER_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#66a61e", "#a6761d", "#1f78b4", "#b15928")

_ASSETS = ("template.html", "report.css", "report.js", "dagre.min.js")


def backend_colour(backend_id: str) -> str:
    """The fixed ``#rrggbb`` colour of ``backend_id``: the same in every report."""
    if backend_id in BACKEND_COLOURS:
        return BACKEND_COLOURS[backend_id]
    index = hashlib.sha256(backend_id.encode()).digest()[0] % len(_OTHER_COLOURS)
    return _OTHER_COLOURS[index]


def _asset(name: str) -> str:
    return (resources.files("remote_partitioner.client") / "report_assets" / name).read_text(
        encoding="utf-8"
    )


def _inline_script(source: str) -> str:
    """``source`` made safe inside ``<script>``: no ``</script`` ends it early, and no source
    map comment points the browser at a file that is not there."""
    source = re.sub(r"^//# sourceMappingURL=.*$", "", source, flags=re.MULTILINE)
    return source.replace("</script", "<\\/script")


def _json_script(value: Any) -> str:
    """``value`` as JSON that cannot close its ``<script type="application/json">``."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _backends(report: Mapping[str, Any]) -> list[str]:
    seen: dict[str, None] = {}
    for method in report.get("methods", []):
        for d in method.get("delegated", []):
            seen.setdefault(str(d.get("backend_id", "")), None)
        for p in method.get("partitions", []):
            seen.setdefault(str(p.get("backend_id", "")), None)
        for n in method.get("nodes", []):
            if n.get("backend_id"):
                seen.setdefault(str(n["backend_id"]), None)
    return sorted(b for b in seen if b)


def report_title(report: Mapping[str, Any]) -> str:
    """The title of ``report``'s page: ``Delegation report: MODEL (P1, P2)``.

    MODEL is the report's top-level ``model`` (the PT2 archive's file name; of a path, its last
    part), P1, P2 its top-level ``partitioners`` (the hosted partitioners' names, in the order
    they ran). Without ``partitioners`` the title names the backends the report's methods name
    (delegated, partitions, nodes) instead; without ``model`` it names no model. It never names
    the file the report was read from.
    """
    model = report.get("model")
    name = re.split(r"[\\/]", model)[-1] if isinstance(model, str) else ""
    listed = report.get("partitioners")
    partitioners = [
        str(p.get("name", "")) if isinstance(p, Mapping) else str(p)
        for p in (listed if isinstance(listed, list) else [])
    ]
    who = [p for p in partitioners if p] or _backends(report)
    title = f"Delegation report: {name}" if name else "Delegation report"
    return f"{title} ({', '.join(who)})" if who else title


def render_html(report: Mapping[str, Any], *, title: str | None = None) -> str:
    """The report page for ``report`` (a ``DelegationReport`` as MessageToDict gives it, with
    proto field names, and optionally the top-level ``model`` and ``partitioners`` of
    :func:`report_title`), titled ``title`` (default: :func:`report_title`): one HTML document
    that fetches nothing.

    Raises:
        ValueError: ``report`` has no ``methods`` list.
    """
    if not isinstance(report.get("methods", []), list):
        raise ValueError("the report's 'methods' must be a list")
    if title is None:
        title = report_title(report)
    data = {
        "title": title,
        "report": dict(report),
        "colours": {b: backend_colour(b) for b in _backends(report)},
    }
    scripts = [_inline_script(_asset("dagre.min.js")), _inline_script(_asset("report.js"))]
    hashes = " ".join(
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in scripts
    )
    csp = (
        "default-src 'none'; img-src data:; style-src 'unsafe-inline'; "
        f"script-src {hashes}; base-uri 'none'; form-action 'none'"
    )
    values = {
        "CSP": html.escape(csp, quote=True),
        "TITLE": html.escape(title),
        "STYLE": _asset("report.css").replace("</style", "<\\/style"),
        "DATA": _json_script(data),
        "DAGRE": scripts[0],
        "SCRIPT": scripts[1],
    }
    # One pass: a placeholder-like string inside the report's data is left alone.
    return re.sub(r"\{\{([A-Z]+)\}\}", lambda m: values[m.group(1)], _asset("template.html"))


def write_report(path: str | Path, report: Mapping[str, Any], *, title: str | None = None) -> None:
    """Write :func:`render_html` of ``report`` to ``path`` (UTF-8)."""
    Path(path).write_text(render_html(report, title=title), encoding="utf-8")
