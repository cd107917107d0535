"""The house keeps its shape: layers point down, no import cycles, small modules.

Read from the source with ``ast`` (function-level imports count), no import
of raysleuth itself. Every top-level unit of ``src/raysleuth`` has a layer in
``LAYERS``; an import may point to its own layer or below, never above, and no
two modules may import each other, directly or around a loop.

Its height is counted in floors: the longest chain of imports between
top-level units, units that import each other counted as one floor
(``FLOORS``, issue 28 wants 12 or fewer).

What the house already owes is listed in ``DEBT`` (issue 13), each entry
exactly as measured. The test is a ratchet both ways: anything not in the
list fails, and an entry that no longer holds fails too, so paying a debt
means deleting its line.
"""

from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "raysleuth"

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 80

CORE, INSTRUMENTS, FEATURES, ORCHESTRATION, FACES = range(5)
LAYER_NAMES = ["core", "instruments", "features", "orchestration", "faces"]

# Each top-level unit (module or package) of raysleuth, and its layer (DESIGN.md "Layers").
LAYERS: dict[str, int] = {
    "errors": CORE, "runtime": CORE, "cluster": CORE, "agents": CORE, "recorder": CORE, "evidence": CORE,
    "control": CORE, "labels": CORE, "modes": CORE, "redaction": CORE, "native_stderr": CORE,
    "ray_private": CORE, "options": CORE,
    "progress": INSTRUMENTS, "tracing": INSTRUMENTS, "coroutines": INSTRUMENTS,
    "advise": FEATURES, "breakpoints": FEATURES, "collectives": FEATURES, "consistency": FEATURES,
    "deaths": FEATURES, "doctor": FEATURES, "explain": FEATURES, "fingerprints": FEATURES,
    "logs": FEATURES, "memory": FEATURES, "postmortem": FEATURES, "stacks": FEATURES,
    "stragglers": FEATURES, "tasks": FEATURES, "timeline": FEATURES, "weights": FEATURES,
    "integrations": ORCHESTRATION, "monitoring": ORCHESTRATION, "pool": ORCHESTRATION,
    "stall": ORCHESTRATION, "worker_setup": ORCHESTRATION,
    "cli": FACES, "demo": FACES, "report": FACES, "__init__": FACES, "__main__": FACES, "entry": FACES,
}

# The house's height: the longest chain of imports between top-level units (units that import each other,
# such as agents and recorder, are one floor). Measured, exact both ways: lower it when a floor goes.
# Issue 28 wants 12 or fewer; today's chain is __main__ cli integrations pool logs memory breakpoints
# control (agents, recorder) cluster ray_private errors (verl's weight-sync adapter moved from
# integrations to the weights feature, so worker_setup no longer stands on integrations).
FLOORS = 12

