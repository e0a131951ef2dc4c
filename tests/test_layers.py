"""The layer rule of docs/architecture.md, checked over every import in `streamfed/`: module-level, deferred (inside a
function) and by string (a dotted name of a streamfed module in a string constant, as `importlib` would take it).

Layers, bottom up: core (0); wire, privacy (1); algorithms (2); fleet (3); runtime, evaluation (4); cli, demo (5).
A module may import its own layer's package and anything below; one upward run-time import fails the test. Imports
under `if TYPE_CHECKING:` never run: they are listed apart (:func:`type_only_imports`) and allowed — a lower layer
may name an upper layer's type in an annotation (an algorithm's `build(cfg: FleetConfig)`), not use it.
aiomqtt and paho are imported by `runtime/` only.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "streamfed"
LAYERS = {"core": 0, "blas_threads": 0, "wire": 1, "privacy": 1, "algorithms": 2, "fleet": 3, "runtime": 4,
          "evaluation": 4, "cli": 5, "demo": 5}
MQTT_CLIENTS = ("aiomqtt", "paho")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted
    line: int
    how: str  # "module", "deferred", "string" or "type-only"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, root: Path = PACKAGE) -> list[Import]:
    """Every import of one file, with how it is made."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path, root)
    out: list[Import] = []

    def visit(node: ast.AST, how: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = how
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_stmt(stmt, "type-only")
                for stmt in child.orelse:
                    visit_stmt(stmt, how)
                continue
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and how == "module":
                inner = "deferred"
            visit_stmt(child, inner)

    def visit_stmt(node: ast.AST, how: str) -> None:
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this package
                pkg = me.split(".") if path.name == "__init__.py" else me.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                # `from streamfed.fleet import agent` imports the module streamfed.fleet.agent
                sub = f"{base}.{alias.name}"
                target = sub if base.startswith("streamfed") and _is_module(sub) else base
                out.append(Import(me, target, node.lineno, how))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                out.append(Import(me, alias.name, node.lineno, how))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("streamfed."):
            if _is_module(node.value):
                out.append(Import(me, node.value, node.lineno, "string"))
        visit(node, how)

    visit(tree, "module")
    return out


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def layer_of(dotted: str) -> str | None:
    parts = dotted.split(".")
    if parts[0] != "streamfed" or len(parts) < 2:
        return None
    return parts[1]


def violations(root: Path = PACKAGE) -> list[str]:
    """Upward run-time imports, and MQTT clients imported outside `runtime/`, as readable lines."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        for imp in imports_of(path, root):
            if imp.how == "type-only":
                continue
            src = layer_of(imp.module)
            if imp.target.split(".")[0] in MQTT_CLIENTS and src != "runtime":
                bad.append(f"{path.relative_to(root.parent)}:{imp.line}: {imp.how} import of {imp.target} outside "
                           "runtime/")
            dst = layer_of(imp.target)
            if src is None or dst is None or src == dst:
                continue
            if dst not in LAYERS or src not in LAYERS:
                bad.append(f"{path.relative_to(root.parent)}:{imp.line}: {src} or {dst} has no layer")
            elif LAYERS[dst] > LAYERS[src]:
                bad.append(f"{path.relative_to(root.parent)}:{imp.line}: {imp.how} import of {imp.target} points up "
                           f"({src} {LAYERS[src]} → {dst} {LAYERS[dst]})")
    return bad


def type_only_imports(root: Path = PACKAGE) -> list[Import]:
    return [imp for path in sorted(root.rglob("*.py")) for imp in imports_of(path, root) if imp.how == "type-only"]


def test_every_package_has_a_layer() -> None:
    tops = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
            if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists())) and p.name != "__init__.py"}
    assert tops == set(LAYERS), f"unranked: {tops - set(LAYERS)}; gone: {set(LAYERS) - tops}"


def test_dependencies_point_downwards_only() -> None:
    bad = violations()
    assert not bad, "\n".join(bad)


def test_type_only_imports_are_few_and_upward_only_for_annotations() -> None:
    """What the lower layers name from above, for annotations only (reviewed: the fleet configuration)."""
    upward = {imp.target for imp in type_only_imports()
              if (s := layer_of(imp.module)) and (d := layer_of(imp.target)) and s != d
              and LAYERS.get(d, 0) > LAYERS.get(s, 0)}
    assert upward <= {"streamfed.fleet.config"}, upward


@pytest.mark.parametrize("how", ["module", "deferred", "string"])
def test_the_check_can_fail(tmp_path: Path, how: str) -> None:
    """A fake package with one upward import of each kind, and one aiomqtt import in the fleet."""
    pkg = tmp_path / "streamfed"
    (pkg / "core").mkdir(parents=True)
    (pkg / "fleet").mkdir()
    for d in (pkg, pkg / "core", pkg / "fleet"):
        (d / "__init__.py").write_text("")
    body = {"module": "from streamfed.fleet import agent\n",
            "deferred": "def f():\n    from streamfed.fleet.agent import AgentCore\n",
            "string": "import importlib\nM = importlib.import_module('streamfed.fleet.agent')\n"}[how]
    (pkg / "core" / "bad.py").write_text(body)
    (pkg / "fleet" / "mqtt.py").write_text("def g():\n    import aiomqtt\n")
    found = violations(pkg)
    assert any("core/bad.py" in line and "points up" in line and how in line for line in found), found
    assert any("fleet/mqtt.py" in line and "aiomqtt outside runtime" in line for line in found), found
    # and a type-only import is not a violation
    (pkg / "core" / "bad.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                         "    from streamfed.fleet.agent import AgentCore\n")
    assert not any("core/bad.py" in line for line in violations(pkg))


def test_the_type_checkers_exemptions_only_shrink() -> None:
    """scripts/test.sh runs mypy on every module of streamfed/; modules listed in pyproject.toml's override are
    checked but their errors not enforced (issue 28). The list may shrink, never grow: a new module is typed."""
    import tomllib

    config = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    exempt = [m for o in config.get("overrides", []) if o.get("ignore_errors") for m in o["module"]]
    assert config["files"] == ["streamfed"]
    assert len(exempt) <= 54, f"{len(exempt)} modules exempt from type errors (54 when the check came in)"
    for m in exempt:  # every entry names a module that exists
        rel = m.replace(".", "/")
        assert (PACKAGE.parent / f"{rel}.py").is_file() or (PACKAGE.parent / rel / "__init__.py").is_file(), m
