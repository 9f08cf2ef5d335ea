"""`pydflash2 train` on the tiny real target: the dataset, the model's math, the
loss going down, the exports, resume, and the trained file running losslessly in
our engine and in upstream llama.cpp."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="pydflash2[train] (torch) is not installed")

import gguf  # noqa: E402
import llama_cpp  # noqa: E402
import pydflash2_testing as testing  # noqa: E402
from pydflash2.convert.checkpoint import open_checkpoint  # noqa: E402
from pydflash2_testing.upstream import UpstreamDrafter  # noqa: E402

from pydflash2 import inspect_drafter  # noqa: E402
from pydflash2.cli import main as cli_main  # noqa: E402
from pydflash2.speculator import Speculator  # noqa: E402
from pydflash2.train.dataset import Dataset, DatasetError, DatasetWriter  # noqa: E402
from pydflash2.train.distill import Distiller  # noqa: E402
from pydflash2.train.export import export_hf  # noqa: E402
from pydflash2.train.model import DrafterConfig  # noqa: E402
from pydflash2.train.objective import Batch, compute_losses, expected_tau, sample_batch  # noqa: E402
from pydflash2.train.prompts import DEV_FILE, TRAIN_FILE, read_prompts  # noqa: E402
from pydflash2.train.target import read_target, tap_layers  # noqa: E402
from pydflash2.train.trainer import build_model  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from drafter_ref import RefDrafter  # noqa: E402

HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))
TAPS = [0, 1, 2]


@pytest.fixture(scope="module")
def hot_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # a target whose greedy text is predictable enough for a few training steps to show
    d = tmp_path_factory.mktemp("train-target")
    return testing.make_target_gguf(d / "target.gguf", testing.TargetSpec(hot_tokens=HOT))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, hot_target: Path) -> Path:
    """One small end-to-end `pydflash2 train` run (reduced draft vocabulary: d2t on)."""
    out = tmp_path_factory.mktemp("train-run") / "run"
    rc = cli_main(["train", "--target", str(hot_target), "--out", str(out), "--max-prompts", "16", "--max-new", "32",
                   "--n-seq", "4", "--taps", "3", "--layers", "1", "--block-size", "6", "--draft-vocab", "300",
                   "--max-steps", "60", "--max-minutes", "60", "--batch", "4", "--anchors", "8", "--lr", "3e-3",
                   "--top-k", "4", "--rank", "8", "--outtype", "f16", "--eval-prompts", "4", "--eval-max-tokens", "24"])
    assert rc == 0
    return out


def test_prompt_sets_are_big_and_disjoint() -> None:
    train, dev = read_prompts(TRAIN_FILE), read_prompts(DEV_FILE)
    assert len(train) >= 2000 and len(set(train)) == len(train)
    assert len(dev) >= 32 and not set(train) & set(dev)


def test_tap_layers_stay_tappable() -> None:
    assert tap_layers(30, 5) == [1, 8, 14, 20, 27]
    for n_layer in range(2, 40):
        for n in range(1, 6):
            ids = tap_layers(n_layer, n)
            assert ids and all(0 <= i <= n_layer - 2 for i in ids), (n_layer, n, ids)


def test_mask_is_an_unused_special_token(hot_target: Path) -> None:
    info = read_target(hot_target)
    assert info.mask_token_id == testing.MASK_ID and info.mask_token == "<|mask|>"


def test_dataset_round_trip_and_torn_tail(tmp_path: Path) -> None:
    meta = {"target_sha": "abc", "target_layer_ids": [0, 2], "n_taps": 2, "n_embd": 4, "n_vocab": 50}
    rng = np.random.default_rng(0)
    seqs = [(i, rng.integers(0, 50, 5 + i), rng.standard_normal((5 + i, 8)).astype(np.float32), 2) for i in range(3)]
    with DatasetWriter(tmp_path, meta) as w:
        for p, t, f, pl in seqs:
            w.add(p, t, f, pl)
    # an interrupted write: data past the last index line, half an index line
    with open(tmp_path / "features.bin", "ab") as f:
        f.write(b"\x01" * 40)
    with open(tmp_path / "index.jsonl", "a") as f:
        f.write('{"prompt": 9, "sta')
    data = Dataset(tmp_path)
    assert len(data) == 3 and data.width == 8
    for i, (p, t, f, pl) in enumerate(seqs):
        tokens, feats, plen = data.sequence(i)
        np.testing.assert_array_equal(tokens, t)
        np.testing.assert_array_equal(feats, f.astype(np.float16))
        assert plen == pl and data.sequences[i].prompt == p
    with DatasetWriter(tmp_path, meta) as w:  # resumes: the torn tail is cut
        assert w.done_prompts == {0, 1, 2}
        w.add(3, np.arange(4), np.ones((4, 8)), 1)
    data = Dataset(tmp_path)
    assert len(data) == 4 and (tmp_path / "features.bin").stat().st_size == data.n_rows * 8 * 2
    np.testing.assert_array_equal(data.sequence(3)[0], np.arange(4))
    with pytest.raises(DatasetError, match="another target"):
        DatasetWriter(tmp_path, {**meta, "target_layer_ids": [1]})


def test_distilled_rows_match_a_lone_sequence(hot_target: Path) -> None:
    """Several sequences per decode give each sequence what a decode of it alone gives."""
    prompts = read_prompts(TRAIN_FILE)[:3]

    def run(n_seq: int, d: Path) -> Dataset:
        info = read_target(hot_target)
        meta = {"target_sha": "t", "target_layer_ids": TAPS, "n_taps": 3, "n_embd": 64, "n_vocab": info.n_vocab}
        with DatasetWriter(d, meta) as w, Distiller(hot_target, TAPS, n_seq=n_seq, max_len=256) as dist:
            dist.run(prompts, w, max_new=20, progress=False)
        return Dataset(d)

    import tempfile

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        batched, alone = run(3, Path(a)), run(1, Path(b))
        by_prompt = {s.prompt: i for i, s in enumerate(alone.sequences)}
        assert len(batched) == len(alone) == 3
        llm = llama_cpp.Llama(str(hot_target), n_ctx=256, verbose=False)
        for i, s in enumerate(batched.sequences):
            tb, fb, pl = batched.sequence(i)
            ta, fa, _ = alone.sequence(by_prompt[s.prompt])
            np.testing.assert_array_equal(tb, ta)
            np.testing.assert_allclose(fb, fa, rtol=2e-2, atol=2e-2)
            assert not fb[-1].any() and np.abs(fb[:-1]).sum(1).min() > 0  # last row: never run
            # the continuation is the target's own greedy text
            cont = []
            for tok in llm.generate([int(t) for t in tb[:pl]], temp=0.0, top_k=0, top_p=1.0, min_p=0.0, reset=True):
                cont.append(tok)
                if len(cont) == len(tb) - pl:
                    break
            assert cont == [int(t) for t in tb[pl:]]


def _tiny_config(info, **kw) -> DrafterConfig:  # noqa: ANN001
    base = dict(n_embd=64, n_vocab=info.n_vocab, target_layer_ids=TAPS, mask_token_id=info.mask_token_id,
                n_layer=2, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, block_size=6, rope_theta=10000.0,
                rms_eps=info.rms_eps, conv_group_size=16, selector_rank=8, selector_top_k=4)
    base.update(kw)
    return DrafterConfig(**base)


@pytest.mark.parametrize("version", [2, 1])
def test_model_is_the_documented_drafter(tmp_path: Path, hot_target: Path, version: int) -> None:
    """The PyTorch drafter, exported, computes what the float64 reference of the doc's
    math computes from the GGUF (so the graph we train is the graph that runs)."""
    info = read_target(hot_target)
    torch.manual_seed(0)
    model = build_model(_tiny_config(info, version=version), hot_target)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # off the identity/zero init, so every weight matters
    hf = export_hf(model, tmp_path / "hf", draft_ids=[])
    ref = RefDrafter(testing.checkpoint_to_gguf(hf, hot_target, tmp_path / "d.gguf"), hot_target)
    feats = np.random.default_rng(1).standard_normal((12, 3 * 64)).astype(np.float32)
    p = 9
    ref.inject(feats[:p].astype(np.float64), np.arange(p))
    h_ref, lg_ref = ref.forward(40, p, 6)
    with torch.no_grad():
        h, lg = model(torch.from_numpy(feats)[None], torch.ones(1, 12, dtype=torch.bool), torch.tensor([[p]]),
                      torch.tensor([[40]]), 6)
    np.testing.assert_allclose(h[0, 0].numpy(), h_ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(lg[0, 0].numpy(), lg_ref, rtol=1e-4, atol=2e-3)
    if version == 2:
        _, score = ref.selector(40, h_ref, lg_ref)
        pred, cand = torch.tensor([40]), torch.tensor([[41, 42, 43]])
        ours = model.candidate_selector.scores(lg[0, 0, 1][cand], cand, h[0, 0, 1], pred)
        want = [score(0, 40, c) for c in (41, 42, 43)]
        np.testing.assert_allclose(ours.detach().numpy()[0], want, rtol=1e-4, atol=2e-3)


def test_path_accuracy_scores_the_greedy_selectors_pick(tmp_path: Path, hot_target: Path) -> None:
    """path_acc (what the τ estimate uses) scores the candidate the engine's greedy selector
    picks, unary plus pairwise score given the true predecessor, found here with the
    float64 reference of the doc's math; acc scores the unary top-1."""
    info = read_target(hot_target)
    torch.manual_seed(0)
    model = build_model(_tiny_config(info), hot_target)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        model.candidate_selector.predecessor_codebook.mul_(100)  # a pairwise term strong enough
        model.candidate_selector.successor_codebook.mul_(100)  # to overrule the unary top-1
    hf = export_hf(model, tmp_path / "hf", draft_ids=[])
    ref = RefDrafter(testing.checkpoint_to_gguf(hf, hot_target, tmp_path / "d.gguf"), hot_target)
    feats = np.random.default_rng(1).standard_normal((12, 3 * 64)).astype(np.float32)
    p, anchor = 9, 40
    ref.inject(feats[:p].astype(np.float64), np.arange(p))
    h_ref, lg_ref = ref.forward(anchor, p, 6)
    cands, score = ref.selector(anchor, h_ref, lg_ref)
    selector_pick = max(cands[0], key=lambda c: score(0, anchor, c))
    unary_top = int(np.argmax(lg_ref[1]))
    assert selector_pick != unary_top  # else this test could not tell the two apart

    def accuracies(label: int) -> tuple[float, float]:
        labels = torch.full((1, 1, 6), -100, dtype=torch.long)
        labels[0, 0, 1] = label  # position 1 only: its predecessor is the anchor
        batch = Batch(torch.from_numpy(feats)[None], torch.ones(1, 12, dtype=torch.bool), torch.tensor([[p]]),
                      torch.tensor([[anchor]]), labels, torch.ones(1, 1, dtype=torch.bool))
        loss = compute_losses(model, batch)
        return loss.acc[0], loss.path_acc[0]

    assert accuracies(selector_pick) == (0.0, 1.0)
    assert accuracies(unary_top) == (1.0, 0.0)