# What the house owes today (issue 13). Delete a line when its debt is paid.
DEBT_CYCLES: set[frozenset[str]] = set()
DEBT_UP_ARROWS: set[tuple[str, str]] = set()
DEBT_MODULES: set[str] = set()
DEBT_FUNCTIONS: set[str] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / PACKAGE).rglob("*.py"):
        parts = list(path.relative_to(SRC / PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rsplit(".", 1)[0] if "." in name else ""
    return name or None


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """raysleuth modules that ``name`` imports anywhere in its body (relative to the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - node.level + 1]
                module = ".".join([PACKAGE] + base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # "from m import a": the submodule m.a where there is one, else m itself
            candidates = [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for full in candidates:
            if not full.startswith(PACKAGE + "."):
                continue
            short = full[len(PACKAGE) + 1:]
            target = short if short in modules else _resolve(short.rpartition(".")[0], modules)
            if target and target != name and target != "__init__":
                targets.add(target)
    return targets


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _unit(module: str) -> str:
    return module.split(".", 1)[0]


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    counter = itertools.count()

    def visit(node: str) -> None:
        index[node] = low[node] = next(counter)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.add(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_checker_sees_a_function_level_import(tmp_path):
    """The graph counts imports inside functions (a cycle hidden there is still a cycle)."""
    graph = _graph()
    assert "labels.live" in graph["stacks.capture"], "stacks.capture imports labels at module level"
    assert "recorder" in graph["labels.live"], "labels.live imports the writer inside registered_labels"


def test_every_unit_has_a_layer():
    units = {_unit(name) for name in _graph()}
    missing = sorted(units - set(LAYERS))
    assert not missing, f"give these a layer in LAYERS (tests/test_house.py): {missing}"


def test_no_import_cycles_beyond_the_listed_debt():
    cycles = set(_cycles(_graph()))
    new = cycles - DEBT_CYCLES
    paid = DEBT_CYCLES - cycles
    assert not new, f"import cycles: {[sorted(c) for c in new]}"
    assert not paid, f"these cycles are gone: delete them from DEBT_CYCLES: {[sorted(c) for c in paid]}"


def test_arrows_point_down_beyond_the_listed_debt():
    up = set()
    for name, targets in _graph().items():
        for target in targets:
            source_unit, target_unit = _unit(name), _unit(target)
            if LAYERS.get(target_unit, FACES) > LAYERS.get(source_unit, FACES):
                up.add((source_unit, target_unit))
    new = up - DEBT_UP_ARROWS
    paid = DEBT_UP_ARROWS - up
    described = [f"{s} ({LAYER_NAMES[LAYERS[s]]}) -> {t} ({LAYER_NAMES[LAYERS[t]]})" for s, t in sorted(new)]
    assert not new, f"imports that point up a layer: {described}"
    assert not paid, f"these arrows are gone: delete them from DEBT_UP_ARROWS: {sorted(paid)}"


def test_modules_and_functions_stay_small_beyond_the_listed_debt():
    big_modules, big_functions = set(), set()
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > MAX_MODULE_LINES:
            big_modules.add(name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    big_functions.add(f"{name}:{node.name}")
    assert not big_modules - DEBT_MODULES, f"modules over {MAX_MODULE_LINES} lines: {sorted(big_modules - DEBT_MODULES)}"
    assert not big_functions - DEBT_FUNCTIONS, (
        f"functions over {MAX_FUNCTION_LINES} lines: {sorted(big_functions - DEBT_FUNCTIONS)}")
    paid = (DEBT_MODULES - big_modules) | (DEBT_FUNCTIONS - big_functions)
    assert not paid, f"these are small now: delete them from the DEBT lists: {sorted(paid)}"


def _floors(graph: dict[str, set[str]]) -> tuple[int, list[str]]:
    """The longest import chain between top-level units, a strongly connected group of units being one floor."""
    units: dict[str, set[str]] = {}
    for name, targets in graph.items():
        units.setdefault(_unit(name), set()).update(_unit(t) for t in targets if _unit(t) != _unit(name))
    floor_of = {unit: unit for unit in units}
    for group in _cycles(units):
        label = "(" + ", ".join(sorted(group)) + ")"
        floor_of.update({unit: label for unit in group})
    condensed: dict[str, set[str]] = {}
    for unit, targets in units.items():
        condensed.setdefault(floor_of[unit], set()).update(floor_of[t] for t in targets if floor_of[t] != floor_of[unit])
    height: dict[str, list[str]] = {}

    def chain(node: str) -> list[str]:
        if node not in height:
            below = max((chain(t) for t in sorted(condensed.get(node, ()))), key=len, default=[])
            height[node] = [node] + below
        return height[node]

    tallest = max((chain(node) for node in sorted(condensed)), key=len)
    return len(tallest), tallest


def test_the_house_keeps_its_floors():
    floors, tallest = _floors(_graph())
    assert floors <= FLOORS, f"the house grew to {floors} floors (FLOORS = {FLOORS}): {' -> '.join(tallest)}"
    assert floors == FLOORS, f"the house has {floors} floors now: lower FLOORS to {floors} ({' -> '.join(tallest)})"


def _unreasoned_lazy_imports(name: str, path: Path, modules: dict[str, Path]) -> list[str]:
    """``module:line`` of each raysleuth import inside a function with no ``# lazy:`` reason beside it."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    import_lines = {line for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for line in range(node.lineno, node.end_lineno + 1)}

    def reasoned(line: int) -> bool:
        return "# lazy:" in lines[line - 1] and bool(lines[line - 1].split("# lazy:", 1)[1].strip())

    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if not (getattr(node, "level", 0) or any(n.split(".")[0] == PACKAGE for n in names)):
                continue
            above = node.lineno - 1  # a reason above a run of imports covers the run
            while above in import_lines and not reasoned(above):
                above -= 1
            if not any(reasoned(line) for line in range(node.lineno, node.end_lineno + 1)) and \
                    not (above >= 1 and reasoned(above)):
                found.append(f"{name}:{node.lineno}")
    return sorted(set(found))


def test_an_import_inside_a_function_says_why():
    """Imports sit at the module's head, unless they must wait: ``# lazy: <reason>`` says why (issue 28)."""
    modules = _modules()
    missing = [where for name, path in modules.items() for where in _unreasoned_lazy_imports(name, path, modules)]
    assert not missing, ("move these raysleuth imports to the module's head, or say why they wait with "
                         f"'# lazy: <reason>' on the line or the line above: {missing}")


def test_the_lazy_import_check_sees_one_without_a_reason(tmp_path):
    module = tmp_path / "sample.py"
    module.write_text("def f():\n    from raysleuth import cluster\n\n\ndef g():\n"
                      "    from raysleuth import runtime  # lazy: a reason\n\n\ndef h():\n"
                      "    # lazy: another reason\n    from raysleuth.errors import UsageError\n    import os\n"
                      "    from raysleuth import modes\n    x = 1\n    from raysleuth import options\n")
    assert _unreasoned_lazy_imports("sample", module, {}) == ["sample:15", "sample:2"]
