"""The training plan (`pydflash2 train --dry-run`) for 8B-class targets without their GGUFs:
the shapes of Llama-3.1-8B and Qwen3-8B (their Hugging Face config.json values) and a Q8_0
file size worked out from their parameter count (34 bytes per 32 weights).

    python benchmarks/train_plan.py [--batch 8] [--anchors 24] [--draft-vocab 8192]

docs/training.md's 8B table is this script's output with the defaults.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pydflash2.train.pipeline import TrainOptions, make_config
from pydflash2.train.plan import make_plan
from pydflash2.train.target import TargetInfo, tap_layers

# name: (layers, H, heads, kv heads, head dim, FFN, vocab, rope theta, tied embeddings)
SHAPES = {
    "Llama-3.1-8B": (32, 4096, 32, 8, 128, 14336, 128256, 500000.0, False),
    "Qwen3-8B": (36, 4096, 32, 8, 128, 12288, 151936, 1000000.0, False),
}


def target_params(n_layer: int, H: int, n_head: int, n_kv: int, hd: int, F: int, V: int, tied: bool,
                  qk_norm: bool) -> int:
    attn = H * n_head * hd * 2 + H * n_kv * hd * 2 + (2 * hd if qk_norm else 0)
    per_layer = attn + 3 * H * F + 2 * H
    return n_layer * per_layer + V * H * (1 if tied else 2) + H


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--n-seq", type=int, default=8)
    args = ap.parse_args()
    for name, (L, H, nh, nkv, hd, F, V, theta, tied) in SHAPES.items():
        info = TargetInfo(Path(f"{name} (Q8_0)"), "qwen3" if name.startswith("Qwen") else "llama", H, L, V, nh, nkv,
                          hd, F, theta, 1e-6, 0, "<mask>", 1)
        n = target_params(L, H, nh, nkv, hd, F, V, tied, qk_norm=name.startswith("Qwen"))
        opts = TrainOptions(target=info.path, out=Path("."), draft_vocab=args.draft_vocab, max_new=args.max_new,
                            n_seq=args.n_seq)
        cfg = make_config(opts, info, tap_layers(L, 5), [])
        plan = make_plan(info, cfg, n_draft=min(args.draft_vocab, V) or V, batch_seqs=args.batch,
                         anchors=args.anchors, max_new=args.max_new, n_seq=args.n_seq, queue_size=64,
                         target_bytes=n * 34 // 32)
        print(f"== {name}: {n / 1e9:.2f} B parameters")
        print(plan.render())
        print()


if __name__ == "__main__":
    main()
