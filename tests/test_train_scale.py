"""Training past one CPU, proven on this CPU: DistributedDataParallel under torchrun
(gloo, 2 ranks x 1 thread) against one process on the same global batch; the
training device (a step on the meta device leaves no tensor behind on the CPU);
online distillation against offline; drafter shapes from a GQA target; the dry
run's parameter count against a real run's."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="pydflash2[train] (torch) is not installed")

import gguf  # noqa: E402
import pydflash2_testing as testing  # noqa: E402
from pydflash2_testing.upstream import UpstreamDrafter  # noqa: E402

from pydflash2.cli import main as cli_main  # noqa: E402
from pydflash2.train.dataset import Dataset  # noqa: E402
from pydflash2.train.distill import distill  # noqa: E402
from pydflash2.train.export import export_gguf, export_hf  # noqa: E402
from pydflash2.train.objective import sample_batch  # noqa: E402
from pydflash2.train.online import OnlineStream, online_batches  # noqa: E402
from pydflash2.train.parallel import Parallel  # noqa: E402
from pydflash2.train.pipeline import TrainOptions, default_shape, make_config  # noqa: E402
from pydflash2.train.prompts import TRAIN_FILE, read_prompts  # noqa: E402
from pydflash2.train.target import TargetInfo, read_target, tap_layers  # noqa: E402
from pydflash2.train.trainer import Objective, TrainSettings, anchor_seed, build_model, loss_and_grads  # noqa: E402

HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))
# one small run: every process gets 1 thread, the global batch is 4 sequences
RUN = ["--taps", "3", "--layers", "1", "--block-size", "6", "--draft-vocab", "300", "--top-k", "4", "--rank", "8",
       "--batch", "4", "--anchors", "8", "--lr", "3e-3", "--outtype", "f16", "--threads", "1", "--train-device", "cpu",
       "--max-minutes", "100000"]
N_PROMPTS, MAX_NEW = 12, 24


@pytest.fixture(scope="module")
def hot_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("scale-target")
    return testing.make_target_gguf(d / "target.gguf", testing.TargetSpec(hot_tokens=HOT))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory, hot_target: Path) -> Path:
    """The distilled data every run below starts from (so all runs train on the same data)."""
    d = tmp_path_factory.mktemp("scale-data") / "data"
    distill(hot_target, read_prompts(TRAIN_FILE)[:N_PROMPTS], d, tap_layers(4, 3), n_seq=4, max_new=MAX_NEW,
            n_threads=1, progress=False)
    return d


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _train(target: Path, out: Path, data: Path | None, extra: list[str], ranks: int = 1) -> str:
    """`pydflash2 train` in fresh processes (under torchrun when ranks > 1); returns stderr."""
    if data is not None:  # a run on existing data: --resume makes distillation skip every prompt
        out.mkdir(parents=True)
        shutil.copytree(data, out / "data")
    cmd = [sys.executable, "-m", "pydflash2", "train", "--target", str(target), "--out", str(out), "--resume",
           "--max-prompts", str(N_PROMPTS), "--max-new", str(MAX_NEW), *RUN, *extra]
    if ranks > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
               *cmd[1:]]
    # cwd: away from the source checkout, so the installed package (with its native library) is imported
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600, cwd=out.parent)
    assert p.returncode == 0, p.stderr[-4000:]
    return p.stderr


def _params(run: Path) -> dict[str, np.ndarray]:
    st = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
    return {k: v.numpy() for k, v in st["model"].items()}


def _losses(run: Path) -> dict[int, float]:
    log = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    return {e["step"]: e["loss"] for e in log if "loss" in e}


def _stops(stderr: str) -> dict[int, int]:
    return {int(r): int(n) for r, n in re.findall(r"rank (\d+)/2 stopped after (\d+) steps", stderr)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, hot_target: Path, data_dir: Path) -> dict:
    """One process and 2 DDP ranks, 21 steps each (logged at 1 and 20), then both resumed to 25."""
    root = tmp_path_factory.mktemp("scale-runs")
    one, ddp = root / "one", root / "ddp"
    r = {"one": one, "ddp": ddp}
    r["one_err"] = _train(hot_target, one, data_dir, ["--max-steps", "21", "--eval-prompts", "0"])
    r["ddp_err"] = _train(hot_target, ddp, data_dir, ["--max-steps", "21", "--eval-prompts", "1",
                                                      "--eval-max-tokens", "8", "--device", "CPU"], ranks=2)
    r["one_21"], r["ddp_21"] = _params(one), _params(ddp)
    r["ddp_21_log"] = _losses(ddp)
    r["one_resume_err"] = _train(hot_target, one, None, ["--max-steps", "25", "--eval-prompts", "0"])
    r["ddp_resume_err"] = _train(hot_target, ddp, None, ["--max-steps", "25", "--eval-prompts", "0"], ranks=2)
    return r


def test_ddp_equals_one_process_on_the_same_global_batch(runs: dict) -> None:
    one, ddp = runs["one_21"], runs["ddp_21"]
    assert set(one) == set(ddp)
    moved = 0.0
    for k in one:
        np.testing.assert_allclose(ddp[k], one[k], rtol=1e-4, atol=1e-5, err_msg=k)
        moved = max(moved, float(np.abs(one[k]).max()))
    assert moved > 0
    lo, ld = _losses(runs["one"]), runs["ddp_21_log"]
    assert sorted(ld) == sorted(lo) == [1, 20]  # the logged (global-batch) losses: steps 1 and 20
    for step in lo:
        assert ld[step] == pytest.approx(lo[step], rel=1e-4), step
    assert _stops(runs["ddp_err"]) == {0: 21, 1: 21}


def test_only_rank_0_distils_exports_and_evaluates(runs: dict) -> None:
    err = runs["ddp_err"]
    assert err.count("[pydflash2 train] data:") == 1
    assert err.count("[pydflash2 train] wrote ") == 1 and err.count("engine eval on 1 held-out") == 1
    ddp = runs["ddp"]
    assert (ddp / "hf" / "model.safetensors").is_file() and (ddp / "drafter.gguf").is_file()
    summary = json.loads((ddp / "summary.json").read_text())
    assert summary["steps"] == 25 and summary["train_device"] == "cpu"


def test_resume_under_ddp_continues_where_it_stopped(runs: dict) -> None:
    one, ddp = _params(runs["one"]), _params(runs["ddp"])
    st = torch.load(runs["ddp"] / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert st["step"] == 25
    assert _stops(runs["ddp_resume_err"]) == {0: 25, 1: 25}
    assert {e["step"]: e["loss"] for e in st["log"] if "loss" in e and e["step"] < 21} == \
        {s: v for s, v in runs["ddp_21_log"].items() if s < 21}  # the first run's log is kept
    for k in one:  # the resumed DDP run is the resumed single-process run
        np.testing.assert_allclose(ddp[k], one[k], rtol=1e-4, atol=1e-5, err_msg=k)
    assert sum(not np.array_equal(ddp[k], runs["ddp_21"][k]) for k in ddp) > len(ddp) // 2  # and it trained on


def test_ddp_ranks_stop_together_on_a_time_budget(tmp_path: Path, hot_target: Path, data_dir: Path) -> None:
    err = _train(hot_target, tmp_path / "run", data_dir, ["--max-minutes", "0.05", "--eval-prompts", "0"], ranks=2)
    stops = _stops(err)
    assert set(stops) == {0, 1} and stops[0] == stops[1] > 0
    st = torch.load(tmp_path / "run" / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert st["step"] == stops[0] and st["elapsed"] >= 3.0


def test_a_failure_on_rank_0_stops_every_rank(tmp_path: Path, hot_target: Path) -> None:
    """Rank 0 refuses a non-empty DIR without --resume: rank 1 hears of it instead of waiting."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "something").write_text("x")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "pydflash2",
           "train", "--target", str(hot_target), "--out", str(out), *RUN]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode != 0
    assert "pass --resume" in p.stderr and "rank 0 failed: FileExistsError" in p.stderr
    assert sorted(x.name for x in out.iterdir()) == ["something"]


