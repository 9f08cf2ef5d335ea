"""The package's layers: no import cycles between its parts and no arrow from a lower layer up
(read from the source with ast, lazy imports inside functions included). Product code never
imports the test fixtures in pydflash2.testing."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# low to high; a part may import its own layer and the ones below
LAYERS: list[set[str]] = [
    {"_native", "cpu_threads", "llama_ext", "text_stream", "cpu_hog", "models"},
    {"info", "devices", "exactness", "capture", "drafter", "draft_costs", "draft_decision", "draft_tree", "convert",
     "chat_template", "sampling", "_engine"},
    {"speculator", "ollama"},
    {"bench", "server", "train", "random_drafter"},
    {"cli", "__main__"},
]
FIXTURES = "testing"


def modules() -> dict[str, Path]:
    """Dotted name -> file; convert/ ships as pydflash2.convert."""
    out = {}
    for base, prefix in ((ROOT / "pydflash2", ["pydflash2"]), (ROOT / "convert", ["pydflash2", "convert"])):
        for f in base.rglob("*.py"):
            parts = prefix + list(f.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the pydflash2 modules it imports."""

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {m for a in node.names if (m := resolve(a.name))}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if not source.startswith("pydflash2"):
                    continue
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    if sub in mods:
                        found.add(sub)
                    elif alias.name != "__version__" and (m := resolve(source)):
                        found.add(m)
        edges[mod] = {m for m in found if m != mod}
    return edges


def part(mod: str) -> str:
    """pydflash2.server.app -> server; the package root -> ''; every `python -m` entry point (a
    __main__ module) is a command, at the top like the CLI."""
    if mod.endswith(".__main__") and not mod.startswith(f"pydflash2.{FIXTURES}"):
        return "__main__"
    return mod.split(".")[1] if "." in mod else ""


def layer(name: str) -> int:
    for i, names in enumerate(LAYERS):
        if name in names:
            return i
    raise AssertionError(f"pydflash2.{name} has no layer in tests/test_layers.py: place it")


def test_every_part_has_a_layer() -> None:
    for mod in modules():
        name = part(mod)
        if name not in ("", FIXTURES):
            layer(name)


def test_no_arrow_up_and_no_fixtures_in_product_code() -> None:
    bad = []
    for mod, targets in imports(modules()).items():
        a = part(mod)
        if a in ("", FIXTURES):  # the public facade re-exports; fixtures may use anything
            continue
        for t in targets:
            b = part(t)
            if b == FIXTURES:
                bad.append(f"{mod} imports the test fixtures {t}")
            elif b == "":
                bad.append(f"{mod} imports the package facade (import the module itself)")
            elif b != a and layer(b) > layer(a):
                bad.append(f"{mod} (layer {layer(a)}) imports {t} (layer {layer(b)})")
    assert not bad, "\n".join(sorted(bad))


def test_no_cycles_between_parts() -> None:
    graph: dict[str, set[str]] = {}
    for mod, targets in imports(modules()).items():
        graph.setdefault(part(mod), set()).update(part(t) for t in targets if part(t) != part(mod))
    graph.pop("", None)
    for g in graph.values():
        g.discard("")
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(nxt):] + [node, nxt])
                                     if nxt in path else f"import cycle through {node} -> {nxt}")
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
