"""No import cycle between the packages of fastdeploy (docs/design.md §5): the runner state and the packed step live in
model_executor/step_state.py, which model_executor/, worker/ and spec_decode/ import; none imports back up."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "fastdeploy"


def _package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "fastdeploy" and (PACKAGE / parts[1]).is_dir() else None


def package_graph() -> dict[str, set[str]]:
    """package -> packages its modules import at module level (imports inside functions are deliberate lazy
    imports and are not edges)."""
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        if len(rel.parts) < 2:
            continue
        source = rel.parts[0]
        edges = graph.setdefault(source, set())
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                target = _package_of(name)
                if target and target != source:
                    edges.add(target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path (first node repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_cycle_finder_reports_a_package_cycle():
    """The check can fail: a two-package cycle is found."""
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_fastdeploy_packages():
    """model_executor, worker and spec_decode (and every other package) form no cycle."""
    graph = package_graph()
    assert "worker" not in graph["model_executor"] and "spec_decode" not in graph["model_executor"]
    assert find_cycle(graph) is None, f"package import cycle: {' -> '.join(find_cycle(graph))}"


def _root_module_imports(name: str) -> set[str]:
    tree = ast.parse((PACKAGE / name).read_text(encoding="utf-8"))
    return {node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
            and node.module.startswith("fastdeploy")}


def test_the_shared_vocabulary_and_the_config_import_nothing_above_them():
    """fastdeploy/schema and fastdeploy/config.py sit below every layer: schema imports only itself, the config
    nothing from fastdeploy but the precision vocabulary (fastdeploy/precision.py) and the KV budget arithmetic
    (fastdeploy/kv_budget.py), which import nothing from it (the op backends' names live in the config, not in
    model_executor)."""
    assert package_graph()["schema"] == set()
    assert _root_module_imports("config.py") == {"fastdeploy.precision", "fastdeploy.kv_budget"}
    assert _root_module_imports("precision.py") == set()
    assert _root_module_imports("kv_budget.py") == set()