def test_a_training_step_stays_on_its_device(tmp_path: Path, hot_target: Path, data_dir: Path) -> None:
    """A step on the meta device: any tensor made on the CPU inside it (a device-less
    torch.arange, a table left behind) shows up as a CPU result."""
    from torch.utils._python_dispatch import TorchDispatchMode

    info = read_target(hot_target)
    cfg = make_config(TrainOptions(target=hot_target, out=tmp_path, layers=1, block_size=6, selector_top_k=4,
                                   selector_rank=8), info, tap_layers(4, 3), list(range(300)))
    meta = torch.device("meta")
    model = build_model(cfg, hot_target, meta)
    assert all(t.device == meta for t in [*model.parameters(), *model.buffers()])
    s = TrainSettings()
    batch = sample_batch(Dataset(data_dir), None, 4, 8, 6, seq_ids=np.arange(4), anchor_seed=1)  # on the host
    seen: list[str] = []

    class Devices(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            out = func(*args, **(kwargs or {}))
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor) and t.device != meta:
                    seen.append(f"{func} -> {t.device}")
            return out

    params = [p for p in model.parameters() if p.requires_grad]
    with Devices():
        loss = loss_and_grads(Objective(model, s, Parallel(meta)), batch, meta, params)
    assert not seen, seen[:5]
    assert loss.total.device == meta and all(p.grad is not None and p.grad.device == meta for p in params)