def test_training_reduces_the_loss(run_dir: Path) -> None:
    log = [json.loads(line) for line in (run_dir / "train_log.jsonl").read_text().splitlines()]
    steps = [e for e in log if "loss" in e]
    assert steps[0]["step"] == 1 and steps[-1]["step"] >= 40
    assert steps[-1]["loss"] < 0.8 * steps[0]["loss"], steps
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 60 and summary["draft_vocab"] == 300
    assert summary["val_tau_est"] == pytest.approx(expected_tau(summary["val_path_acc"]))


def test_hf_export_reloads(run_dir: Path, hot_target: Path) -> None:
    ckpt = open_checkpoint(run_dir / "hf")
    cfg = ckpt.config
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    dc = cfg["dflash_config"]
    assert dc["target_layer_ids"] == TAPS and dc["mask_token_id"] == testing.MASK_ID and dc["block_size"] == 6
    assert (dc["selector_top_k"], dc["selector_rank"], dc["conv_kernel_size"]) == (4, 8, 2)
    assert cfg["draft_vocab_size"] == 300
    st = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
    model = build_model(DrafterConfig(**st["config"]), hot_target)
    model.load_state_dict(st["model"])
    want = {k: v.numpy() for k, v in model.state_dict().items()}
    got = {k: ckpt.read(k) for k in ckpt.tensors}
    assert set(got) == set(want) | {"lm_head.weight", "d2t"}
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v, err_msg=k)
    ids = np.asarray(st["config"]["draft_ids"])
    np.testing.assert_array_equal(got["d2t"] + np.arange(len(ids)), ids)
    np.testing.assert_array_equal(got["lm_head.weight"], model.head_rows.numpy())


