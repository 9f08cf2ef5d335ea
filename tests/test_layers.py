"""The package's layers: no import cycles between its parts and no arrow from a lower layer up
(read from the source with ast, lazy imports inside functions included). Product code never
imports the test fixtures and benchmark helpers in pydflash2_testing, which the wheel does not ship."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# low to high; a part may import its own layer and the ones below
LAYERS: list[set[str]] = [
    {"_native", "cpu_threads", "llama_ext", "text_stream", "models", "kv_memory", "grammar_limits",
     "utf8_pieces"},
    {"info", "devices", "exactness", "capture", "drafter", "draft_costs", "draft_decision", "draft_tree", "convert",
     "chat_template", "sampling", "context_drafts", "json_schema", "_engine"},
    {"speculator", "ollama"},
    {"bench", "server", "train", "random_drafter"},
    {"cli", "__main__"},
]
FIXTURES = "pydflash2_testing"  # tests/support/pydflash2_testing, outside the wheel


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
                found |= {FIXTURES for a in node.names if a.name.split(".")[0] == FIXTURES}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] == FIXTURES:
                    found.add(FIXTURES)
                    continue
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
    if mod.endswith(".__main__"):
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
        if name:
            layer(name)


def test_no_arrow_up_and_no_fixtures_in_product_code() -> None:
    bad = []
    for mod, targets in imports(modules()).items():
        a = part(mod)
        if FIXTURES in targets:
            bad.append(f"{mod} imports the test fixtures ({FIXTURES})")
        if a == "":  # the public facade re-exports
            continue
        for t in targets - {FIXTURES}:
            b = part(t)
            if b == "":
                bad.append(f"{mod} imports the package facade (import the module itself)")
            elif b != a and layer(b) > layer(a):
                bad.append(f"{mod} (layer {layer(a)}) imports {t} (layer {layer(b)})")
    assert not bad, "\n".join(sorted(bad))


def test_no_cycles_between_parts() -> None:
    graph: dict[str, set[str]] = {}
    for mod, targets in imports(modules()).items():
        graph.setdefault(part(mod), set()).update(part(t) for t in targets if t != FIXTURES and part(t) != part(mod))
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


def test_the_installed_package_holds_no_test_tools() -> None:
    """The wheel ships the product only: the fixtures, the upstream oracle and the CPU hog stay in the
    repository (pydflash2_testing), as the README's install puts it."""
    import pydflash2

    installed = Path(pydflash2.__file__).resolve().parent
    assert not (installed / "testing").exists() and not (installed / "cpu_hog.py").exists()
    assert not (installed.parent / FIXTURES).exists()


# ---- the native engine's layers (native/src/engine) ----
ENGINE = ROOT / "native" / "src" / "engine"
MAX_FUNCTION_LINES = 80
# the step's parts: the planner and the batch builder are BatchEngine's; these know nothing of it
ENGINE_BELOW_STEP = ("cost_model", "step_price", "draft_length", "tree_budget", "verify", "draft_source",
                     "draft_sources", "target_sampling", "target_runner", "lazy_head", "batch_invariance",
                     "path_calibration", "context_index", "merged_draft_tree", "merged_draft_source",
                     "engine_stats", "step_ledger")


