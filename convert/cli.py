"""`pydflash2 convert` / `python -m pydflash2.convert`: HF drafter -> dflash GGUF."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from .checkpoint import CheckpointError, load_mask_embedding, open_checkpoint
from .target import TargetError, open_target
from .validate import validate, warnings
from .writer import OUTTYPES, plan_tensors, write_gguf

EXIT_OK, EXIT_FAILED, EXIT_INVALID = 0, 1, 2

DESCRIPTION = """\
Convert a DFlash or DFlash2 drafter published in the Hugging Face layout
(config.json with dflash_config, *.safetensors, possibly sharded with
model.safetensors.index.json, bf16/f16/f32, optional mask_embedding.pt) into a
GGUF that follows upstream llama.cpp's `dflash` architecture, so the same file
runs in pydflash2, llama-server and Ollama.

The drafter has no tokenizer of its own: TARGET provides it. TARGET is either
the target's GGUF file (its tokenizer.* keys and chat template are copied) or
the target's Hugging Face directory (tokenizer.json / tokenizer.model read
through gguf.vocab). The target's hidden size, layer count and vocabulary size
are checked against the drafter.
"""

EPILOG = """\
checks (all run before anything is written; each problem is reported, exit code 2):
  drafter hidden size equals the target's; vocabulary sizes agree (unless the
  drafter ships a reduced-vocab d2t); every target_layer_id is below the target's
  layer count; mask_token_id is inside the vocabulary; the DFlash2 keys
  (conv_kernel_size, conv_group_size, selector_rank, selector_top_k) are all
  present together; hidden size >= top_k*(top_k+1) (upstream's lattice packing);
  every tensor has the shape the config implies; unknown tensors are reported.

output:
  target_layer_ids are written +1 (dflash.target_layers names the INPUT of the
  next target layer); the selector codebooks get a `.weight` suffix. Norms and
  conv base kernels stay f32 whatever --outtype says; with q8_0 a matrix whose
  row length is not a multiple of 32 is written f16. The file is written to a
  temporary name next to OUT and renamed at the end, so a failed conversion
  leaves nothing behind.

mask_embedding.pt (optional, needs torch): as upstream, the target's token
  embedding table is copied into the drafter with the mask row replaced by the
  drafter's vector, and the target's output head is stored as output.weight.

exit codes: 0 converted, 1 I/O or unexpected error, 2 invalid input.
examples:
  pydflash2 convert ./Qwen3-8B-DFlash2 --target qwen3-8b-q4_k_m.gguf -o drafter.gguf
  python -m pydflash2.convert ./drafter-hf --target ./Qwen3-8B -o drafter-q8.gguf --outtype q8_0
"""


class _Parser(argparse.ArgumentParser):
    # a usage mistake is one line on stderr, as in every pydflash2 subcommand (the
    # converter stays free of the CLI package: it also runs as python -m pydflash2.convert)
    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(EXIT_INVALID)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="pydflash2 convert",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "drafter_dir", metavar="DRAFTER_DIR", help="Hugging Face drafter directory (config.json + safetensors)"
    )
    p.add_argument(
        "--target", "-t", required=True, metavar="TARGET",
        help="target model: a GGUF file or a Hugging Face model directory (tokenizer and shape come from it)",
    )
    p.add_argument("-o", "--output", "--outfile", required=True, metavar="OUT.gguf", help="GGUF file to write")
    p.add_argument(
        "--outtype", choices=sorted(OUTTYPES), default="f16",
        help="type of the weight matrices (default: f16); norms and conv base kernels stay f32",
    )
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def _fail(code: int, messages: Sequence[str]) -> int:
    for m in messages:
        print(f"error: {m}", file=sys.stderr)
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the converter; returns the exit code (0 ok, 1 failure, 2 invalid input)."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    out = Path(args.output)
    if out.exists() and not args.force:
        return _fail(EXIT_INVALID, [f"{out} exists (use --force to overwrite)"])
    if not out.parent.is_dir():
        return _fail(EXIT_INVALID, [f"output folder {out.parent} does not exist"])
    try:
        ckpt = open_checkpoint(args.drafter_dir)
        target = open_target(args.target)
    except (CheckpointError, TargetError) as e:
        return _fail(EXIT_INVALID, [str(e)])
    problems = validate(ckpt, target)
    mask = None
    if not problems and ckpt.mask_embedding_path is not None:
        try:
            mask = load_mask_embedding(ckpt.mask_embedding_path)
        except CheckpointError as e:
            problems.append(str(e))
        else:
            if mask[0] != ckpt.dflash("mask_token_id"):
                problems.append(f"mask_embedding.pt mask_token_id {mask[0]} does not match dflash_config's")
            if mask[1].shape != (ckpt.hidden_size,):
                problems.append(
                    f"mask_embedding.pt embedding has shape {list(mask[1].shape)}, expected [{ckpt.hidden_size}]"
                )
    if problems:
        return _fail(EXIT_INVALID, [*problems, f"{len(problems)} problem(s); nothing written"])

    for w in warnings(ckpt, target):
        print(f"warning: {w}", file=sys.stderr)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        plans = plan_tensors(ckpt, target, args.outtype, mask)
        write_gguf(tmp, ckpt, target, plans, args.outtype, progress=False if args.no_progress else None)
        os.replace(tmp, out)
    except (CheckpointError, TargetError) as e:
        tmp.unlink(missing_ok=True)
        return _fail(EXIT_INVALID, [str(e)])
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, Exception):
            return _fail(EXIT_FAILED, [f"conversion failed: {type(e).__name__}: {e}"])
        raise
    kind = "DFlash2" if ckpt.version == 2 else "DFlash"
    print(f"wrote {out} ({kind} drafter, {len(plans)} tensors, {args.outtype})", file=sys.stderr)
    return EXIT_OK
