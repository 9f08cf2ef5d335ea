"""The `pydflash2` command line, run as a real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pydflash2_testing as testing
import pytest


def _run(*args: str, cwd) -> subprocess.CompletedProcess:
    exe = shutil.which("pydflash2")
    cmd = [exe, *args] if exe else [sys.executable, "-m", "pydflash2", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=120)


def test_info_lists_backends(tmp_path) -> None:
    r = _run("info", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "backend devices:" in r.stdout
    assert "CPU" in r.stdout


def test_info_json(tmp_path) -> None:
    r = _run("info", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert any(d["type"] == "cpu" for d in info["devices"])


def test_info_on_drafter_prints_hyperparameters(tmp_path, drafter2_gguf) -> None:
    r = _run("info", str(drafter2_gguf), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "DFlash2 drafter" in r.stdout
    assert "CPU" in r.stdout
    lines = {line.split()[0]: line.split(None, 1)[1] for line in r.stdout.splitlines()[2:]}
    assert lines["selector_top_k"] == "4"
    assert lines["block_size"] == "8"
    assert lines["target_layers"] == "[1, 2, 3]"


def test_info_on_bad_file_exits_2(tmp_path, target_gguf) -> None:
    r = _run("info", str(target_gguf), cwd=tmp_path)
    assert r.returncode == 2
    assert "general.architecture is 'llama'" in r.stderr


def test_demo_files_command(tmp_path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "pydflash2_testing", str(tmp_path / "demo")],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(testing.__file__).resolve().parents[1])},  # tests/support
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "demo" / "dflash2.gguf").stat().st_size > 0
    assert (tmp_path / "demo" / "dflash1-hf" / "config.json").exists()


def test_generate_json_matches_plain_greedy(tmp_path, target_gguf, drafter2_gguf) -> None:
    import llama_cpp

    r = _run("generate", "Once upon a time", "--model", str(target_gguf), "--draft", str(drafter2_gguf),
             "--max-tokens", "16", "--raw", "--n-max", "3", "--json", "--n-ctx", "256", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"text", "tokens", "finish_reason", "stats"}
    assert out["stats"]["explanation"] is None  # a fixed n_max: no choice to explain
    assert {"tau", "n_max", "tokens_per_second", "ttft_s", "draft_s", "verify_s", "drafted_per_position",
            "accepted_per_position"} <= set(out["stats"])
    assert out["finish_reason"] == "length" and len(out["tokens"]) == 16
    phases = out["stats"]["phases"]
    assert {"n_steps", "plan_s", "propose_s", "select_s", "decode_s", "verify_s", "features_s", "inject_s",
            "python_s"} <= set(phases)
    assert sum(v for k, v in phases.items() if k.endswith("_s")) <= out["stats"]["total_s"]
    from lossless import check_greedy, plain_greedy

    from pydflash2 import exactness

    llm = llama_cpp.Llama(str(target_gguf), n_ctx=256, verbose=False)
    plain = plain_greedy(llm, llm.tokenize(b"Once upon a time", add_bos=True, special=True), 16)
    # exact on a batch-invariant build, else equal up to a near-tie (tests/lossless.py)
    check_greedy(out["tokens"], plain, exact=exactness.llama_invariance(llm).batch_invariant)
    assert out["stats"]["exact"] is exactness.llama_invariance(llm).batch_invariant


def test_generate_explains_the_plan_the_engine_ran_most(tmp_path, target_gguf, drafter2_gguf) -> None:
    """n_max auto: the explanation (the same in --json, as stats["explanation"]) names the plan the
    engine ran in most steps, checked against the engine's own histogram of drafts per step, with the
    taus the engine recorded for it."""
    from pydflash2.draft_decision import ran_most

    r = _run("generate", "Once upon a time", "--model", str(target_gguf), "--draft", str(drafter2_gguf),
             "--max-tokens", "24", "--raw", "--n-max", "auto", "--context-drafts", "off", "--json", "--n-ctx", "256",
             cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)["stats"]
    plans, hist = s["plans"], s["n_max_histogram"]
    top = ran_most(plans)
    assert top is not None
    # every verify step is one plan's, and a chain of n is the histogram's n drafts (plain: 0)
    assert sum(p["steps"] for p in plans) == sum(hist)
    for p in plans:
        n = 0 if p["plan"] == "plain" else int(p["plan"].removeprefix("chain of "))
        assert hist[n] == p["steps"], (p, hist)
        assert 1.0 <= p["tau"] <= n + 1 and 1.0 <= p["expected_tau"] <= n + 1
    assert top["steps"] == max(hist)
    words = "plain decoding" if top["plan"] == "plain" else top["plan"].replace("chain of ", "a chain of ")
    total = sum(hist)
    assert s["explanation"].startswith(f"auto: the engine ran {words}")
    assert f" in {top['steps']} of {total} steps (expected tau {top['expected_tau']:.2f}, " \
           f"measured {top['tau']:.2f})" in s["explanation"]
    # the cost model's last decision for it, every option priced: it chose the best rate (ties: the
    # first), and the explanation's priced rate is what its decisions priced the plan at
    d = s["decision"]
    assert d["what"] == "draft length" and d["slot"] == 0 and d["priced"]
    assert [o["plan"] for o in d["options"]] == ["plain"] + [f"chain of {n}" for n in range(1, len(hist))]
    rates = [o["rate"] for o in d["options"]]
    assert d["chosen"] == d["options"][rates.index(max(rates))]["plan"]
    for o in d["options"]:
        assert o["rate"] == pytest.approx(o["expected_tokens"] / o["seconds"])
    assert sum(p["priced_steps"] for p in plans) > 0
    if top["priced_steps"]:
        assert f"priced at {top['expected_rate']:.1f} tok/s" in s["explanation"]
    # the text run prints the same explanation, and the acceptance of the block's positions only
    text = _run("generate", "Once upon a time", "--model", str(target_gguf), "--draft", str(drafter2_gguf),
                "--max-tokens", "24", "--raw", "--n-max", "auto", "--n-ctx", "256", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "auto: the engine ran " in text.stderr
    line = next((x for x in text.stderr.splitlines() if x.startswith("acceptance per")), None)
    if line is not None:
        columns = line.split(": ", 1)[1].split(" (")[0].split()
        n_positions = int(line.split("1..", 1)[1].split(":")[0])
        # the block's positions (max_draft = len(hist) - 1), or as deep as a context path reached
        assert len(columns) == n_positions >= len(hist) - 1


def test_generate_with_a_tree_budget(tmp_path, target_gguf, drafter2_gguf) -> None:
    """--tree-budget: the same greedy tokens as the chain's run (both lossless: plain decoding's, flash
    attention on as the tree turns it on), and the tree's report on stderr."""
    args = ("generate", "Once upon a time", "--model", str(target_gguf), "--draft", str(drafter2_gguf),
            "--max-tokens", "16", "--raw", "--n-max", "3", "--n-ctx", "256", "--flash-attn", "on")
    chain = _run(*args, "--json", cwd=tmp_path)
    tree = _run(*args, "--json", "--tree-budget", "6", cwd=tmp_path)
    assert chain.returncode == 0 and tree.returncode == 0, (chain.stderr, tree.stderr)
    c, t = json.loads(chain.stdout), json.loads(tree.stdout)
    assert t["stats"]["tree_budget"] == 6 and c["stats"]["tree_budget"] == 0
    assert t["tokens"] == c["tokens"]
    r = _run(*args, "--tree-budget", "6", cwd=tmp_path)
    assert r.returncode == 0 and "tree budget 6" in r.stderr and "acceptance per tree depth" in r.stderr, r.stderr
    # auto: the chain or a tree each step, from the measured costs; it says what it did and weighs
    auto = _run(*args, "--json", "--tree-budget", "auto", cwd=tmp_path)
    assert auto.returncode == 0, auto.stderr
    a = json.loads(auto.stdout)
    assert a["stats"]["tree_budget"] == "auto" and a["tokens"] == c["tokens"]
    explanation = a["stats"]["explanation"]
    assert explanation.startswith("auto: the engine ran ") and " steps verified a tree" in explanation
    assert "auto tree: " in explanation


