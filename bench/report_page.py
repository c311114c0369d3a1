"""The report page benchmark: how long the llama2 delegation report takes to open in Chromium.

    python bench/report_page.py             # make bench-report; --json PATH for the figures
    python bench/report_page.py --report build/reports/llama2.json   # reuse a saved report

It lowers ExecuTorch's ``llama2`` example (at the depth of tests/report_inputs.LLAMA2_PARAMS,
about 3,800 nodes) with XNNPACK, writes its report page, opens it ``--repeat`` times in headless
Chromium (client/node/tools/report-page.mjs) and prints, per run, the time from navigation to
the page's "ready" (first method's graph laid out and painted: ``performance.now()`` in the
page), the wall time of the load, and the time to expand the largest module on screen. The
goal is under 3 s. Nothing here is asserted by the test suite: speed depends on the machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

GOAL_MS = 3000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", help="a saved report JSON (default: lower llama2 now)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)

    from remote_partitioner.client.report_page import write_report

    if args.report:
        report = json.loads(Path(args.report).read_text())
    else:
        from report_inputs import llama2_report

        report = llama2_report()
    nodes = sum(len(m.get("nodes", [])) for m in report["methods"])
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "llama2.html"
        write_report(page, report, title="llama2 (bench)")
        size = page.stat().st_size
        for i in range(args.repeat):
            done = subprocess.run(
                ["node", "tools/report-page.mjs", str(page), "--expand",
                 "--screenshot", str(Path(tmp) / f"run{i}.png")],
                cwd=ROOT / "client" / "node", capture_output=True, text=True, timeout=300,
                check=True,
            )
            seen = json.loads(done.stdout)
            if seen["console_errors"] or seen["page_errors"] or seen["requests"]:
                print(f"run {i}: errors {seen['console_errors']} {seen['page_errors']} "
                      f"requests {seen['requests']}", file=sys.stderr)
                return 1
            runs.append({"render_ms": seen["render_ms"], "wall_ms": seen["wall_ms"],
                         "visible": seen["visible"], "expand_ms": seen["expanded"]["ms"],
                         "visible_after_expand": seen["expanded"]["visible_after"]})
    render = [r["render_ms"] for r in runs]
    figures = {
        "nodes": nodes, "page_bytes": size, "runs": runs,
        "render_ms_median": statistics.median(render), "render_ms_max": max(render),
        "goal_ms": GOAL_MS,
    }
    print(f"llama2 report page: {nodes} nodes, {size / 1e6:.2f} MB of HTML")
    for i, r in enumerate(runs):
        print(f"  run {i}: ready {r['render_ms']:7.0f} ms (load wall {r['wall_ms']} ms), "
              f"{r['visible'][0]} boxes; expanding a module {r['expand_ms']} ms -> "
              f"{r['visible_after_expand'][0]} boxes")
    verdict = "within" if figures["render_ms_max"] < GOAL_MS else "OVER"
    print(f"ready: median {figures['render_ms_median']:.0f} ms, max "
          f"{figures['render_ms_max']:.0f} ms ({verdict} the {GOAL_MS} ms goal)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
