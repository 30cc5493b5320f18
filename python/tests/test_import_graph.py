"""The convnn package's modules import each other without a cycle (issue 43): imports inside
functions count too, since they only hide a cycle from Python's import order, not from a reader."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "convnn"


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path, modules):
    """The package's modules that `path` imports anywhere in its body (relative or absolute)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules)
    return found - {name}


def import_graph():
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imported_modules(path, paths) for name, path in paths.items()}


def cycles(graph):
    """Every cycle's module list (from a depth-first search; a package importing its own submodule
    and that submodule importing the package's other submodules is not a cycle unless they close)."""
    found, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_the_graph_sees_the_packages_imports():
    graph = import_graph()
    assert "convnn.nn.neighbours" in graph["convnn.nn.modules"]
    assert "convnn.nn.modules" in graph["convnn.viz"]


def test_no_two_of_the_packages_modules_import_each_other_even_inside_functions():
    """One kind of edge is left out: a submodule importing a name from a package above it (`from ..
    import x`), which Python resolves through that package's __init__, itself importing the
    submodule. The module behind the name (convnn.x) is still an edge."""
    graph = {name: {t for t in targets if not name.startswith(t + ".") or t == name}
             for name, targets in import_graph().items()}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_hidden_inside_a_function():
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b", "a"]]
