"""The layers stay independent (so that their agreement means something) and no two modules import each other,
read from the source: every import statement, those inside functions included."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("spec", "sim", "gpu", "harness", "cliplab")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            out.add(name)
            out.update(f"{name}.{a.name}" for a in node.names)  # `from . import x` may name a module
    return out


MODULES = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
           if "workers" not in p.parts}  # target workers run in other interpreters


def project_imports(name: str) -> set[str]:
    return {m for m in imports(MODULES[name]) if m in MODULES and m != name}


@pytest.mark.parametrize("layer, forbidden", [("spec", ("sim", "gpu", "harness", "torch")),
                                              ("sim", ("gpu", "harness", "torch")),
                                              ("gpu", ("sim", "harness"))])
def test_layers_do_not_import_each_other(layer, forbidden):
    bad = {(name, m) for name in MODULES if name.split(".")[0] == layer
           for m in imports(MODULES[name]) if m.split(".")[0] in forbidden}
    assert not bad


def test_no_import_cycles():
    graph = {name: project_imports(name) for name in MODULES}
    state, cycles = {}, []

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    # a package's __init__ importing its own submodules is not a cycle between modules
    cycles = [c for c in cycles if not any(a.startswith(b + ".") or b.startswith(a + ".") for a, b in zip(c, c[1:]))]
    assert not cycles


def folder(name: str) -> str:
    """The capability folder of a harness module (harness.reports.claims -> harness.reports); others: themselves."""
    parts = name.split(".")
    return ".".join(parts[:2]) if parts[0] == "harness" and len(parts) > 2 else name


def test_harness_folders_import_one_way():
    """harness's capability folders (verify, conform, reports, recipes, runs) form no cycle between them either."""
    graph = {}
    for name in MODULES:
        if name.startswith("harness.") and folder(name) != name:
            graph.setdefault(folder(name), set()).update(
                folder(m) for m in project_imports(name) if m.startswith("harness.") and folder(m) != folder(name))
    done, stack = set(), []

    def visit(node):
        assert node not in stack, " -> ".join(stack[stack.index(node):] + [node])
        if node in done:
            return
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            visit(nxt)
        stack.pop()
        done.add(node)

    for node in sorted(graph):
        visit(node)


def test_harness_is_folders_and_a_thin_top():
    top = sorted(p.name for p in (ROOT / "harness").glob("*.py"))
    assert top == ["__init__.py", "cli.py"]
    for sub in (ROOT / "harness").iterdir():
        if sub.is_dir() and sub.name != "__pycache__":
            doc = ast.get_docstring(ast.parse((sub / "__init__.py").read_text()))
            assert doc and "\n" not in doc.strip(), f"{sub.name}/__init__.py: a one-line docstring saying what it owns"