def test_gguf_validates_and_runs_in_upstream(run_dir: Path, hot_target: Path) -> None:
    info = inspect_drafter(run_dir / "drafter.gguf")
    assert info["version"] == 2 and info["has_d2t"] and info["n_vocab_draft"] == 300
    with UpstreamDrafter(hot_target, run_dir / "drafter.gguf", n_ctx=256) as up:
        assert up.is_dflash2 and up.target_layers == [i + 1 for i in TAPS]
        assert up.mask_token_id == testing.MASK_ID
        prompt = [1, 40, 41, 42, 43, 44]
        feats, logits = up.target_decode(prompt, 0)
        up.inject(feats, range(len(prompt)))
        lat = up.draft(int(np.argmax(logits[-1])), len(prompt))
        assert lat.candidates.shape == (5, 4) and np.isfinite(lat.scores).all()


def test_trained_drafter_is_lossless_and_accepted(run_dir: Path, hot_target: Path) -> None:
    llm = llama_cpp.Llama(str(hot_target), n_ctx=512, verbose=False)
    prompts = read_prompts(DEV_FILE)[:6]
    with Speculator(llm, None, n_max=0) as plain:
        refs = {p: plain.generate(p, max_tokens=32).tokens for p in prompts}
    accepted = 0
    with Speculator(llm, run_dir / "drafter.gguf", n_max=5) as spec:
        for p in prompts:
            out = spec.generate(p, max_tokens=32)
            assert out.tokens == refs[p], p
            accepted += sum(out.stats["accepted_per_position"])
    assert accepted > 0


