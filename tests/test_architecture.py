"""The package's shape: no import cycle between its modules (imports inside functions counted,
only `if TYPE_CHECKING:` ones excepted), and no module too long to read."""
import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "jaxmem"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: pathlib.Path, known: dict) -> set[str]:
    """The package's modules `name` imports, wherever in the file the import stands."""
    tree = ast.parse(path.read_text())
    type_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                 for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    out = set()
    for m in found:
        while m and m not in known:
            m = m.rpartition(".")[0]
        if m and m not in (name, "jaxmem"):
            out.add(m)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_cycle_finder_finds_a_lazy_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_modules():
    known = _modules()
    graph = {n: _imports(n, p, known) for n, p in known.items()}
    cycles = _cycles(graph)
    assert not cycles, "import cycles (each: the modules that import one another): " + "; ".join(
        f"{c}: " + ", ".join(f"{a} -> {sorted(graph[a] & set(c))}" for a in c) for c in cycles)


def test_no_module_is_too_long_to_read():
    """cli.py is click wiring (at most 500 lines); no module over 600."""
    lengths = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    too_long = {p: n for p, n in lengths.items() if n > (500 if p == "jaxmem/cli.py" else 600)}
    assert not too_long, f"modules over their length: {too_long}"


# No function over MAX_FUNCTION_LINES (issue 36). STILL_LONG names any allowed over it, with its length:
# each may only shrink, and the list only lose names; a new long function fails the test below.
MAX_FUNCTION_LINES = 80
STILL_LONG: dict[str, int] = {}


def _function_lengths() -> dict[str, int]:
    """file::name -> lines, for every function and method of the package (nested ones too)."""
    out: dict[str, int] = {}
    for p in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"{p.relative_to(ROOT).as_posix()}::{node.name}"
                out[key] = max(out.get(key, 0), node.end_lineno - node.lineno + 1)
    return out


def test_no_function_is_too_long_to_read():
    lengths = _function_lengths()
    too_long = {k: n for k, n in lengths.items() if n > STILL_LONG.get(k, MAX_FUNCTION_LINES)}
    assert not too_long, f"functions over {MAX_FUNCTION_LINES} lines (or longer than STILL_LONG allows): {too_long}"
    shrunk = {k: lengths.get(k) for k, n in STILL_LONG.items() if lengths.get(k, 0) <= MAX_FUNCTION_LINES}
    assert not shrunk, f"now within {MAX_FUNCTION_LINES} lines (or gone): drop them from STILL_LONG: {shrunk}"


def test_the_analysis_is_stages_of_short_functions():
    lengths = _function_lengths()
    analysis = {k: n for k, n in lengths.items() if k.startswith("jaxmem/analysis/")}
    assert analysis and max(analysis.values()) <= 60, analysis


def _imports_inside_functions() -> int:
    """Import statements inside a function body (each counted once, however deeply nested)."""
    count = 0
    for p in PACKAGE.rglob("*.py"):
        tree = ast.parse(p.read_text())
        inner = {id(n) for f in ast.walk(tree) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f) if isinstance(n, (ast.Import, ast.ImportFrom))}
        count += len(inner)
    return count


# Issue 36: at most 70. Every command and API call sets the environment first (jaxmem.session) and loads
# the jax side in one import (jaxmem.commands); below it, modules import at their tops. What is left:
# jax-free modules (`import jaxmem`, the CLI's prechecks) deferring jax, and packages only some runs need
# (flax.nnx, qwix, matplotlib, NVML, Ray, PyYAML), each with a noqa for PLC0415 saying why (ruff enforces the
# rule on jaxmem/, pyproject.toml). The count may only fall.
MAX_IMPORTS_INSIDE_FUNCTIONS = 68   # 338 before issue 36; 359 after stop 33's merge; 65 with jaxmem.session;
# 68 with `jaxmem cache`, `diff` and `gpus` jax-free again (jaxmem.plain_commands, the cache's keys deferring jax)


def test_imports_inside_functions_do_not_grow():
    assert _imports_inside_functions() <= MAX_IMPORTS_INSIDE_FUNCTIONS


def test_every_listed_slow_test_still_exists():
    """tests/slow_tests.txt names tests by id: a renamed or deleted test must leave it (else its
    replacement silently escapes the slow marker)."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    import slow_list

    listed = slow_list.LIST.read_text().split()
    stale = [t for t in listed if not slow_list.still_defined(t)]
    assert listed and not stale, f"ids in tests/slow_tests.txt that name no test: {stale}"
