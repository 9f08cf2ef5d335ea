"""Peak memory of `pydflash2 convert` on a >= 1 GB drafter checkpoint.

Generates a random bf16 DFlash2 drafter (one safetensors shard per layer, so
generation holds one layer at a time) plus a matching tiny-vocab target GGUF,
runs the converter under /usr/bin/time -v, and compares the peak RSS with
2 x the largest single tensor (as float32) + the fixed overhead measured by
converting a tiny drafter the same way. Exits 1 if over.

    python benchmarks/convert_memory.py [--workdir DIR] [--outtype f16] [--keep]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
import ml_dtypes
import numpy as np
import pydflash2_testing as testing
from safetensors.numpy import save_file

H, F, N_LAYER, N_HEAD, N_KV = 2048, 16384, 5, 16, 4


def _rand(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(ml_dtypes.bfloat16)


def make_big_checkpoint(d: Path, target: Path) -> tuple[Path, int]:
    """Writes the checkpoint shard by shard; returns (dir, largest tensor bytes as f32)."""
    d.mkdir(parents=True)
    shape = testing.read_target_shape(target)
    V = shape["n_vocab"]
    spec = testing.DrafterSpec(version=2, n_layer=N_LAYER, n_head=N_HEAD, n_head_kv=N_KV, n_ff=F,
                               conv_group_size=64, selector_rank=32, selector_top_k=16)
    cfg = testing.drafter_config(spec, H, V)
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    rng = np.random.default_rng(0)
    D = H // N_HEAD
    K, G, R = spec.conv_kernel_size, H // spec.conv_group_size, spec.selector_rank
    n_tl = len(spec.target_layer_ids)
    weight_map: dict[str, str] = {}
    largest = 0
    shards: list[dict[str, np.ndarray]] = []
    shards.append({
        "fc.weight": _rand(rng, (H, n_tl * H)),
        "hidden_norm.weight": np.ones(H, ml_dtypes.bfloat16),
        "norm.weight": np.ones(H, ml_dtypes.bfloat16),
        "candidate_selector.hidden_projection.weight": _rand(rng, (R, H)),
        "candidate_selector.predecessor_codebook": _rand(rng, (V, R)),
        "candidate_selector.successor_codebook": _rand(rng, (V, R)),
    })
    total = 0
    n_files = N_LAYER + 1
    for i in range(n_files):
        if i > 0:
            il, p = i - 1, f"layers.{i - 1}."
            t = {
                p + "input_layernorm.weight": np.ones(H, ml_dtypes.bfloat16),
                p + "post_attention_layernorm.weight": np.ones(H, ml_dtypes.bfloat16),
                p + "self_attn.q_proj.weight": _rand(rng, (N_HEAD * D, H)),
                p + "self_attn.k_proj.weight": _rand(rng, (N_KV * D, H)),
                p + "self_attn.v_proj.weight": _rand(rng, (N_KV * D, H)),
                p + "self_attn.o_proj.weight": _rand(rng, (H, N_HEAD * D)),
                p + "self_attn.q_norm.weight": np.ones(D, ml_dtypes.bfloat16),
                p + "self_attn.k_norm.weight": np.ones(D, ml_dtypes.bfloat16),
                p + "mlp.gate_proj.weight": _rand(rng, (F, H)),
                p + "mlp.up_proj.weight": _rand(rng, (F, H)),
                p + "mlp.down_proj.weight": _rand(rng, (H, F)),
            }
            for conv in ("attention_conv", "mlp_conv"):
                base = np.zeros((2, K, H), np.float32)
                base[:, 0] = 1
                t[f"{p}{conv}.base_kernel"] = base.astype(ml_dtypes.bfloat16)
                t[f"{p}{conv}.kernel_projection.weight"] = _rand(rng, (2 * K * G, H))
            del il
        else:
            t = shards.pop()
        part = f"model-{i + 1:05d}-of-{n_files:05d}.safetensors"
        save_file(t, str(d / part), metadata={"format": "pt"})
        for name, a in t.items():
            weight_map[name] = part
            largest = max(largest, a.size * 4)
            total += a.nbytes
        del t
    (d / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return d, largest


def peak_rss_kb(cmd: list[str], cwd: Path) -> int:
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, cwd=cwd)
    if r.returncode != 0:
        sys.exit(f"conversion failed ({r.returncode}):\n{r.stderr[-3000:]}")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
    assert m, r.stderr
    return int(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--outtype", default="f16", choices=["f32", "f16", "bf16", "q8_0"])
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="pydflash2-mem-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        target = testing.make_target_gguf(work / "target.gguf", testing.TargetSpec(n_embd=H, n_head=N_HEAD,
                                                                                  n_head_kv=N_KV, n_ff=256))
        small = testing.make_drafter_checkpoint(work / "small", target, testing.DrafterSpec(conv_group_size=64))
        big, largest = make_big_checkpoint(work / "big", target)
        size = sum(f.stat().st_size for f in big.glob("*.safetensors"))
        conv = [sys.executable, "-m", "pydflash2.convert", "--target", str(target), "--outtype", args.outtype,
                "--no-progress"]
        base_kb = peak_rss_kb([*conv, str(small), "-o", str(work / "small.gguf")], work)
        peak_kb = peak_rss_kb([*conv, str(big), "-o", str(work / "big.gguf")], work)
        limit = base_kb * 1024 + 2 * largest
        out_size = (work / "big.gguf").stat().st_size
        print(f"checkpoint: {size / 2**30:.2f} GiB bf16 in {len(list(big.glob('*.safetensors')))} shards; "
              f"output {out_size / 2**30:.2f} GiB {args.outtype}")
        print(f"largest tensor: {largest / 2**20:.0f} MiB as f32")
        print(f"fixed overhead (tiny drafter): {base_kb / 1024:.0f} MiB")
        print(f"peak RSS: {peak_kb / 1024:.0f} MiB; limit 2 x largest + overhead = {limit / 2**20:.0f} MiB")
        ok = peak_kb * 1024 <= limit
        print("OK" if ok else "OVER LIMIT")
        return 0 if ok else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
