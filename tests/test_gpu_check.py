"""benchmarks/gpu_check.py on the tiny fixture pair (its table, verify curve, step ledger and greedy
divergences), and benchmarks/gpu_check.sh's device calls against what its prepare makes. The whole
sequence (prepare, call1, call2 on this CPU) is `bash benchmarks/gpu_check.sh dry-run`: too slow for
the fast tier (it trims the llama-cpp-python sdist and splits SmolLM2's GGUF)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
CONFIGS = ["plain", "chain 7", "lattice tree 16", "context alone", "merged tree 16", "auto"]
FULL_HEAD = ["plain, full head", "auto, full head"]  # (g): a context without the lazy head


def _gpu_check():  # noqa: ANN202  (the benchmark module, imported from its path)
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory, target_gguf: Path, drafter2_gguf: Path) -> dict:
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check.json"
    rc = _gpu_check().main(["--model", str(target_gguf), "--draft", str(drafter2_gguf), "--max-tokens", "8",
                            "--n-prompts", "1", "--threads", "1", "--cost-reps", "1", "--json", str(out)])
    assert rc == 0
    return json.loads(out.read_text())


def test_gpu_check_report(report: dict) -> None:
    s = report["settings"]
    assert s["max_tokens"] == 8 and s["drafter_device"] and s["n_gpu_layers"] in (0, 99)
    # (a) every configuration at T=0 on both sets; plain and auto at T=1
    assert set(report["tables"]) == {"agentic T=0", "chat T=0", "agentic T=1", "chat T=1"}
    for key, table in report["tables"].items():
        assert list(table) == (CONFIGS + FULL_HEAD if key.endswith("T=0") else ["plain", "auto"]), key
        assert table["plain"]["tau"] == 1.0 and table["plain"]["x_plain"] == 1.0
        for name, row in table.items():
            assert 1.0 <= row["tau"] <= 8.0 and row["rate"] > 0, (key, name, row)
            assert row["x_plain"] == pytest.approx(row["rate"] / table["plain"]["rate"])
        assert table["plain"]["lattice_drafted"] == table["plain"]["context_drafted"] == 0
    assert report["tables"]["chat T=0"]["chain 7"]["lattice_drafted"] > 0
    # (b) the verify curve: 1 + 16 tree nodes of rows, plain step, drafter block
    costs = report["costs"]
    assert len(costs["verify_s"]) >= 17 and all(x > 0 for x in costs["verify_s"])
    # plain_s: 0 where the drafter's features cost a plain step nothing (taps)
    assert costs["plain_s"] >= 0 and len(costs["draft_s"]) >= 7 and all(x > 0 for x in costs["draft_s"])
    # (g) the full head's curve: its own context, every row's logits in the graph (no head rows read lazily)
    full = report["costs_full_head"]
    assert len(full["verify_s"]) == len(costs["verify_s"]) and all(x > 0 for x in full["verify_s"])
    assert full["head_s"] == 0 < costs["head_s"]
    assert report["tables"]["agentic T=0"]["auto, full head"]["context_drafted"] > 0
    # (c) the step ledger: its parts add up to the step timed from outside
    for key, ledgers in report["ledgers"].items():
        assert list(ledgers) == list(report["tables"][key])
        for name, led in ledgers.items():
            assert led["step"] > 0 and led["ledger_vs_wall"] == pytest.approx(1.0, abs=0.1), (key, name)
            assert led["tau"] == pytest.approx(report["tables"][key][name]["tau"])
    # (d) divergences: never plain against itself; each names its token and a gap >= 0
    for d in report["divergences"]:
        assert d["config"] != "plain" and 0 <= d["index"] <= 8
        assert d["gap"] is None or d["gap"] >= 0
    assert report["upstream"] is None  # (e) no upstream binary here: skipped
    # (h) the one-row tax on both capture paths, CUDA graphs as this process has them (no CUDA: "on")
    assert set(report["tax"]) == {"tap", "callback"}
    for capture, tax in report["tax"].items():
        assert tax["plain_s"] > 0 and len(tax["verify_s"]) == 8, capture
        assert tax["one_row_tax"] == pytest.approx(tax["verify_s"][0] / tax["plain_s"])


def test_divergence_gap_on_the_real_target(target_gguf: Path) -> None:
    """first_difference and the top-2 gap, on plain greedy tokens of the fixture target: a list that
    leaves them at token 3 diverges there, where the plain token is the target's top choice."""
    from pydflash2.speculator import Speculator, load_target

    gc = _gpu_check()
    assert gc.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert gc.first_difference([1, 2, 3], [1, 5, 3]) == 1 and gc.first_difference([1, 2], [1, 2, 3]) == 2
    llm, _ = load_target(target_gguf, n_ctx=512, n_threads=1)
    with Speculator(llm, None, n_max=0) as plain:
        ids = plain.tokenize_prompt("Hello there, how are you?")
        a = plain.generate(ids, max_tokens=8).tokens
    other = [*a[:3], (a[3] + 1) % llm.n_vocab(), *a[4:]]
    rows = gc.divergences(llm, [ids], {"plain": [a], "x": [other]})
    assert [(r["config"], r["index"], r["token"]) for r in rows] == [("x", 3, other[3])]
    assert rows[0]["gap"] >= 0 and rows[0]["plain_is_top1"] or rows[0]["gap"] < 1e-3
    llm.close()


def test_gpu_check_sh_parses_and_helps() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    r = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "call1" in r.stdout and "dry-run" in r.stdout and "carry" in r.stdout
    assert subprocess.run(["bash", str(SCRIPT), "nonsense"], capture_output=True).returncode == 2
    assert "/.dev/" in (ROOT / ".gitignore").read_text().splitlines()


def _function(text: str, name: str) -> str:
    m = re.search(rf"^{name}\(\) \{{\n(.*?)^\}}", text, re.S | re.M)
    assert m, name
    return m.group(1)


def test_device_calls_read_only_what_prepare_makes() -> None:
    text = SCRIPT.read_text()
    made = set(re.search(r'^C1_MADE="([^"]*)"', text, re.M).group(1).split())  # type: ignore[union-attr]
    prepare, call1, call2 = (_function(text, f) for f in ("prepare", "call1", "call2"))
    # prepare checks each of C1_MADE exists before it reports success, and writes each
    assert "for name in $C1_MADE" in prepare
    for name in made:
        assert f'"$DEV/c1/{name}' in prepare or f"$DEV/c1/{name}" in prepare or name == "model.part1", name
    read1 = set(re.findall(r"\$C1/([A-Za-z0-9_.-]+)", call1))
    # proj.tgz is optional (GPU_CHECK_ARCHIVE=1), read only where present
    assert read1 - {"proj.tgz"} <= made and read1 >= made - {"whl"} | {"manifest.txt"}, read1
    assert '[ -f "$C1/proj.tgz" ]' in call1 and "proj.tgz" in prepare
    # call2 reads only model.part$K of .dev/cK and what call1 left in $W
    assert set(re.findall(r"\$CK/([A-Za-z0-9_.$-]+)", call2)) == {"model.part$K"}
    assert 'd/model.part$k"' in prepare
    for path in re.findall(r"\$W/([A-Za-z0-9_.]+)", call2):
        assert path.startswith("model.part") or f"$W/{path}" in call1 or path in ("smollm2.gguf", "proj"), path
