"""Which llama.cpp architectures name every layer's output `l_out-<il>` (the
callback capture path) and which record layer inputs (upstream's taps).

Static reading of a llama.cpp source tree (the pinned one: the sdist of
llama-cpp-python 0.3.36, vendor/llama.cpp):

    python tools/audit_layer_outputs.py /path/to/vendor/llama.cpp

For each name in src/llama-arch.cpp's LLM_ARCH_NAMES it follows
llama_model_mapping (src/llama-model.cpp) to the model class, the class to the
graph it builds (src/models/models.h: its own `struct graph`, or `using graph =
other::graph`), and that graph's constructor body in src/models/*.cpp, and
reports whether the body calls cb(..., "l_out", il) and sets t_layer_inp.
A graph that names l_out inside the layer loop names it for every layer.
It is a reading aid: the runtime check (CallbackCapture::check_complete) is
what decides, and names the layer when a graph lacks one.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def _definitions(text: str) -> list[tuple[str, str]]:
    """(header line, body) of every top-level definition in a .cpp file (body ends at a column-0 brace)."""
    out = []
    for m in re.finditer(r"^(?![\s}#/])([^;{]*?)\{\s*\n(.*?)^\}", text, re.S | re.M):
        out.append((m.group(1), m.group(2)))
    return out


def main(root: str) -> int:
    src = Path(root) / "src"
    names = dict(re.findall(r"\{\s*(LLM_ARCH_\w+),\s*\"([^\"]+)\"", (src / "llama-arch.cpp").read_text()))
    mapping = dict(
        re.findall(r"case (LLM_ARCH_\w+):\s*return new (llama_model_\w+)\(", (src / "llama-model.cpp").read_text())
    )
    header = (src / "models" / "models.h").read_text()
    aliases: dict[str, str] = {}
    struct = r"^struct (llama_model_\w+)\s*:\s*public (llama_model_\w+)\s*\{(.*?)^\};"
    for m in re.finditer(struct, header, re.S | re.M):
        cls, base, body = m.groups()
        own = re.search(r"struct graph\s*:", body)
        alias = re.search(r"using graph\w* = (llama_model_\w+)::graph", body)
        if alias:
            aliases[cls] = alias.group(1)
        elif not own:
            aliases[cls] = base  # inherits build_arch_graph's graph from its base
    bodies: dict[str, str] = {}
    for f in sorted((src / "models").glob("*.cpp")):
        for head, body in _definitions(f.read_text()):
            m = re.search(r"(llama_model_\w+)::graph(?:<[^>]*>)?::", head)
            if m:
                bodies[m.group(1)] = bodies.get(m.group(1), "") + body
    rows = []
    for enum, name in names.items():
        cls = mapping.get(enum)
        if cls is None:
            rows.append((name, "-", "no model class"))
            continue
        seen = set()
        while cls not in bodies and cls in aliases and cls not in seen:
            seen.add(cls)
            cls = aliases[cls]
        body = bodies.get(cls, "")
        if not body:
            rows.append((name, cls, "graph body not found"))
            continue
        l_out = '"l_out"' in body
        taps = "t_layer_inp" in body
        rows.append((name, cls, ("tap" if taps else "callback" if l_out else "NO l_out")))
    for r in rows:
        print(f"{r[0]:<22} {r[1]:<36} {r[2]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
