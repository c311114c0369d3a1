"""Check the import layering of the package: exit 1, naming every offending import, if it is
broken.

The rules (docs/development.md, Layering)::

    proto/   remote_partitioner.proto    imports no other layer
    client/  remote_partitioner.client   imports proto only
    server/  remote_partitioner.server   imports proto only
    cli/     remote_partitioner.cli      imports any layer (it joins client and server)

Every ``import`` and ``from ... import`` statement counts, wherever it is: at module level,
inside a function (the deferred imports that keep startup light), under ``if TYPE_CHECKING``,
relative (``from ..server import x``) or absolute; so do ``importlib.import_module("...")`` and
``__import__("...")`` called with a literal module name. A module path in any other string
(e.g. ``python -m`` in a subprocess) is not an import and is not checked. Imports of modules
outside ``remote_partitioner`` (grpc, torch, ...) are not this check's business.

Usage: ``python scripts/check_layers.py [--root DIR]`` (default: the repository holding this
script). The script reads the source with :mod:`ast` and imports nothing from the package, so
it needs no installed package and sees the folders as they are (``make lint`` runs it).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

PACKAGE = "remote_partitioner"

#: Each layer: the folder that holds it (relative to the root) and the layers it may import
#: (itself included).
LAYERS: Mapping[str, tuple[str, frozenset[str]]] = {
    "proto": ("proto", frozenset({"proto"})),
    "client": ("client", frozenset({"proto", "client"})),
    "server": ("server", frozenset({"proto", "server"})),
    "cli": ("cli", frozenset({"proto", "client", "server", "cli"})),
}

#: Folders inside a layer that hold no Python of the package (the Node.js client).
SKIP_DIRS = frozenset({"node", "node_modules", "__pycache__"})


@dataclasses.dataclass(frozen=True)
class Violation:
    """One import that breaks the rules: where it is, what it imports, and why that is not
    allowed."""

    path: Path
    line: int
    layer: str
    imported: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.layer}/ imports {self.imported}: {self.reason}"


def module_name(root: Path, layer: str, path: Path) -> str:
    """The dotted name ``path`` (a .py file in ``layer``'s folder) is imported as."""
    folder = root / LAYERS[layer][0]
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, layer, *parts])


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` import names (relative ones resolved against
    ``module``, a package when ``is_package``)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_modules(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[int, str]]:
    """``(line, absolute module)`` for every import in ``tree``, nested ones included. For
    ``from P import a`` that is ``P``, except that ``from remote_partitioner import server``
    (or a relative import that resolves to the bare package) yields
    ``remote_partitioner.server``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node)
            if base != PACKAGE:
                yield node.lineno, base
                continue
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = (
                func.attr if isinstance(func, ast.Attribute)
                else func.id if isinstance(func, ast.Name) else ""
            )
            first = node.args[0]
            if (name in ("import_module", "__import__") and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)):
                yield node.lineno, first.value


def layer_of(imported: str) -> str | None:
    """The layer a ``remote_partitioner.*`` module belongs to; None for a module outside the
    package or the bare package itself; ``"?"`` for a subpackage that is no known layer."""
    parts = imported.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    return parts[1] if parts[1] in LAYERS else "?"


def python_files(folder: Path) -> Iterator[Path]:
    """The .py files under ``folder``, sorted, skipping :data:`SKIP_DIRS`."""
    for path in sorted(folder.rglob("*.py")):
        if not SKIP_DIRS.intersection(path.relative_to(folder).parts[:-1]):
            yield path


def check(root: Path) -> list[Violation]:
    """Every import under ``root``'s layer folders that breaks :data:`LAYERS`; a folder
    that does not exist is skipped. A file that does not parse is a violation too."""
    violations: list[Violation] = []
    for layer, (folder_name, allowed) in LAYERS.items():
        folder = root / folder_name
        if not folder.is_dir():
            continue
        for path in python_files(folder):
            module = module_name(root, layer, path)
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            except (SyntaxError, UnicodeDecodeError) as e:
                violations.append(Violation(path, getattr(e, "lineno", 0) or 0, layer, "?",
                                            f"cannot be parsed: {e}"))
                continue
            for line, imported in imported_modules(tree, module, path.name == "__init__.py"):
                target = layer_of(imported)
                if target is None or target in allowed:
                    continue
                reason = (
                    f"{imported.split('.')[1]!r} is not a layer of {PACKAGE}"
                    if target == "?"
                    else f"{layer}/ may import only {', '.join(sorted(allowed))}"
                )
                violations.append(Violation(path, line, layer, imported, reason))
    return violations


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; print each violation; return 1 if there is any, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                        help="the repository root holding proto/, client/, server/, cli/")
    args = parser.parse_args(argv)
    violations = check(args.root)
    for v in violations:
        print(v, file=sys.stderr)
    if violations:
        print(f"check_layers: {len(violations)} import(s) break the layering", file=sys.stderr)
        return 1
    print("check_layers: proto/ <- client/, server/ <- cli/: layering holds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
