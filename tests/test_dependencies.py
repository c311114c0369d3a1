"""Dependencies the project adds for speed only give ExecuTorch the data it would get without
them."""

from __future__ import annotations

from importlib import resources


def test_edge_yaml_loads_the_same_with_the_c_loader() -> None:
    """pyproject.toml depends on ruamel.yaml.clib so that ruamel.yaml's safe loader, which
    ExecuTorch's ``exir.dialects.edge._ops`` parses ``edge.yaml`` with on import, runs in C:
    the edge dialect's operator table is the same as the pure-Python loader's."""
    import executorch.exir.dialects.edge as edge_package
    from ruamel.yaml import YAML

    text = resources.files(edge_package).joinpath("edge.yaml").read_text(encoding="utf-8")
    c_loader = YAML(typ="safe")
    assert c_loader.Parser.__name__ == "CParser", "ruamel.yaml.clib is not in use"
    fast = c_loader.load(text)
    assert fast, "edge.yaml holds no operator"
    assert fast == YAML(typ="safe", pure=True).load(text)
