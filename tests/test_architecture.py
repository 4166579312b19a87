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
