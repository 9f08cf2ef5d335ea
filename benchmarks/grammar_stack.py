"""Where llama.cpp's grammar parser overflows the stack: each grammar is parsed by
llama_sampler_init_grammar in a fresh process (a crash is a data point, not the end of the run),
on the main thread or on a Python thread with --stack-mib, and the size is bisected between
the last that parsed and the first that crashed. Kinds: `nest` (( ) groups nested n deep),
`nestq` (what llama-cpp-python's converter writes for maxLength n: n nested optional groups),
`chain` (n rules, each the next one's first symbol: the left-recursion check's recursion).
The results are in docs/server.md, "Grammar and schema limits".

    python benchmarks/grammar_stack.py [--kind nest,nestq,chain] [--stack-mib 0]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import sys, threading
import llama_cpp
gguf, kind, n, stack = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
llama_cpp.llama_backend_init()
mp = llama_cpp.llama_model_default_params(); mp.vocab_only = True
model = llama_cpp.llama_model_load_from_file(gguf.encode(), mp)
vocab = llama_cpp.llama_model_get_vocab(model)
if kind == "nest":
    g = "root ::= " + "(" * n + '"a"' + ")" * n + "\n"
elif kind == "nestq":
    g = "root ::= " + '("a" ' * n + ")?" * n + "\n"
else:
    g = "root ::= r0\n" + "".join(f"r{i} ::= r{i+1}\n" for i in range(n)) + f'r{n} ::= "a"\n'
ok = []
run = lambda: ok.append(bool(llama_cpp.llama_sampler_init_grammar(vocab, g.encode(), b"root")))
if stack:
    threading.stack_size(stack << 20)
    t = threading.Thread(target=run); t.start(); t.join()
else:
    run()
sys.exit(0 if ok[0] else 3)
"""


def crashes(gguf: Path, kind: str, n: int, stack_mib: int) -> bool:
    r = subprocess.run([sys.executable, "-c", CHILD, str(gguf), kind, str(n), str(stack_mib)],
                       capture_output=True, timeout=600)
    return r.returncode < 0 or r.returncode > 128  # killed by a signal (SIGSEGV)


def bisect(gguf: Path, kind: str, stack_mib: int, lo: int = 1000, hi: int = 2_000_000) -> tuple[int, int]:
    """(largest size that parsed or was refused, smallest that crashed), within 1%."""
    if not crashes(gguf, kind, hi, stack_mib):
        return hi, -1
    while hi - lo > max(1, lo // 100):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if crashes(gguf, kind, mid, stack_mib) else (mid, hi)
    return lo, hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", default="nest,nestq,chain")
    ap.add_argument("--stack-mib", type=int, default=0, help="parse on a thread with this stack (0: main thread)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
    import pydflash2_testing as testing

    with tempfile.TemporaryDirectory() as d:
        gguf = testing.make_target_gguf(Path(d) / "target.gguf")
        for kind in args.kind.split(","):
            ok, crash = bisect(gguf, kind, args.stack_mib)
            where = f"a {args.stack_mib} MiB thread" if args.stack_mib else "the main thread"
            print(f"{kind}: parses at {ok}, crashes at {crash} on {where}" if crash > 0
                  else f"{kind}: no crash up to {ok} on {where}", flush=True)


if __name__ == "__main__":
    main()
