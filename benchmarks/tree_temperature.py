"""How the tree's path probabilities should be tempered, replayed offline over real lattices.

The target writes greedy continuations of the prompts (64 tokens each) and the drafter proposes a
block at every position of them, so each position's lattice is what a step starting there would
see (the drafter's context is the same whatever the step boundaries). A replay then walks each
text as greedy tree verification would, for any tree: from position p, a tree of B nodes built
from p's lattice accepts the depth it follows the text, and the next step starts past it. tau is
committed tokens per step, as the engine counts it (benchmarks/tree_verify.py measures the same
with the engine; the chain and the shipped temperature agree with it to about 0.02).

Per temperature T and budget B: tau of the best-first tree whose node probabilities are the
selector's softmax at T (the builder's own temperature, pydflash2.draft_tree.TEMPERATURE, applied to
scores scaled by TEMPERATURE / T), against the chain (the greedy selector's 7 drafts), and the ceiling
of a tree holding every path of the lattice.

    python benchmarks/tree_temperature.py [--prompts FILE] [--n 24] [--temperatures 1,1.5,2,2.5,3] [--draft F ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from pydflash2.draft_tree import TEMPERATURE, build_draft_tree
from pydflash2.drafter import Drafter
from pydflash2.models import default_drafter, default_target
from pydflash2.train.dataset import Dataset
from pydflash2.train.distill import distill
from pydflash2.train.prompts import read_prompts

EVAL = Path(__file__).with_name("prompts_chat_eval.txt")


def lattices(target: str, draft: str, prompts: list[str], workdir: Path, max_new: int) -> list[dict]:
    """Per text: its tokens after the prompt and, per position, the lattice and the greedy selector's path.
    The target's texts are distilled once per set of tapped layers (workdir keeps them)."""
    with Drafter(draft, target, n_ctx=1024, n_threads=1) as d:
        layers = [int(x) for x in d.hparams["target_layers"]]
        data_dir = workdir / ("data-" + "-".join(map(str, layers)))
        if not data_dir.exists():
            distill(target, prompts, data_dir, layers, n_seq=4, max_new=max_new, n_threads=1, progress=False)
        data = Dataset(data_dir)
        texts = []
        for si in range(len(data)):
            tokens, feats, plen = data.sequence(si)
            tokens, feats = np.asarray(tokens), np.asarray(feats, dtype=np.float32)
            d.truncate(0)
            d.inject(feats[:plen], np.arange(plen))
            steps = []
            for p in range(plen, len(tokens) - 1):
                prop = d.propose(int(tokens[p]), p, d.block_size)
                steps.append({"cand": prop.candidates.copy(), "scores": prop.scores.copy(),
                              "greedy": list(d.select_path("greedy").tokens)})
                d.inject(feats[p : p + 1], np.arange(p, p + 1))
            texts.append({"tokens": [int(t) for t in tokens[plen + 1 :]], "steps": steps})
    return texts


def replay(texts: list[dict], accepted) -> float:  # noqa: ANN001  (step, truth) -> accepted drafts
    steps = committed = 0
    for text in texts:
        p = 0
        while p < len(text["steps"]):
            m = accepted(text["steps"][p], text["tokens"][p:])
            steps, committed, p = steps + 1, committed + m + 1, p + m + 1
    return committed / steps


def chain(step: dict, truth: list[int]) -> int:
    m = 0
    while m < min(len(step["greedy"]), len(truth)) and step["greedy"][m] == truth[m]:
        m += 1
    return m


def every_path(step: dict, truth: list[int]) -> int:
    m = 0
    while m < min(len(step["cand"]), len(truth)) and truth[m] in step["cand"][m]:
        m += 1
    return m


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=Path, default=EVAL)
    ap.add_argument("--n", type=int, default=24, help="the first N prompts of the file")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--temperatures", default="1,1.5,2,2.5,3")
    ap.add_argument("--budgets", default="4,8,16,32")
    ap.add_argument("--draft", nargs="+", default=None, help="drafter GGUFs, each replayed (default: the shipped one)")
    args = ap.parse_args()
    prompts = read_prompts(args.prompts)[: args.n]
    temps = [float(t) for t in args.temperatures.split(",")]
    budgets = [int(b) for b in args.budgets.split(",")]
    drafts = args.draft or [str(default_drafter())]
    with tempfile.TemporaryDirectory() as tmp:
        for draft in drafts:  # side by side on the same target texts
            texts = lattices(str(default_target()), draft, prompts, Path(tmp), args.max_tokens)
            report(texts, draft, args, temps, budgets)
    return 0


def report(texts: list[dict], draft: str, args: argparse.Namespace, temps: list[float], budgets: list[int]) -> None:
    base = replay(texts, chain)
    print(f"\n{len(texts)} prompts of {args.prompts.name} x {args.max_tokens} tokens, drafter {draft}; the "
          f"builder's temperature is {TEMPERATURE:g}")
    ceiling = replay(texts, every_path)
    print(f"chain (7 drafts): tau {base:.3f}; a tree holding every path of the lattice: tau {ceiling:.3f} "
          f"({ceiling / base:.2f}x)")
    firsts = [(step, text["tokens"][p]) for text in texts for p, step in enumerate(text["steps"])]
    in_lattice = np.mean([t in s["cand"][0] for s, t in firsts])
    first_pick = np.mean([s["greedy"][0] == t for s, t in firsts])
    print(f"at depth 1 the lattice holds the target's token at {in_lattice:.0%} "
          f"of the positions, the greedy selector's first pick at {first_pick:.0%}")
    print("| T | " + " | ".join(f"tree {b}" for b in budgets) + " |")
    print("| --- |" + " --- |" * len(budgets))
    for t in temps:
        cells = []
        for b in budgets:
            def tree(step: dict, truth: list[int], b: int = b, t: float = t) -> int:
                return build_draft_tree(step["cand"], step["scores"] * (TEMPERATURE / t), b).match(truth)
            tau = replay(texts, tree)
            cells.append(f"{tau:.3f} ({tau / base:.2f}x)")
        print(f"| {t:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    raise SystemExit(main())
