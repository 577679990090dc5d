"""Lower floors never import higher ones (STYLE.md 15), read from the source.

Every module under todos/ and board/ is parsed, its imports collected (at module
level and inside functions), and these rules checked: todos/ imports nothing
from board/ (settings are read through ``django.conf.settings``); the todos
modules import each other without a cycle when they load; the floors (the
database, telemetry, the store) import none of what stands on them; the
database floor and telemetry import nothing of Switchboard's but themselves;
and MCP's two revisions share their JSON-RPC module without importing each
other.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What stands on the store: the agent and operator surfaces, the waiting, and
# the HTTP pieces they share.
ABOVE_THE_STORE = (
    "todos.api",
    "todos.mcp",
    "todos.sqs",
    "todos.webhooks",
    "todos.ui",
    "todos.waiting",
    "todos.web",
)
FLOORS = ("todos.db", "todos.telemetry", "todos.store")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path) -> dict[str, Path]:
    """Every module of todos/ and board/ by its dotted name."""
    return {
        module_name(path, root): path
        for top in ("todos", "board")
        for path in sorted((root / top).rglob("*.py"))
    }


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, bool]]:
    """The modules ``name`` imports, each with whether it imports it as it loads
    (not inside a function). ``from package import name`` is the submodule
    when there is one, else the package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if isinstance(child, ast.Import):
                found.extend((alias.name, not nested) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parent = package[: len(package) - child.level + 1]
                    base = ".".join([*parent, base] if base else parent)
                for alias in child.names:
                    submodule = f"{base}.{alias.name}"
                    found.append(
                        (submodule if submodule in known else base, not nested)
                    )
            visit(child, nested)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (its strongly connected components of
    more than one module), each sorted (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    lowest: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = lowest[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = lowest[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    lowest[node] = min(lowest[node], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    lowest[parent] = min(lowest[parent], lowest[node])
                if lowest[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def import_graph(root: Path) -> dict[str, list[tuple[str, bool]]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def todos_imports_of_board(graph: dict[str, list[tuple[str, bool]]]) -> list[str]:
    return sorted(
        f"{name} imports {target}"
        for name, found in graph.items()
        if within(name, ("todos",))
        for target, _ in found
        if within(target, ("board",))
    )


def load_time_cycles(graph: dict[str, list[tuple[str, bool]]]) -> list[list[str]]:
    todos = {name for name in graph if within(name, ("todos",))}
    return cycles(
        {
            name: {
                target
                for target, at_load in graph[name]
                if at_load and target in todos and target != name
            }
            for name in todos
        }
    )


def floors_reaching_up(graph: dict[str, list[tuple[str, bool]]]) -> list[str]:
    return sorted(
        f"{name} imports {target}"
        for name, found in graph.items()
        if within(name, FLOORS)
        for target, _ in found
        if within(target, ABOVE_THE_STORE)
    )


def reaching_past_itself(
    graph: dict[str, list[tuple[str, bool]]], package: str
) -> list[str]:
    """What ``package`` imports of Switchboard's that is not its own."""
    return sorted(
        f"{name} imports {target}"
        for name, found in graph.items()
        if within(name, (package,))
        for target, _ in found
        if within(target, ("todos", "board")) and not within(target, (package,))
    )


def database_floor_reaching_up(graph: dict[str, list[tuple[str, bool]]]) -> list[str]:
    return reaching_past_itself(graph, "todos.db")


def test_nothing_in_todos_imports_from_board():
    assert todos_imports_of_board(import_graph(ROOT)) == []


def test_the_todos_modules_load_without_an_import_cycle():
    assert load_time_cycles(import_graph(ROOT)) == []


def test_the_database_floor_and_the_store_import_nothing_above_them():
    assert floors_reaching_up(import_graph(ROOT)) == []


def test_the_database_floor_imports_nothing_of_switchboard_but_itself():
    """The async pool and the connection parameters stand below the store."""
    assert database_floor_reaching_up(import_graph(ROOT)) == []


def test_telemetry_imports_nothing_of_switchboard():
    """Tracing and the log formatters stand below the store, which traces."""
    assert reaching_past_itself(import_graph(ROOT), "todos.telemetry") == []


def test_the_mcp_revisions_share_json_rpc_without_importing_each_other():
    """The stateless revision and the transport both stand on todos.mcp.jsonrpc;
    the stateless one imports nothing of the transport, even in a function."""
    graph = import_graph(ROOT)
    assert ("todos.mcp.jsonrpc", True) in graph["todos.mcp.stateless"]
    assert [
        target
        for target, _ in graph["todos.mcp.stateless"]
        if within(target, ("todos.mcp.transport",))
    ] == []


def test_every_module_is_read():
    """The checks above see the floors, the surfaces and the serving."""
    graph = import_graph(ROOT)
    for name in (
        "todos.db.params",
        "todos.store.sql",
        "todos.mcp.transport",
        "todos.telemetry.tracing",
        "todos.waiting.doorbell",
    ):
        assert name in graph
    assert ("todos.db.replication", True) in graph["board.serving.pgbackend.base"]
    # The store awaits its agent-path statements on the database floor's pool.
    assert ("todos.db.pool", True) in graph["todos.store.sql"]
    # An import inside a function counts too (the middleware's lazy one).
    assert ("todos.mcp.transport", False) in graph["todos.web.middleware"]