def test_generate_streams_text_and_reports_to_stderr(tmp_path, target_gguf, drafter2_gguf) -> None:
    r = _run("generate", "hi", "--model", str(target_gguf), "--draft", str(drafter2_gguf),
             "--max-tokens", "8", "--temperature", "0.8", "--seed", "3", "--n-ctx", "256", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    assert "tokens," in r.stderr and "tau" in r.stderr


def test_generate_bad_input_exits_2(tmp_path, target_gguf, drafter2_gguf) -> None:
    r = _run("generate", "hi", "--model", str(tmp_path / "missing.gguf"), "--draft", str(drafter2_gguf), cwd=tmp_path)
    assert r.returncode == 2 and "not found" in r.stderr
    r = _run("generate", "hi", "--model", str(target_gguf), "--draft", str(drafter2_gguf), "--top-p", "0",
             "--temperature", "1", "--n-ctx", "256", cwd=tmp_path)
    assert r.returncode == 2 and "argument --top-p: must be a number in (0, 1]" in r.stderr
    r = _run("generate", "hi", "--model", str(target_gguf), "--n-max", "-2", cwd=tmp_path)
    assert r.returncode == 2


def test_generate_takes_a_negative_seed(tmp_path, target_gguf, drafter2_gguf) -> None:
    """--seed -1 once ended in an OverflowError traceback: any seed in -2**63..2**64-1 is taken (mod 2**64)."""
    r = _run("generate", "hi", "--model", str(target_gguf), "--draft", str(drafter2_gguf), "--seed", "-1",
             "--temperature", "0.8", "--max-tokens", "6", "--n-ctx", "256", "--n-max", "3", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["tokens"]) >= 1


def test_generate_into_a_closed_pipe_exits_quietly(tmp_path, target_gguf, drafter2_gguf) -> None:
    """`pydflash2 generate ... | head -1`: once a BrokenPipeError traceback. The reader here is gone
    before the first byte, so every write meets a broken pipe."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    exe = shutil.which("pydflash2")
    cmd = [exe] if exe else [sys.executable, "-m", "pydflash2"]
    try:
        r = subprocess.run([*cmd, "generate", "Once upon a time", "--model", str(target_gguf), "--draft",
                            str(drafter2_gguf), "--max-tokens", "32", "--n-ctx", "256", "--n-max", "3", "--raw"],
                           stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=120)
    finally:
        os.close(write_end)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr and "Exception ignored" not in r.stderr, \
        r.stderr


def test_info_tells_whether_a_drafter_fits_a_target(tmp_path, target_gguf, drafter2_gguf) -> None:
    r = _run("info", str(drafter2_gguf), "--target", str(target_gguf), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == [f"fits {target_gguf}", "capture: tap (llama.cpp's layer-input taps)"]
    other = testing.make_target_gguf(tmp_path / "other.gguf", testing.TargetSpec(n_embd=128, n_layer=2, n_merges=100))
    r = _run("info", str(drafter2_gguf), "--target", str(other), cwd=tmp_path)
    assert r.returncode == 1, r.stderr
    misfits = [line for line in r.stdout.splitlines() if line.startswith(f"does not fit {other}: ")]
    assert any("hidden size mismatch" in line for line in misfits), r.stdout
    assert any("vocab size mismatch" in line for line in misfits), r.stdout
    assert any("target layer id 2 is out of range" in line for line in misfits), r.stdout
    j = _run("info", str(drafter2_gguf), "--target", str(other), "--json", cwd=tmp_path)
    assert j.returncode == 1
    fit = json.loads(j.stdout)["fit"]
    assert fit["fits"] is False and fit["problems"] == [line.split(": ", 1)[1] for line in misfits]
    assert fit["capture_path"] == "tap"  # a llama target (pydflash2.capture: "callback" on qwen2, gemma3...)


def test_bench_writes_json_plots_and_ratios(tmp_path, target_gguf, drafter2_gguf) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\nThe answer is\n")
    out_dir = tmp_path / "bench"
    r = _run("bench", "--model", str(target_gguf), "--draft", str(drafter2_gguf), "--prompts", str(prompts),
             "--n-max", "2,auto", "--temperature", "0,0.7", "--max-tokens", "12", "--repeats", "1", "--raw",
             "--n-ctx", "256", "--out", str(out_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    data = json.loads((out_dir / "bench.json").read_text())
    configs = {(x["n_max"], x["temperature"]) for x in data["results"]}
    assert configs == {(n, t) for n in (0, 2, "auto") for t in (0.0, 0.7)}
    for x in data["results"]:
        assert x["runs"] == 2 and x["tokens_per_second"] > 0
        if x["n_max"] == 0:
            assert x["speedup_vs_plain"] == 1.0
        phases = x["phases"]
        assert phases["n_steps"] > 0 and all(v >= 0 for v in phases.values())
        assert sum(v for k, v in phases.items() if k.endswith("_s")) <= x["total_s"]
        assert x["phase_ms_per_step"]["decode"] > 0
        # auto says what it chose and why (the numbers: tests/test_draft_decision.py)
        assert (x["n_max"] == "auto") == ("auto_decision" in x)
        if x["n_max"] == "auto":
            assert x["auto_decision"].startswith("auto: ") and "tau " in x["auto_decision"]
            assert x["auto_decision"] in r.stderr
    assert (out_dir / "throughput.png").stat().st_size > 1000
    assert (out_dir / "acceptance.png").stat().st_size > 1000
    assert "vs plain" in r.stdout


def test_random_drafter_for_a_given_target(tmp_path, target_gguf) -> None:
    r = _run("random-drafter", str(target_gguf), "-o", str(tmp_path / "d" / "dflash2.gguf"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    from pydflash2 import inspect_drafter

    hp = inspect_drafter(tmp_path / "d" / "dflash2.gguf")
    assert hp["version"] == 2 and hp["n_embd"] == 64
    assert max(hp["target_layers"]) <= 3  # capturable inputs of the 4-layer target
    # MASK is one of the target's unused special tokens, and the file runs in the loop
    import gguf

    from pydflash2.train.target import pick_mask_token

    assert hp["mask_token_id"] == pick_mask_token(gguf.GGUFReader(str(target_gguf)))
    r = _run("generate", "Once upon a time", "--model", str(target_gguf), "--draft",
             str(tmp_path / "d" / "dflash2.gguf"),
             "--max-tokens", "8", "--raw", "--n-max", "3", "--json", "--n-ctx", "256", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["tokens"]) == 8
    r = _run("random-drafter", str(tmp_path / "nope.gguf"), "-o", str(tmp_path / "x.gguf"), cwd=tmp_path)
    assert r.returncode == 2 and "not found" in r.stderr


# ------------------------------------------------------------ every subcommand: --help, and mistakes in one line


def _names() -> list[str]:
    from pydflash2.cli import SUBCOMMANDS

    return [m.NAME for m in SUBCOMMANDS]


@pytest.mark.parametrize("name", _names())
def test_help_works_on_every_subcommand(tmp_path, name: str) -> None:
    r = _run(name, "--help", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: pydflash2 {name}") and r.stderr == ""


def test_bench_runs_tree_budgets_beside_the_chain(tmp_path, target_gguf, drafter2_gguf) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time\n")
    out_dir = tmp_path / "bench"
    r = _run("bench", "--model", str(target_gguf), "--draft", str(drafter2_gguf), "--prompts", str(prompts),
             "--n-max", "3", "--tree-budget", "0,6,auto", "--max-tokens", "12", "--repeats", "1", "--raw",
             "--n-ctx", "256", "--out", str(out_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    results = json.loads((out_dir / "bench.json").read_text())["results"]
    assert {(x["n_max"], x["tree_budget"]) for x in results} == {(0, 0), (3, 0), (3, 6), (3, "auto")}
    assert "tree=6" in r.stdout and "tree=auto" in r.stdout
    auto = next(x for x in results if x["tree_budget"] == "auto")
    assert "auto tree: " in auto["auto_decision"] and 0 <= auto["tree_steps"]


def test_context_drafts_in_generate_and_bench(tmp_path, target_gguf, drafter2_gguf, capfd, monkeypatch) -> None:
    """--context-drafts: generate's JSON counts the context's drafts (default request; off: none, as with
    --exact); bench runs each configuration with them beside it, and context drafts alone at --n-max 0.
    In process, with the step costs set (a verify costs the same at any row count): the cost model's
    prefix of each context tree then depends on no timing (measured under CI's load, it once cut
    every context node, and this test failed)."""
    from pydflash2 import draft_costs
    from pydflash2.cli import main

    monkeypatch.setattr(draft_costs, "load_or_measure", lambda key, n_verify, n_draft, measure: {
        "verify_s": [0.01] * n_verify, "draft_s": [0.001] * n_draft, "plain_s": 0.01, "head_s": 0.0})
    monkeypatch.chdir(tmp_path)
    text = "Once upon a time the west wes the west the a the wes he the"
    args = ["generate", text, "--model", str(target_gguf), "--draft", str(drafter2_gguf), "--max-tokens", "24",
            "--raw", "--n-max", "3", "--json", "--n-ctx", "256"]
    outs = {}
    for mode in (None, "off", "global"):
        capfd.readouterr()
        assert main([*args, *(("--context-drafts", mode) if mode else ())]) == 0, (mode, capfd.readouterr().err)
        outs[mode] = json.loads(capfd.readouterr().out)
    stats = {mode: out["stats"] for mode, out in outs.items()}
    assert stats[None]["context_drafts"] == "request" and stats[None]["context_drafted"] > 0
    assert stats["off"]["context_drafted"] == 0 and stats["global"]["context_drafts"] == "global"
    assert len({tuple(out["tokens"]) for out in outs.values()}) == 1  # lossless: one text
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(text + "\n")
    out_dir = tmp_path / "bench"
    status = main(["bench", "--model", str(target_gguf), "--draft", str(drafter2_gguf), "--prompts", str(prompts),
                   "--n-max", "3", "--context-drafts", "request", "--max-tokens", "12", "--repeats", "1", "--raw",
                   "--n-ctx", "256", "--out", str(out_dir)])
    captured = capfd.readouterr()
    assert status == 0, captured.err
    results = json.loads((out_dir / "bench.json").read_text())["results"]
    assert {(x["n_max"], x["context_drafts"]) for x in results} == {(0, "off"), (0, "request"), (3, "off"),
                                                                     (3, "request")}
    assert "ctx=request" in captured.out
    assert next(x for x in results if x["n_max"] == 0 and x["context_drafts"] == "request")["context_drafted"] > 0


def _mistakes(tmp: Path, target: Path, drafter: Path) -> list[tuple[tuple[str, ...], str]]:
    missing = str(tmp / "missing.gguf")
    junk = tmp / "junk.gguf"
    junk.write_text("not a model")
    t, d = str(target), str(drafter)
    return [
        (("no-such-command",), "invalid choice"),
        (("generate", "hi", "--bogus"), "unrecognized arguments: --bogus"),
        (("generate", "hi", "--n-max", "many"), "--n-max"),
        (("generate", "hi", "--tree-budget", "-1"), "--tree-budget"),
        (("generate", "hi", "--tree-budget", "256"), "--tree-budget"),
        (("bench", "--tree-budget", "4,x"), "--tree-budget"),
        (("generate", "hi", "--context-drafts", "always"), "--context-drafts"),
        (("bench", "--context-drafts", "off,x"), "--context-drafts"),
        (("serve", "--context-drafts", "yes"), "--context-drafts"),
        (("generate", "hi", "--model", missing), "not found"),
        (("generate", "hi", "--model", t, "--draft", t, "--n-ctx", "256"), "general.architecture"),
        (("bench", "--n-max", "2,many"), "--n-max"),
        (("bench", "--prompts", str(tmp / "missing.txt"), "--model", t), "--prompts"),
        (("bench", "--model", t, "--draft", t, "--n-ctx", "256", "--out", str(tmp / "b")), "general.architecture"),
        (("bench", "--model", str(junk), "--out", str(tmp / "b")), "junk.gguf"),
        (("generate", "hi", "--model", str(junk)), "junk.gguf"),
        (("info", missing), "missing.gguf"),
        (("info", d, "--target", missing), "--target: "),
        (("info", d, "--target", d), "is a DFlash drafter, not a target model"),
        (("info", t), "general.architecture"),
        (("convert", str(tmp), "--target", t, "-o", str(tmp / "out.gguf"), "--bogus"),
         "unrecognized arguments: --bogus"),
        (("convert", str(tmp / "no-such-dir"), "--target", t, "-o", str(tmp / "out.gguf")), "no-such-dir"),
        (("random-drafter", missing, "-o", str(tmp / "r.gguf")), "not found"),
        (("modelfile", "--n-max", "0", "--draft", d), "--n-max"),
        (("modelfile", "--num-ctx", "lots", "--draft", d), "--num-ctx"),
        (("modelfile", "--model", missing, "--draft", d), "does not exist"),
        (("modelfile", "--model", t, "--draft", t), "not a usable drafter"),
        (("serve", "--model", t, "--keep-alive-timeout", "0"), "--keep-alive-timeout must be > 0"),
        (("serve", "--model", t, "--body-timeout", "0"), "--body-timeout must be > 0"),
        (("serve", "--model", t, "--queue-timeout", "-1"), "--queue-timeout must be a finite number >= 0"),
        (("serve", "--model", t, "--timeout", "nan"), "--timeout must be a finite number >= 0"),
        (("serve", "--model", t, "--keep-alive-timeout", "inf"), "--keep-alive-timeout must be a finite number"),
    ]


def test_user_mistakes_are_one_line_and_exit_2(tmp_path, target_gguf, drafter2_gguf) -> None:
    for args, expected in _mistakes(tmp_path, target_gguf, drafter2_gguf):
        r = _run(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, (args, r.stderr)
        assert expected in r.stderr, (args, r.stderr)
        assert not (tmp_path / "out.gguf").exists() and not (tmp_path / "r.gguf").exists()


@pytest.mark.parametrize("args, expected", [
    (("generate", "hi", "--seed", str(2**64)), "argument --seed: must be an integer in -2**63..2**64-1"),
    (("generate", "hi", "--seed", str(-(2**63) - 1)), "argument --seed: must be an integer in -2**63..2**64-1"),
    (("generate", "hi", "--max-tokens", str(2**31)), "argument --max-tokens: must be an integer in 1..2147483647"),
    (("generate", "hi", "--max-tokens", "0"), "argument --max-tokens: must be an integer in 1..2147483647"),
    (("generate", "hi", "--top-k", str(2**31)), "argument --top-k: must be an integer in 0..2147483647"),
    (("generate", "hi", "--temperature", "nan"), "argument --temperature: must be a finite number >= 0"),
    (("serve", "--top-k", "-1"), "argument --top-k: must be an integer in 0..2147483647"),
    (("serve", "--temp", "inf"), "argument --temp/--temperature: must be a finite number >= 0"),
    (("bench", "--max-tokens", str(2**31)), "argument --max-tokens: must be an integer in 1..2147483647"),
    (("bench", "--temperature", "0,-1"), "--temperature: must be a finite number >= 0"),
])
def test_out_of_range_sampling_options_exit_2(capsys, args, expected) -> None:
    """Once an OverflowError traceback from the native struct: the range check the Python API and the
    server use (pydflash2.sampling.check_param), as argparse types; one line naming the option, exit 2.
    In process: the command line's own main(), before any model loads."""
    from pydflash2.cli import main

    try:
        status = main(list(args))
    except SystemExit as e:  # argparse's error()
        status = e.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert len(err.splitlines()) == 1 and expected in err, err


def test_modelfile_command(tmp_path, target_gguf, drafter2_gguf) -> None:
    from ollama_modelfile import create_request, parse

    r = _run("modelfile", "--model", str(target_gguf), "--draft", str(drafter2_gguf), "--n-max", "5", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    req = create_request(parse(r.stdout), tmp_path)
    assert req["draft_files"] == [str(drafter2_gguf)] and req["parameters"]["draft_num_predict"] == 5

    bundle = tmp_path / "bundle"
    args = ("modelfile", "--model", str(target_gguf), "--draft", str(drafter2_gguf), "--bundle", str(bundle),
            "--n-max", "99")
    r = _run(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "clamped to the drafter's block_size - 1 = 7" in r.stderr
    req = create_request(parse((bundle / "Modelfile").read_text()), bundle)
    assert req["files"] == [str(bundle / target_gguf.name)] and req["parameters"]["draft_num_predict"] == 7
    r = _run(*args, cwd=tmp_path)  # the Modelfile is not overwritten without --force
    assert r.returncode == 2 and "exists" in r.stderr and len(r.stderr.splitlines()) == 1
    assert _run(*args, "--force", cwd=tmp_path).returncode == 0

    wide = testing.make_target_gguf(tmp_path / "wide.gguf", testing.TargetSpec(n_embd=128))
    r = _run("modelfile", "--model", str(wide), "--draft", str(drafter2_gguf), "-o", str(tmp_path / "M"),
             cwd=tmp_path)
    assert r.returncode == 2 and "hidden size mismatch" in r.stderr and len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "M").exists()




# (options, the words the refusal must hold): each refused alike by generate and serve (one validation,
# cli.common.check_run_args; the sampling options' ranges are their argparse types, tested above)
BAD_RUN_OPTIONS = [
    (["--n-ctx", "1"], "--n-ctx must be >= 32"),
    (["--threads", "100000"], "--threads must be in 1.."),
    (["--threads", "0"], "--threads must be in 1.."),
    (["--n-gpu-layers", "-5"], "--n-gpu-layers must be >= 0"),
]


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_generate_and_serve_refuse_the_same_options(command: str, target_gguf, capsys) -> None:
    from pydflash2.cli import main

    lead = ["generate", "hi"] if command == "generate" else ["serve"]
    for options, words in BAD_RUN_OPTIONS:
        assert main([*lead, "--model", str(target_gguf), "--draft", "none", *options]) == 2, options
        err = capsys.readouterr().err
        assert words in err, (options, err)


def test_kv_caches_past_the_memory_are_refused_before_allocating(target_gguf, capsys) -> None:
    """serve --parallel 1000000 was ended by the OOM killer after 112 s: now a refusal with the estimate."""
    from pydflash2.cli import main
    from pydflash2.kv_memory import kv_bytes_per_cell

    assert main(["serve", "--model", str(target_gguf), "--draft", "none", "--parallel", "1000000"]) == 2
    err = capsys.readouterr().err
    need_gib = kv_bytes_per_cell(target_gguf) * 1000000 * 4096 / (1 << 30)
    assert f"--parallel 1000000 x --n-ctx 4096: the KV caches need about {need_gib:.1f} GiB" in err
    assert "GiB of memory available" in err


def test_grammar_limit_options_are_bounded(target_gguf, capsys) -> None:
    from pydflash2.cli import main

    for options, words in ((["--max-grammar-depth", "5000"], "--max-grammar-depth must be an integer in 1..2000"),
                           (["--max-schema-repeat", "0"], "--max-schema-repeat must be an integer in 1..1000"),
                           (["--max-schema-enum", "-3"], "--max-schema-enum must be an integer >= 1")):
        assert main(["serve", "--model", str(target_gguf), "--draft", "none", *options]) == 2
        assert words in capsys.readouterr().err
