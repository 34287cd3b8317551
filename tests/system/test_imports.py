"""The package's import graph: no circles, no two folders (or top-level modules) importing each other, no
by-name imports the graph cannot see, and the target adapter imports nothing above it."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "blockdraft"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every blockdraft module `path` imports, at module level or inside a function (`TYPE_CHECKING`
    blocks are types only, never run, so they do not count)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    type_only = {id(node) for block in ast.walk(tree) if isinstance(block, ast.If)
                 and ast.unparse(block.test).endswith("TYPE_CHECKING") for node in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("blockdraft")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith("blockdraft"):
                continue
            for alias in node.names:  # `from . import x` may name a module
                candidate = f"{module}.{alias.name}"
                found.add(candidate if candidate in MODULES else module)
    return {_existing(module) for module in found} - {None, name}


def _existing(module: str) -> str | None:
    while module and module not in MODULES:
        module = module.rpartition(".")[0]
    return module or None


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}
GRAPH = {name: imports(path) for name, path in MODULES.items()}


def cycles() -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in GRAPH.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return found


def test_no_import_circles():
    assert cycles() == []


def unit(module: str) -> str:
    """The layer a module belongs to: its top-level folder (`decode`, `drafters`, ...) or, for a top-level
    module, itself (`blockdraft.tiny`)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def two_way_ties() -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Every pair of layers importing each other (a tangle even without a module circle), with the imports
    that tie them in both directions."""
    edges: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for module, imported in GRAPH.items():
        for other in imported:
            if unit(module) != unit(other):
                edges.setdefault((unit(module), unit(other)), []).append((module, other))
    return {(a, b): sorted(edges[a, b] + edges[b, a]) for a, b in edges if a < b and (b, a) in edges}


def test_no_two_folders_import_each_other():
    assert two_way_ties() == {}


def by_name_imports(path: Path) -> list[int]:
    """Lines of `path` that import a module by a name computed at run time (`importlib.import_module`,
    `__import__`): edges the graph above cannot see."""
    tree = ast.parse(path.read_text())
    return sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
                  and ast.unparse(node.func).split(".")[-1] in ("import_module", "__import__"))


def test_no_by_name_imports():
    found = {str(path.relative_to(PACKAGE.parent)): lines for path in sorted(PACKAGE.rglob("*.py"))
             if (lines := by_name_imports(path))}
    assert not found, f"import these modules by name in a plain table instead (file: lines): {found}"


def test_the_rules_see_a_tie_and_a_by_name_import(tmp_path):
    GRAPH["blockdraft.decode.zz_probe"] = {"blockdraft.drafters.tree"}  # decode -> drafters, the wrong way
    try:
        assert ("decode", "drafters") in two_way_ties()
    finally:
        del GRAPH["blockdraft.decode.zz_probe"]
    probe = tmp_path / "probe.py"
    probe.write_text("import importlib\n\ndef f(name):\n    return importlib.import_module(name)\n")
    assert by_name_imports(probe) == [4]


def test_the_target_engines_import_nothing_above_them():
    """`targets/` implements `decode/target.py`'s protocol and may import it; nothing else of `decode/` nor
    anything above (drafters, measurement, the CLI), and `decode/` never imports `targets/`: the loop
    receives a target object."""
    above = ("blockdraft.decode", "blockdraft.drafters", "blockdraft.eval", "blockdraft.cli", "blockdraft.drafter_spec")
    engines = [name for name in GRAPH if name.startswith("blockdraft.targets")]
    assert len(engines) >= 4
    assert not [(name, module) for name in engines for module in GRAPH[name]
                if module.startswith(above) and module != "blockdraft.decode.target"]
    assert not [(name, module) for name, imported in GRAPH.items() if name.startswith("blockdraft.decode")
                for module in imported if module.startswith("blockdraft.targets")]


# ------------------------------------------------------------------ function-local imports

#: what a function-local import's comment must say: the cycle it breaks or the dependency it defers
REASON = re.compile(r"\b(cycle|defer)", re.IGNORECASE)


def local_imports_without_reason(path: Path) -> list[int]:
    """Line numbers of the imports inside functions of `path` that no comment explains. An import is
    explained by a comment naming a cycle or a deferral (`REASON`) on its own lines or on the comment lines
    directly above it, or by being in a run of imports (adjacent statements) one of which is explained."""
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source)

    def commented(node) -> bool:
        text = [line.partition("#")[2] for line in lines[node.lineno - 1:node.end_lineno]]
        above = node.lineno - 2
        while above >= 0 and lines[above].strip().startswith("#"):
            text.append(lines[above])
            above -= 1
        return any(REASON.search(piece) for piece in text)

    missing = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            for body in (getattr(node, field, None) for field in ("body", "orelse", "finalbody", "handlers")):
                if not isinstance(body, list):
                    continue
                run: list[ast.stmt] = []
                for statement in [*body, None]:
                    if isinstance(statement, (ast.Import, ast.ImportFrom)):
                        run.append(statement)
                        continue
                    if run and not any(commented(item) for item in run):
                        missing += [item.lineno for item in run]
                    run = []
    return sorted(set(missing))


def test_function_local_imports_say_why():
    unexplained = {str(path.relative_to(PACKAGE.parent)): lines for path in sorted(PACKAGE.rglob("*.py"))
                   if (lines := local_imports_without_reason(path))}
    assert not unexplained, ("function-local imports without a comment saying which cycle they break or which heavy "
                             f"dependency they defer (file: lines): {unexplained}; move them to the top of the module")
