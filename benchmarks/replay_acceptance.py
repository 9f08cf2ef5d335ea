"""A drafter's acceptance replayed over a distilled dataset, without running the target.

The engine's greedy draft-verify loop, with the stored greedy continuation as the
truth and the stored target features as what the drafter is fed: per sequence the
prompt's rows are injected, then each step proposes a block from the anchor, picks
it greedily, accepts the longest prefix equal to the stored text, and injects the
rows it committed. Run it on the sequences a drafter was trained on and on its
held-out ones (the split `pydflash2 train` made): the first bounds what its
training budget can give on unseen text, however much data there is.

    python benchmarks/replay_acceptance.py --draft DIR/drafter.gguf --data DIR/data \
        --split train --sequences 64 --max-tokens 64
"""

from __future__ import annotations

import argparse

import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
import numpy as np
import pydflash2_testing as testing

from pydflash2.drafter import Drafter
from pydflash2.train.dataset import Dataset
from pydflash2.train.trainer import split_sequences


def replay(drafter: Drafter, data: Dataset, seq_ids: list[int], max_tokens: int, n_max: int) -> dict:
    steps = committed = 0
    drafted = np.zeros(n_max, dtype=np.int64)
    accepted = np.zeros(n_max, dtype=np.int64)
    for si in seq_ids:
        tokens, feats, plen = data.sequence(int(si))
        tokens = np.asarray(tokens)
        feats = np.asarray(feats, dtype=np.float32)
        end = min(len(tokens), plen + max_tokens)
        drafter.truncate(0)
        p = plen  # the first generated token (from the prompt's forward) is the first anchor
        drafter.inject(feats[:p], np.arange(p))
        while p < end - 1:
            n = min(n_max + 1, end - p)
            drafter.propose(int(tokens[p]), p, n)
            path = drafter.select_path("greedy")
            k = 0
            for j, t in enumerate(path.tokens):
                drafted[j] += 1
                if t != tokens[p + 1 + j]:
                    break
                accepted[j] += 1
                k += 1
            new_p = min(p + k + 1, end)
            drafter.inject(feats[p:new_p], np.arange(p, new_p))
            committed += new_p - p
            steps += 1
            p = new_p
    return {"sequences": len(seq_ids), "tau": committed / max(steps, 1),
            "acceptance": [float(a) / d if d else None for a, d in zip(accepted, drafted, strict=True)],
            "drafted": drafted.tolist()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", required=True, help="drafter GGUF")
    ap.add_argument("--data", required=True, help="the dataset folder `pydflash2 train` distilled (DIR/data)")
    ap.add_argument("--target", default=None, help="target GGUF (default: SmolLM2, the default target)")
    ap.add_argument("--split", choices=["train", "val"], default="val",
                    help="the training run's own split of the data (seed 0, 24 held-out sequences)")
    ap.add_argument("--sequences", type=int, default=64, help="at most this many sequences of the split")
    ap.add_argument("--max-tokens", type=int, default=64, help="continuation tokens replayed per sequence")
    ap.add_argument("--n-max", type=int, default=7, help="drafts per block")
    args = ap.parse_args()
    data = Dataset(args.data)
    train_ids, val_ids = split_sequences(data, 24, 0)
    ids = (train_ids if args.split == "train" else val_ids)[: args.sequences]
    target = args.target or str(testing.default_target())
    with Drafter(args.draft, target, n_ctx=4096) as drafter:
        r = replay(drafter, data, [int(i) for i in ids], args.max_tokens, args.n_max)
    acc = " ".join("-" if a is None else f"{a:.2f}" for a in r["acceptance"])
    print(f"{args.split}: {r['sequences']} sequences, tau {r['tau']:.2f}, acceptance per position {acc} "
          f"(drafted {r['drafted']})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