def function_lengths(path: Path) -> dict[str, int]:
    """Lines of each function defined at namespace scope in a C++ file (its signature to the `}`
    that closes it at column 0); one-line functions are left out."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: dict[str, int] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        skip = ("#", "//", "}", "namespace", "struct ", "class ", "using ", "constexpr ", " ", "\t")
        if line and not line.startswith(skip) and "(" in line and not line.rstrip().endswith((";", "}")):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].rstrip() in ("}", "};"))
            out[f"{path.name}:{i + 1} {line.split('(')[0].split()[-1]}"] = end - i + 1
            i = end
        i += 1
    return out


def test_engine_functions_are_short() -> None:
    lengths = {k: n for f in sorted(ENGINE.glob("*.cpp")) for k, n in function_lengths(f).items()}
    assert "batch_engine.cpp:" in " ".join(lengths) and len(lengths) > 50  # the counter finds them
    assert {k: n for k, n in lengths.items() if n > MAX_FUNCTION_LINES} == {}
    assert len((ENGINE / "batch_engine.cpp").read_text(encoding="utf-8").splitlines()) <= 600


def test_engine_parts_below_the_step_do_not_know_it() -> None:
    for name in ENGINE_BELOW_STEP:
        for f in ENGINE.glob(f"{name}.*"):
            text = f.read_text(encoding="utf-8")
            assert '#include "engine/batch_engine.h"' not in text, f.name


def test_draft_sources_do_not_know_the_engine() -> None:
    """Every draft source is a file of its own behind draft_source.h, registered in draft_sources.cpp;
    none knows the engine (or the planner) that asks it."""
    sources = sorted(ENGINE.glob("*_draft_source.h"))
    assert {f.stem for f in sources} >= {"dflash_draft_source", "context_draft_source", "repeat_draft_source",
                                         "merged_draft_source"}
    for f in sources + sorted(ENGINE.glob("*_draft_source.cpp")):
        text = f.read_text(encoding="utf-8")
        assert '#include "engine/batch_engine.h"' not in text and "BatchEngine" not in text, f.name
    registry = (ENGINE / "draft_sources.cpp").read_text(encoding="utf-8")
    for f in sources:
        if f.stem != "merged_draft_source":  # the composite is the slot's, not registered
            name = re.search(r'name\(\) const override \{ return "(\w+)"; \}', f.read_text(encoding="utf-8"))
            assert name is not None, f.name
            assert f.stem == "dflash_draft_source" or f'{{"{name[1]}",' in registry, f.name


def test_only_the_stats_recorder_writes_the_counters() -> None:
    """The engine's counters (BatchStats, each request's SlotStats) have one owner, engine_stats.*: the
    planner, the batch builder and the commits report through its methods; the step ledger's parts are
    written by its scopes; the draft sources' counters are kept by their dispatcher (SlotSources)."""
    write = re.compile(r"\b(?:stats|st)\.\w+(?:\[[^\]]*\])?\s*(?:\+=|-=|=(?!=)|\+\+)")
    for f in sorted(ENGINE.glob("*.cpp")):
        if f.stem != "engine_stats":
            text = f.read_text(encoding="utf-8")
            assert not write.search(text), f"{f.name}: {write.search(text)[0]!r}"
    assert write.search((ENGINE / "engine_stats.cpp").read_text(encoding="utf-8"))  # the pattern finds writes


def test_only_the_cost_model_chooses() -> None:
    """The one rate, committed tokens per second, is Price::rate in step_price.h, and the one choice
    among priced options is best_rate there: no other engine file divides by seconds or keeps a best
    rate of its own. Only the cost model (cost_model.*) calls the chooser (directly, or through
    weigh, which keeps every option it priced: a Decision); the planner asks the model and applies
    the chosen options. The Python
    side reads the engine's choices (draft_decision.py)."""
    rate = re.compile(r"/\s*std::max\([^;]*(seconds|1e-9)|best_rate\s*=|rate\s*>\s*\w*rate")
    choosers = {"cost_model.cpp", "merged_draft_tree.h", "step_price.h"}
    seen = set()
    for f in sorted(ENGINE.glob("*.[ch]*")):
        text = f.read_text(encoding="utf-8")
        if "best_rate(" in text:
            seen.add(f.name)
        if f.name == "step_price.h":
            continue
        assert not rate.search(text), f"{f.name}: {rate.search(text)[0]!r}"
        assert "template <class PriceOf> Choice best_rate" not in text, f.name
        if f.name.startswith(("batch_", "step_planner")):
            assert "step_seconds(" not in text and "Price{" not in text, f.name
    assert seen == choosers, seen ^ choosers
    decision = (ROOT / "pydflash2" / "draft_decision.py").read_text(encoding="utf-8")
    assert not re.search(r"_rate\"\]\s*>", decision)
    objective = (ROOT / "pydflash2" / "train" / "objective.py").read_text(encoding="utf-8")
    assert "run *= a" not in objective  # expected tau: the engines' formula through the C API


def test_the_target_chooses_in_one_place() -> None:
    """Greedy-or-draw is TargetSampler::sample; only rejection sampling (verify.cpp) draws otherwise."""
    for f in ENGINE.glob("*.cpp"):
        if f.name in ("target_sampling.cpp", "verify.cpp"):
            continue
        text = f.read_text(encoding="utf-8")
        assert "->greedy(" not in text and ".greedy(" not in text.replace("params().greedy(", ""), f.name
        assert "draw(" not in text and "distribution(" not in text, f.name