def test_engine_evaluation_in_the_summary(run_dir: Path, hot_target: Path, capsys) -> None:
    """After the export, `pydflash2 train` measured the drafter in the engine on the first
    4 held-out prompts, greedy, drafting its whole block: the summary holds what an
    independent Speculator run of the same prompts counts."""
    ev = json.loads((run_dir / "summary.json").read_text())["eval"]
    assert (ev["prompts"], ev["max_tokens"], ev["device"], ev["n_max"]) == (4, 24, "CPU", 5)
    drafted, accepted, forwards, generated = np.zeros(5, int), np.zeros(5, int), 0, 0
    with Speculator(str(hot_target), run_dir / "drafter.gguf", n_ctx=2048, n_max=5, device="CPU") as spec:
        for p in read_prompts(DEV_FILE)[:4]:
            st = spec.generate(p, max_tokens=24, temperature=0.0).stats
            drafted += st["drafted_per_position"]
            accepted += st["accepted_per_position"]
            forwards += st["n_steps"]
            generated += st["n_generated"] - 1
    assert ev["drafted_per_position"] == drafted.tolist() and ev["accepted_per_position"] == accepted.tolist()
    assert ev["target_forwards"] == forwards and ev["tau"] == pytest.approx(generated / forwards)
    assert ev["tau"] == pytest.approx(1 + accepted.sum() / forwards)  # each forward commits accepted + 1
    assert ev["acceptance_per_position"][0] == pytest.approx(accepted[0] / drafted[0])


