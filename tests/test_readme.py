"""The README a newcomer follows: its quick start runs as pasted, and everything it and docs/
point to exists.

* The README's Python quick start (the fenced block after the ``<!-- quickstart`` comment) is
  written to a file and run with this interpreter in a fresh process, once as pasted (it starts
  its own server on a free loopback port) and once against the session's ``remote-partitioner
  serve`` process named by ``REMOTE_PARTITIONER_TARGET``, as the README's second way says. Each
  run must write ``model.pte`` equal, byte for byte, to the local lowering of the snippet's own
  model with ``XnnpackPartitioner`` in another fresh process, and print what the README shows.
* Every relative link of README.md and docs/*.md reaches a file or directory inside the
  repository (and, into a Markdown file, one of its headings); every repository path they name
  exists; nothing names a file the repository does not hold (DESIGN.md, ../shared); every
  ``make`` target and ``remote-partitioner`` command they name exists, and every option
  docs/serve.md names is one of ``serve -h``'s. The reason tables of docs/errors.md and
  docs/protocol.md are ``proto/errors.py``'s.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: The comment that marks the quick start's fenced block.
MARK = "<!-- quickstart"
#: A lowering in a fresh process imports torch and ExecuTorch first.
RUN_SECONDS = 600

# ---------------------------------------------------------------------------- the quick start


def quickstart() -> str:
    """The source of the README's quick-start block."""
    text = README.read_text()
    assert text.count(MARK) == 1, f"the README marks one block with {MARK!r}"
    after = text.split(MARK, 1)[1].split("\n", 1)[1]
    match = re.match(r"```python\n(.*?)\n```\n", after, re.S)
    assert match, "the quick-start mark is not followed by a ```python block"
    return match.group(1) + "\n"


def model_part(source: str) -> str:
    """The snippet's lines up to its export (``ep = torch.export.export(...)``): its imports,
    model, seed and inputs, with nothing of the server or of ``RemotePartitioner`` run."""
    lines = source.splitlines()
    ends = [i for i, line in enumerate(lines) if line.startswith("ep = torch.export.export(")]
    assert len(ends) == 1, "the quick start exports its model once, as `ep = torch.export.export(`"
    return "\n".join(lines[: ends[0] + 1]) + "\n"


LOCAL_LOWERING = """
from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

local = to_edge_transform_and_lower(ep, partitioner=[XnnpackPartitioner()]).to_executorch()
with open("local.pte", "wb") as f:
    f.write(local.buffer)
"""


def env(target: str | None) -> dict[str, str]:
    """This environment, with ``REMOTE_PARTITIONER_TARGET`` set to ``target`` or removed."""
    out = {k: v for k, v in os.environ.items() if k != "REMOTE_PARTITIONER_TARGET"}
    if target is not None:
        out["REMOTE_PARTITIONER_TARGET"] = target
    return out