def test_train_device_errors_are_clear(tmp_path: Path, hot_target: Path, capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    for dev, needle in [("cuda", "no CUDA device"), ("tpu", "--train-device must be")]:
        args = ["train", "--target", str(hot_target), "--out", str(tmp_path / "x"), "--train-device", dev]
        assert cli_main(args) == 2
        assert needle in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_online_batches_equal_offline_batches(hot_target: Path, data_dir: Path) -> None:
    """The stream of sequences the target writes while training equals the stored dataset of
    the same prompts, so the batches do too (tokens, labels, anchors; features in f16)."""
    data = Dataset(data_dir)
    prompts = read_prompts(TRAIN_FILE)[:N_PROMPTS]
    B, A, block = 4, 8, 6
    with OnlineStream(hot_target, prompts, data.meta["target_layer_ids"], 64, n_seq=4, max_new=MAX_NEW, n_threads=1,
                      queue_size=3) as stream:
        first = stream.take(B + 1)
        stream.give_back(first, 0)  # unused: handed out again with the same ids (online mode's held-out split)
        assert stream.taken == 0
        batches = online_batches(stream, B, A, block, lambda step: anchor_seed(0, step))
        for step in range(N_PROMPTS // B):
            got = batches(step)
            want = sample_batch(data, None, B, A, block, seq_ids=np.arange(step * B, (step + 1) * B),
                                anchor_seed=anchor_seed(0, step))
            for name in ("ctx_valid", "anchor_pos", "anchor_tok", "labels", "anchor_valid"):
                assert torch.equal(getattr(got, name), getattr(want, name)), (step, name)
            assert got.feats.dtype == want.feats.dtype == torch.float16
            np.testing.assert_allclose(got.feats.float().numpy(), want.feats.float().numpy(), rtol=1e-3, atol=1e-3)
        again = stream.take(B)  # the second epoch distils the same prompts again
        for i, sid in enumerate(again.ids):
            tokens, feats, plen = again.sequence(sid)
            t0, f0, p0 = data.sequence(i)
            np.testing.assert_array_equal(tokens, t0)
            np.testing.assert_allclose(feats.astype(np.float32), f0.astype(np.float32), rtol=1e-3, atol=1e-3)
            assert plen == p0
        assert stream.taken == N_PROMPTS + B


def test_online_run_trains_and_stores_nothing(tmp_path: Path, hot_target: Path) -> None:
    out = tmp_path / "run"
    assert cli_main(["train", "--target", str(hot_target), "--out", str(out), "--online", "--max-prompts", "8",
                     "--max-new", "16", "--n-seq", "4", *RUN, "--max-steps", "6", "--eval-prompts", "0",
                     "--queue-size", "4"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["online"] and summary["steps"] == 6 and summary["feature_mib"] == 0.0
    assert summary["sequences"] == 6 * 4 and not (out / "data").exists()  # every sequence trained on once
    assert (out / "drafter.gguf").is_file()


def test_drafter_takes_the_gqa_targets_shape_and_loads_in_libllama(tmp_path: Path, hot_target: Path) -> None:
    info = read_target(hot_target)
    assert (info.n_head, info.n_head_kv, info.head_dim, info.n_ff) == (4, 2, 16, 128)
    opts = TrainOptions(target=hot_target, out=tmp_path, selector_top_k=4, selector_rank=8)
    cfg = make_config(opts, info, tap_layers(4, 3), list(range(300)))
    assert (cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.n_ff) == (4, 2, 16, 128)
    assert (cfg.n_layer, cfg.block_size) == default_shape(info)[:2] == (2, 8)
    model = build_model(cfg, hot_target)
    assert model.layers[0].self_attn.k_proj.weight.shape == (2 * 16, 64)
    path = export_gguf(export_hf(model, tmp_path / "hf"), hot_target, tmp_path / "d.gguf", "f16")
    r = gguf.GGUFReader(str(path))
    assert r.get_field("dflash.attention.head_count_kv").contents() == 2
    assert r.get_field("dflash.attention.head_count").contents() == 4
    with UpstreamDrafter(hot_target, path, n_ctx=256) as up:  # libllama loads it and drafts a block
        assert up.is_dflash2
        prompt = [1, 40, 41, 42, 43, 44]
        feats, logits = up.target_decode(prompt, 0)
        up.inject(feats, range(len(prompt)))
        lat = up.draft(int(np.argmax(logits[-1])), len(prompt))
        assert lat.candidates.shape == (7, 4) and np.isfinite(lat.scores).all()
    # overrides, and an 8B target's shape (Llama-3.1-8B's config): GQA 32/8 x 128, its FFN, the published recipe
    over = make_config(TrainOptions(target=hot_target, out=tmp_path, n_head=8, n_head_kv=8, n_ff=96), info, [0], [])
    assert (over.n_head, over.n_head_kv, over.head_dim, over.n_ff) == (8, 8, 16, 96)
    with pytest.raises(ValueError, match="multiple"):
        make_config(TrainOptions(target=hot_target, out=tmp_path, n_head=6, n_head_kv=4), info, [0], [])
    llama8b = TargetInfo(Path("x.gguf"), "llama", 4096, 32, 128256, 32, 8, 128, 14336, 5e5, 1e-5, 0, "m", 1)
    big = make_config(TrainOptions(target=hot_target, out=tmp_path), llama8b, tap_layers(32, 5), [])
    assert (big.n_head, big.n_head_kv, big.head_dim, big.n_ff, big.n_layer, big.block_size) == (
        32, 8, 128, 14336, 5, 16)


def test_dry_run_counts_what_a_run_allocates(runs: dict, hot_target: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan"
    assert cli_main(["train", "--target", str(hot_target), "--out", str(out), "--dry-run", *RUN]) == 0
    text = capsys.readouterr().out
    planned = int(re.search(r"parameters\s+([\d,]+) trainable", text).group(1).replace(",", ""))
    real = json.loads((runs["ddp"] / "summary.json").read_text())["trainable_parameters"]
    model_params = sum(v.size for v in runs["ddp_21"].values())  # what the checkpoint holds
    assert planned == real == model_params
    assert "bytes per token" in text and not out.exists()