def test_eval_options_are_checked_before_anything_runs(hot_target: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    base = ["train", "--target", str(hot_target), "--out", str(out)]
    for extra, needle in [(["--eval-prompts", "-1"], "--eval-prompts must be >= 0"),
                          (["--eval-max-tokens", "0"], "--eval-max-tokens must be >= 1"),
                          (["--eval-file", str(tmp_path / "nope.txt")], "--eval-file"),
                          (["--device", "CUDA7"], "unknown device 'CUDA7'")]:
        assert cli_main([*base, *extra]) == 2
        assert needle in capsys.readouterr().err
    assert not out.exists()


def test_train_on_a_target_without_layer_taps(tmp_path: Path) -> None:
    """gemma3 has no layer-input taps in the pinned llama.cpp: distillation captures its
    features through the graph evaluation callback. The dataset rows equal a fresh
    capture of each sequence, and the trained drafter runs losslessly in the engine."""
    from lossless import check_greedy
    from lossless import plain_greedy as plain_run

    from pydflash2 import capture, exactness

    target = testing.make_target_gguf(tmp_path / "gemma3.gguf", testing.TargetSpec(arch="gemma3", hot_tokens=HOT))
    assert capture.capture_path(read_target(target).arch) == "callback"
    out = tmp_path / "run"
    assert cli_main(["train", "--target", str(target), "--out", str(out), "--max-prompts", "6", "--max-new", "16",
                     "--n-seq", "3", "--taps", "3", "--block-size", "6", "--draft-vocab", "300", "--max-steps", "10",
                     "--batch", "4", "--anchors", "8", "--top-k", "4", "--rank", "8", "--outtype", "f16",
                     "--eval-prompts", "2", "--eval-max-tokens", "16", "--device", "CPU"]) == 0
    data = Dataset(out / "data")
    assert len(data) == 6
    layers = [i + 1 for i in data.meta["target_layer_ids"]]
    llm = llama_cpp.Llama(str(target), n_ctx=512, n_batch=512, verbose=False)
    cc = capture.capturing_context(llm)
    try:
        for i in range(len(data)):
            tokens, feats, _ = data.sequence(i)
            ref = cc.features([int(t) for t in tokens[:-1]], layers)
            cc.context.kv_cache_clear()
            # f16 storage; several sequences per decode round a little unlike one alone
            np.testing.assert_allclose(feats[:-1], ref, rtol=2e-2, atol=2e-2)
            assert not feats[-1].any()  # the last token never ran through the target
    finally:
        cc.close()
    assert json.loads((out / "summary.json").read_text())["eval"]["device"] == "CPU"
    exact = exactness.llama_invariance(llm).batch_invariant
    with Speculator(llm, out / "drafter.gguf", n_max=5) as spec:
        assert spec.capture_path == "callback"
        for p in read_prompts(DEV_FILE)[:4]:
            toks = spec.tokenize_prompt(p)
            check_greedy(spec.generate(toks, max_tokens=24).tokens, plain_run(llm, toks, 24), exact=exact, what=p)


def test_resume_continues_from_the_checkpoint(run_dir: Path, hot_target: Path, capsys) -> None:
    before = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
    args = ["train", "--target", str(hot_target), "--out", str(run_dir), "--taps", "3", "--layers", "1",
            "--block-size", "6", "--draft-vocab", "300", "--max-minutes", "60", "--batch", "4", "--anchors", "8",
            "--top-k", "4", "--rank", "8", "--outtype", "f16", "--eval-prompts", "0"]
    assert cli_main([*args, "--max-steps", "70"]) == 2  # not empty, no --resume: refused, nothing touched
    assert "--resume" in capsys.readouterr().err
    assert cli_main([*args, "--max-steps", "70", "--resume"]) == 0
    after = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert before["step"] == 60 and after["step"] == 70
    assert after["elapsed"] > before["elapsed"]
    assert after["config"]["draft_ids"] == before["config"]["draft_ids"]
    assert [e["step"] for e in after["log"] if "loss" in e][:3] == [e["step"] for e in before["log"] if "loss" in e][:3]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 70 and "eval" not in summary  # --eval-prompts 0: no engine evaluation


def test_init_drafter_continues_the_files_drafter(run_dir: Path, hot_target: Path, tmp_path: Path, capsys) -> None:
    from pydflash2.train.warm_start import drafter_config, load_weights

    st = torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
    info = read_target(hot_target)
    cfg = drafter_config(run_dir / "drafter.gguf", n_embd=info.n_embd, n_vocab=info.n_vocab)
    assert cfg.to_dict() == DrafterConfig(**st["config"]).to_dict()  # shape, taps, selector, vocabulary
    model = build_model(cfg, hot_target)
    load_weights(model, run_dir / "drafter.gguf")
    for k, v in model.state_dict().items():  # the f16 file: the checkpoint within f16 rounding
        np.testing.assert_allclose(v.numpy(), st["model"][k].numpy(), rtol=1e-3, atol=1e-4, err_msg=k)

    base = ["train", "--target", str(hot_target), "--init-drafter", str(run_dir / "drafter.gguf"), "--max-prompts",
            "16", "--max-new", "32", "--n-seq", "4", "--batch", "4", "--anchors", "8", "--outtype", "f16",
            "--eval-prompts", "0", "--max-minutes", "60"]
    for extra, named in ((["--layers", "2"], "--layers"), (["--taps", "3"], "--taps"),
                         (["--init-layers", "first"], "--init-layers")):
        assert cli_main([*base, "--out", str(tmp_path / "refused"), *extra, "--max-steps", "1"]) == 2
        assert named in capsys.readouterr().err
    assert cli_main([*base[:4], str(hot_target), *base[5:], "--out", str(tmp_path / "t"), "--max-steps", "1"]) == 2
    assert "not a dflash drafter" in capsys.readouterr().err
    assert cli_main([*base[:4], str(tmp_path / "none.gguf"), *base[5:], "--out", str(tmp_path / "t")]) == 2
    assert "--init-drafter" in capsys.readouterr().err
    for junk in (b"not a gguf", (run_dir / "drafter.gguf").read_bytes()[:200]):  # not GGUF; cut short
        (tmp_path / "junk.gguf").write_bytes(junk)
        assert cli_main([*base[:4], str(tmp_path / "junk.gguf"), *base[5:], "--out", str(tmp_path / "t")]) == 2
        assert "junk.gguf" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists() and not (tmp_path / "t").exists()  # refused before DIR is made

    # lr 0: one step leaves the drafter as it came, so the export is the very file it started from
    assert cli_main([*base, "--out", str(tmp_path / "same"), "--max-steps", "1", "--lr", "0"]) == 0
    a, b = (gguf.GGUFReader(str(p)) for p in (run_dir / "drafter.gguf", tmp_path / "same" / "drafter.gguf"))
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors]
    for ta, tb in zip(a.tensors, b.tensors, strict=True):
        np.testing.assert_array_equal(np.asarray(ta.data), np.asarray(tb.data), err_msg=ta.name)
    # and training goes on from it: its first loss is the trained drafter's, far below a fresh start's
    warm = json.loads((tmp_path / "same" / "train_log.jsonl").read_text().splitlines()[0])
    cold = next(e for e in st["log"] if e.get("step") == 1)
    assert warm["step"] == 1 and warm["ce"] < cold["ce"] - 0.5, (warm, cold)