class Local:
    """The local lowering of the snippet's model, started in its own process at once (it runs
    beside the remote ones) and awaited by :meth:`pte`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        (directory / "local.py").write_text(model_part(quickstart()) + LOCAL_LOWERING)
        self.proc = subprocess.Popen(
            [sys.executable, "local.py"], cwd=directory, env=env(None),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

    def pte(self) -> bytes:
        out, _ = self.proc.communicate(timeout=RUN_SECONDS)
        assert self.proc.returncode == 0, out[-4000:]
        return (self.directory / "local.pte").read_bytes()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Local]:
    lowering = Local(tmp_path_factory.mktemp("local"))
    try:
        yield lowering
    finally:
        lowering.stop()


def run_quickstart(directory: Path, target: str | None) -> tuple[str, bytes]:
    """Run the quick start as the README says (``python quickstart.py`` in a directory of its
    own); return what it printed on stdout and the ``model.pte`` it wrote."""
    (directory / "quickstart.py").write_text(quickstart())
    proc = subprocess.run(
        [sys.executable, "quickstart.py"], cwd=directory, env=env(target),
        capture_output=True, text=True, timeout=RUN_SECONDS, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    pte = directory / "model.pte"
    assert pte.is_file(), proc.stdout
    return proc.stdout, pte.read_bytes()


def printed() -> str:
    """The output the README shows after the quick start (the block after "It prints")."""
    after = README.read_text().split(MARK, 1)[1].split("\nIt prints", 1)[1]
    match = re.search(r"\n```\n(.*?\n)```\n", after, re.S)
    assert match, "no output block after the quick start's \"It prints\""
    return match.group(1)


def check_output(stdout: str, pte: bytes, target_shown: str) -> None:
    """What the README says the quick start prints: the file, its size and the server; what
    XNNPACK took; cumsum left on the CPU, with a reason; the very lines the README shows, but
    for the port."""
    def any_port(text: str) -> str:
        return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", text)

    assert any_port(stdout) == any_port(printed())
    first = stdout.splitlines()[0]
    assert first == (f"wrote model.pte ({len(pte)} bytes), partitioned by the server at "
                     f"{target_shown}"), stdout
    assert re.search(r"^  XnnpackBackend: [1-9]\d* partition\(s\), [1-9]\d* node\(s\)$", stdout,
                     re.M), stdout
    assert re.search(r"^  on the CPU: aten\.cumsum\.default: \S", stdout, re.M), stdout


def test_quickstart_runs_as_pasted(local: Local, tmp_path: Path) -> None:
    """As pasted: the snippet starts its own server on a free loopback port."""
    stdout, pte = run_quickstart(tmp_path, None)
    match = re.search(r"at (127\.0\.0\.1:(\d+))$", stdout.splitlines()[0])
    assert match and int(match.group(2)) > 0, stdout
    check_output(stdout, pte, match.group(1))
    assert pte == local.pte()


@pytest.mark.slow
def test_quickstart_against_a_serve_process(
    local: Local, server_address: str, tmp_path: Path
) -> None:
    """The README's second way: `remote-partitioner serve --address 127.0.0.1:0` in a process of
    its own (the session's), its address in REMOTE_PARTITIONER_TARGET."""
    stdout, pte = run_quickstart(tmp_path, server_address)
    check_output(stdout, pte, server_address)
    assert pte == local.pte()


# ---------------------------------------------------------------------------- links and paths

#: Made by the build or a run, not held by the repository.
MADE = ("build/", ".venv/")
#: Paths the documentation names inside other projects (ExecuTorch's tree, googleapis).
ELSEWHERE = ("executorch/", "google/")
EXTENSIONS = ("py", "md", "proto", "js", "mjs", "json", "jsonl", "yaml", "yml", "toml", "html",
              "css", "txt", "pyi")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def top_level() -> set[str]:
    return {p.name for p in ROOT.iterdir()} - {".git", "build", ".venv"}


def named_paths(text: str) -> set[str]:
    """The repository paths ``text`` names: words with a slash that start with one of the
    repository's top-level entries or end with a file extension (``remote_partitioner/x.py``
    included: a path that is not there)."""
    tops = top_level()
    found = set()
    for m in re.finditer(r"(?<![\w/.:@-])((?:\.?[\w-]+/)+[\w.*{},-]*)", text):
        path = m.group(1).rstrip(".,;:")
        extension = path.rsplit(".", 1)[-1] if "." in path.rsplit("/", 1)[-1] else ""
        if path.split("/")[0] in tops or extension in EXTENSIONS:
            found.add(path)
    return found


def exists(path: str) -> bool:
    """A repository path exists; ``*``, ``NAME`` and ``{a,b}`` are wildcards."""
    pattern = re.sub(r"\{[^}]*\}", "*", path.rstrip("/")).replace("NAME", "*")
    if "*" in pattern:
        return any(ROOT.glob(pattern))
    return (ROOT / pattern).exists()


@pytest.mark.parametrize("doc", DOCS, ids=[str(d.relative_to(ROOT)) for d in DOCS])
def test_links_and_paths_exist(doc: Path) -> None:
    text = doc.read_text()
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file, _, anchor = target.partition("#")
        resolved = (doc.parent / file).resolve() if file else doc
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            bad.append(f"link {target}: no such file in the repository")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            bad.append(f"link {target}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    for path in named_paths(text):
        if not path.startswith(MADE + ELSEWHERE) and not exists(path):
            bad.append(f"path {path}: not in the repository")
    for outside in ("DESIGN.md", "../shared"):
        if outside in text:
            bad.append(f"names {outside}, which is not in the repository")
    assert not bad, "\n".join(bad)


def make_targets() -> set[str]:
    makefile = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([\w-]+):", makefile, re.M)}


def cli_help(*args: str) -> str:
    return subprocess.run(
        [sys.executable, "-m", "remote_partitioner.cli", *args, "-h"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout


def test_commands_exist() -> None:
    """Every `make TARGET` and `remote-partitioner COMMAND` the README and docs/ name exists,
    and docs/serve.md names only options `serve -h` lists."""
    targets = make_targets()
    commands = set(re.findall(r"\{([\w,-]+)\}", cli_help())[0].split(","))
    bad = []
    for doc in DOCS:
        text = doc.read_text()
        for target in re.findall(r"(?<![\w-])make ([a-z][\w-]*)", text):
            if target not in targets:
                bad.append(f"{doc.name}: make {target}")
        for command in re.findall(r"(?<![\w/-])remote-partitioner ([a-z][\w-]*)", text):
            # (`remote-partitioner serving ... on HOST:PORT` is the server's own line)
            if command not in commands | {"serving"}:
                bad.append(f"{doc.name}: remote-partitioner {command}")
    serve_help = cli_help("serve")
    serve_doc = (ROOT / "docs" / "serve.md").read_text()
    for option in set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", serve_doc)):
        if not re.search(rf"(?<![\w-]){option}(?![\w-])", serve_help):
            bad.append(f"serve.md: {option} is not an option of serve")
    assert not bad, "\n".join(bad)


def test_path_check_catches_what_it_should() -> None:
    """The checks above find a wrong path, a placeholder that matches nothing, and a missing
    heading (the helpers, on text written here)."""
    text = textwrap.dedent("""
        `remote_partitioner/server/pattern_memo.py` and `server/pattern_memo.py`,
        conformance/results/NAME.json, proto/v1/*_pb2.py, docs/nothing-*.md
    """)
    paths = named_paths(text)
    assert {p for p in paths if not exists(p)} == {
        "remote_partitioner/server/pattern_memo.py", "docs/nothing-*.md"}
    assert "server/pattern_memo.py" in paths
    assert slug("## 11. Weights stay home: withheld tensors".lstrip("# ")) == (
        "11-weights-stay-home-withheld-tensors")


@pytest.mark.parametrize("doc", ["errors.md", "protocol.md"])
def test_reason_tables_match_the_code(doc: str) -> None:
    """The reason -> status code tables of docs/errors.md and docs/protocol.md list every reason
    the service sends, each with the code ``proto/errors.py`` sends it with."""
    from remote_partitioner.proto.errors import STATUS_CODES

    text = (ROOT / "docs" / doc).read_text()
    table = {m.group(1): m.group(2) for m in re.finditer(
        r"^\| `([A-Z_]+)` +\| ([A-Z_]+) +\|", text, re.M)}
    assert table == {reason.value: code.name for reason, code in STATUS_CODES.items()}