def test_sample_batch_labels_follow_the_anchor(tmp_path: Path) -> None:
    meta = {"target_sha": "x", "target_layer_ids": [0], "n_taps": 1, "n_embd": 2, "n_vocab": 100}
    with DatasetWriter(tmp_path, meta) as w:
        w.add(0, np.arange(10, 30), np.arange(40).reshape(20, 2), 5)
    b = sample_batch(Dataset(tmp_path), np.random.default_rng(0), 1, 50, 4)
    for a in range(b.anchor_pos.shape[1]):
        p = int(b.anchor_pos[0, a])
        assert 4 <= p <= 18 and int(b.anchor_tok[0, a]) == 10 + p
        lab = [int(x) for x in b.labels[0, a, 1:] if x >= 0]
        assert lab == list(range(11 + p, min(30, 10 + p + 4)))
    assert b.feats.shape[1] == int(b.anchor_pos.max())  # context: rows before the last anchor only


def test_loss_is_finite_without_selector(tmp_path: Path, hot_target: Path) -> None:
    meta = {"target_sha": "x", "target_layer_ids": TAPS, "n_taps": 3, "n_embd": 64, "n_vocab": 424}
    with DatasetWriter(tmp_path, meta) as w:
        w.add(0, np.arange(100, 130), np.random.default_rng(0).standard_normal((30, 192)), 3)
    info = read_target(hot_target)
    model = build_model(_tiny_config(info, version=1), hot_target)
    loss = compute_losses(model, sample_batch(Dataset(tmp_path), np.random.default_rng(0), 1, 8, 6))
    assert np.isfinite(loss.total.item()) and loss.selector == 0.0
