"""The training recipe's parts on tiny real targets: soft labels (stored top-k, KL loss),
drafter layers copied from target layers, the selector loss with the gold token in the last
slot, and self-synthesised prompts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="pydflash2[train] (torch) is not installed")

import llama_cpp  # noqa: E402
import pydflash2_testing as testing  # noqa: E402

from pydflash2.train.dataset import Dataset, DatasetError, DatasetWriter  # noqa: E402
from pydflash2.train.distill import Distiller, distill  # noqa: E402
from pydflash2.train.model import DrafterConfig  # noqa: E402
from pydflash2.train.objective import Batch, LossOptions, compute_losses, sample_batch  # noqa: E402
from pydflash2.train.prompts import DEV_FILE, as_messages, read_prompts  # noqa: E402
from pydflash2.train.sources import (  # noqa: E402
    Deduper,
    Synthesiser,
    clean_prompt,
    dedupe,
    magpie_prompts,
    user_turn_opening,
)
from pydflash2.train.target import read_target, target_shape  # noqa: E402
from pydflash2.train.trainer import build_model  # noqa: E402

HOT = tuple(testing.FIRST_MERGED_ID + i for i in range(6))
TAPS = [0, 1, 2]
K = 8


@pytest.fixture(scope="module")
def hot_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("recipe-target")
    return testing.make_target_gguf(d / "target.gguf", testing.TargetSpec(hot_tokens=HOT))


@pytest.fixture(scope="module")
def soft_data(tmp_path_factory: pytest.TempPathFactory, hot_target: Path) -> Dataset:
    out = tmp_path_factory.mktemp("soft") / "data"
    distill(hot_target, read_prompts(DEV_FILE)[:4], out, TAPS, n_seq=1, max_new=16, n_threads=1, progress=False,
            top_k=K)
    return Dataset(out)


def _config(info, **kw) -> DrafterConfig:  # noqa: ANN001
    base = dict(n_embd=64, n_vocab=info.n_vocab, target_layer_ids=TAPS, mask_token_id=info.mask_token_id,
                n_layer=1, n_head=4, n_head_kv=2, head_dim=16, n_ff=128, block_size=6, rope_theta=10000.0,
                rms_eps=info.rms_eps, conv_group_size=16, selector_rank=8, selector_top_k=4)
    base.update(kw)
    return DrafterConfig(**base)


# ------------------------------------------------------------------ soft labels


def test_stored_top_k_round_trips(soft_data: Dataset, hot_target: Path) -> None:
    """Every generated position keeps the target's top-k log-probabilities (best first, the
    greedy token first), equal to a full-softmax recomputation of the same sequence."""
    llm = llama_cpp.Llama(str(hot_target), n_ctx=512, logits_all=True, n_threads=1, verbose=False)
    assert soft_data.top_k == K and len(soft_data) == 4
    for i in range(len(soft_data)):
        tokens, _, plen = soft_data.sequence(i)
        ids, logp = soft_data.soft_labels(i)
        assert (ids[: plen - 1] == -1).all() and (ids[-1] == -1).all()  # rows that computed no logits
        gen = slice(plen - 1, len(tokens) - 1)
        np.testing.assert_array_equal(ids[gen, 0], tokens[plen:])
        assert (np.diff(logp[gen].astype(np.float32), axis=1) <= 0).all()
        llm.reset()
        llm.eval([int(t) for t in tokens[:-1]])
        logits = np.asarray(llm.scores[plen - 1 : len(tokens) - 1], dtype=np.float64)
        full = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
            - logits.max(1, keepdims=True)
        np.testing.assert_allclose(np.take_along_axis(full, ids[gen].astype(np.int64), 1), logp[gen],
                                   atol=5e-2, rtol=1e-2)  # another decode: f32 batch numerics, f16 storage
        ref_top = np.sort(full, axis=1)[:, ::-1][:, :K]
        np.testing.assert_allclose(logp[gen], ref_top, atol=5e-2, rtol=1e-2)
    llm.close()


def test_soft_label_files_round_trip_and_guard(tmp_path: Path) -> None:
    meta = {"target_sha": "abc", "target_layer_ids": [0], "n_taps": 1, "n_embd": 4, "n_vocab": 50, "top_k": 3}
    rng = np.random.default_rng(0)
    ids = rng.integers(-1, 50, (6, 3)).astype(np.int32)
    logp = -rng.random((6, 3)).astype(np.float32) * 10
    with DatasetWriter(tmp_path, meta) as w:
        w.add(0, np.arange(6), np.ones((6, 4), np.float32), 2, ids, logp)
        with pytest.raises(ValueError, match="top-3"):
            w.add(1, np.arange(6), np.ones((6, 4), np.float32), 2)
    d = Dataset(tmp_path)
    got_ids, got_logp = d.soft_labels(0)
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_logp, logp.astype(np.float16))
    with pytest.raises(DatasetError, match="another target"):
        DatasetWriter(tmp_path, {**meta, "top_k": 0})


@pytest.mark.parametrize("mix", [1.0, 0.3])
def test_soft_loss_is_kl_to_the_stored_distribution(soft_data: Dataset, hot_target: Path, mix: float) -> None:
    """The soft loss is KL(q || p), q the stored top-k renormalised inside the draft vocabulary,
    p the drafter's softmax: checked against a float64 reference from the dataset files."""
    info = read_target(hot_target)
    counts = soft_data.token_counts(info.n_vocab)
    draft_ids = sorted(np.argsort(-counts)[:40].tolist())  # a reduced vocabulary: some top-k fall outside
    torch.manual_seed(0)
    model = build_model(_config(info, version=1, draft_ids=draft_ids), hot_target)
    batch = sample_batch(soft_data, np.random.default_rng(3), 4, 6, 6, seq_ids=np.arange(4))  # row b: sequence b
    loss = compute_losses(model, batch, LossOptions(gamma=0.0, soft_weight=mix))
    with torch.no_grad():
        _, logits = model(batch.feats.float(), batch.ctx_valid, batch.anchor_pos, batch.anchor_tok, 6)  # f16 as sampled
    lg = logits.double().numpy()
    t2d = {t: j for j, t in enumerate(draft_ids)}
    kls, ces = [], []
    B, A, n = batch.labels.shape
    for b in range(B):
        for a in range(A):
            for k in range(1, n):
                lab = int(batch.labels[b, a, k])
                if lab < 0:
                    continue
                row = int(batch.anchor_pos[b, a]) + k - 1  # the stored row holding t_{p+k}'s distribution
                ids, logp = (np.asarray(x[row], dtype=np.float64) for x in soft_data.soft_labels(b))
                lp = lg[b, a, k] - np.log(np.exp(lg[b, a, k] - lg[b, a, k].max()).sum()) - lg[b, a, k].max()
                keep = [(t2d[int(t)], float(v)) for t, v in zip(ids, logp, strict=True) if int(t) in t2d]
                if keep:
                    q = np.exp(np.array([v for _, v in keep], dtype=np.float64))
                    q /= q.sum()
                    kls.append(float((q * (np.log(q) - lp[[j for j, _ in keep]])).sum()))
                else:
                    kls.append(0.0)
                ces.append(-lp[t2d[lab]] if lab in t2d else 0.0)
    assert len(kls) > 10 and any(k > 0 for k in kls)
    ref_kl, ref_ce = np.sum(kls) / len(kls), np.sum(ces) / len(ces)
    np.testing.assert_allclose(loss.soft.item(), ref_kl, rtol=1e-5)
    np.testing.assert_allclose(loss.total.item(), (1 - mix) * ref_ce + mix * ref_kl, rtol=1e-5)


def test_online_stream_carries_the_soft_labels(soft_data: Dataset, hot_target: Path) -> None:
    """--online --soft-top-k: the streamed sequences carry the same top-k as the stored dataset
    of the same prompts, so the batches' soft labels are the same too."""
    from pydflash2.train.online import OnlineStream

    with OnlineStream(hot_target, read_prompts(DEV_FILE)[:4], TAPS, 64, n_seq=1, max_new=16, n_threads=1,
                      top_k=K) as stream:
        w = stream.take(4)
    assert w.top_k == K
    for i in range(4):
        ids, logp = w.soft_labels(int(w.ids[i]))
        want_ids, want_logp = soft_data.soft_labels(i)
        np.testing.assert_array_equal(np.asarray(ids), np.asarray(want_ids))
        np.testing.assert_allclose(np.asarray(logp, dtype=np.float32), np.asarray(want_logp, dtype=np.float32),
                                   rtol=1e-3, atol=1e-3)
    got = sample_batch(w, None, 4, 6, 6, seq_ids=w.ids, anchor_seed=1)
    want = sample_batch(soft_data, None, 4, 6, 6, seq_ids=np.arange(4), anchor_seed=1)
    assert got.soft_ids is not None and torch.equal(got.soft_ids, want.soft_ids)
    torch.testing.assert_close(got.soft_logp, want.soft_logp, rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------ selector loss


def _selector_case(hot_target: Path) -> tuple:
    info = read_target(hot_target)
    torch.manual_seed(0)
    model = build_model(_config(info, version=2), hot_target)
    feats = torch.from_numpy(np.random.default_rng(1).standard_normal((1, 12, 3 * 64)).astype(np.float32))
    p, anchor = 9, 40
    with torch.no_grad():
        _, lg = model(feats, torch.ones(1, 12, dtype=torch.bool), torch.tensor([[p]]), torch.tensor([[anchor]]), 6)
    labels = torch.full((1, 1, 6), -100, dtype=torch.long)
    labels[0, 0, 1:] = lg[0, 0, 1:].argsort(-1)[:, 0]  # every gold token: the unary's least likely
    batch = Batch(feats, torch.ones(1, 12, dtype=torch.bool), torch.tensor([[p]]), torch.tensor([[anchor]]), labels,
                  torch.ones(1, 1, dtype=torch.bool))
    return model, batch


def test_selector_scores_a_gold_token_outside_the_top_k(hot_target: Path) -> None:
    """Gold outside the candidates: it takes the last slot and is scored (the old loss dropped
    such positions: selector loss 0, no gradient to the selector)."""
    model, batch = _selector_case(hot_target)
    loss = compute_losses(model, batch, LossOptions())
    assert loss.selector.item() > 0
    model.zero_grad()
    loss.total.backward()
    gold = batch.labels[0, 0, 1:]
    assert model.candidate_selector.successor_codebook.grad[gold].abs().sum() > 0
    dropped = compute_losses(model, batch, LossOptions(selector_gold_slot=False))
    assert dropped.selector.item() == 0.0


def test_selector_backbone_option_trains_the_layers(hot_target: Path) -> None:
    model, batch = _selector_case(hot_target)

    def layer_grad(**kw: object) -> torch.Tensor:
        model.zero_grad()
        compute_losses(model, batch, LossOptions(**kw)).total.backward()
        return model.layers[0].mlp.down_proj.weight.grad.clone()

    base = layer_grad(selector_weight=0.0)
    torch.testing.assert_close(layer_grad(selector_weight=1.0), base)  # detached: the layers see no selector loss
    assert (layer_grad(selector_weight=1.0, selector_backbone=True) - base).abs().max() > 1e-6


def test_selector_loss_is_not_decay_weighted(hot_target: Path) -> None:
    model, batch = _selector_case(hot_target)
    flat = compute_losses(model, batch, LossOptions(gamma=1.0)).selector.item()
    decayed = compute_losses(model, batch, LossOptions(gamma=1.0, selector_decay=True)).selector.item()
    same = compute_losses(model, batch, LossOptions(gamma=0.0, selector_decay=True)).selector.item()
    assert flat == pytest.approx(same, rel=1e-6) and flat != pytest.approx(decayed, rel=1e-3)


# ------------------------------------------------------------------ target-initialised layers


def _rope_ref(x: np.ndarray, pos: np.ndarray, theta: float, neox: bool) -> np.ndarray:
    """llama.cpp's rotary embedding on [L, heads, D]: NEOX rotates halves, NORM adjacent pairs."""
    D = x.shape[-1]
    ang = pos[:, None, None] * theta ** (-np.arange(D // 2) * 2.0 / D)
    cos, sin = np.cos(ang), np.sin(ang)
    if neox:
        a, b = x[..., : D // 2], x[..., D // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    return out


def _target_layer_ref(gguf_path: Path, layer: int, x: np.ndarray) -> np.ndarray:
    """Float64 reference of target layer `layer` on inputs x [L, H] (causal), from the GGUF
    tensors as stored (llama: interleaved rotary pairs on the permuted rows)."""
    import gguf

    r = gguf.GGUFReader(str(gguf_path))
    arch = r.get_field("general.architecture").contents()
    W = {t.name[len(f"blk.{layer}.") :]: np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float64)
         for t in r.tensors if t.name.startswith(f"blk.{layer}.")}
    sh = target_shape(gguf_path)
    nh, nkv, D = sh["n_head"], sh["n_head_kv"], sh["head_dim"]
    eps = r.get_field(f"{arch}.attention.layer_norm_rms_epsilon").contents()
    theta = r.get_field(f"{arch}.rope.freq_base").contents()

    def rms(v: np.ndarray, w: np.ndarray) -> np.ndarray:
        return v / np.sqrt((v * v).mean(-1, keepdims=True) + eps) * w.reshape(-1)

    L = len(x)
    u = rms(x, W["attn_norm.weight"])
    q = (u @ W["attn_q.weight"].T).reshape(L, nh, D)
    k = (u @ W["attn_k.weight"].T).reshape(L, nkv, D)
    v = (u @ W["attn_v.weight"].T).reshape(L, nkv, D)
    if "attn_q_norm.weight" in W:
        q, k = rms(q, W["attn_q_norm.weight"]), rms(k, W["attn_k_norm.weight"])
    pos = np.arange(L, dtype=np.float64)
    q, k = _rope_ref(q, pos, theta, arch != "llama"), _rope_ref(k, pos, theta, arch != "llama")
    rep = nh // nkv
    o = np.zeros((L, nh, D))
    for h in range(nh):
        s = q[:, h] @ k[:, h // rep].T / np.sqrt(D)
        s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
        pr = np.exp(s - s.max(1, keepdims=True))
        o[:, h] = (pr / pr.sum(1, keepdims=True)) @ v[:, h // rep]
    x = x + o.reshape(L, nh * D) @ W["attn_output.weight"].T
    u = rms(x, W["ffn_norm.weight"])
    g = u @ W["ffn_gate.weight"].T
    return x + ((g / (1 + np.exp(-g))) * (u @ W["ffn_up.weight"].T)) @ W["ffn_down.weight"].T


def test_layer_reference_is_what_llama_cpp_computes(hot_target: Path) -> None:
    """The float64 target-layer reference reproduces llama.cpp: layer 1 maps the captured input
    of layer 1 to the captured input of layer 2."""
    toks = [int(t) for t in llama_cpp.Llama(str(hot_target), vocab_only=True, verbose=False).tokenize(
        b"The quick brown fox jumps over the lazy dog again", add_bos=False)]
    with Distiller(hot_target, [0, 1], n_seq=1, max_len=64, n_threads=1) as d:
        feats, _, _ = d._decode([(0, t, i, i == len(toks) - 1) for i, t in enumerate(toks)])
    x_in, x_out = feats[:, :64].astype(np.float64), feats[:, 64:].astype(np.float64)
    np.testing.assert_allclose(_target_layer_ref(hot_target, 1, x_in), x_out, rtol=5e-3, atol=5e-3)  # f16 KV cache


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_copied_layer_reproduces_the_target_layer(tmp_path: Path, arch: str) -> None:
    """A drafter layer initialised from target layer 2 computes that layer (float64): each row a
    one-token block at its position, the context rows before it as keys and values. A llama layer
    has no per-head q/k norms: the drafter's start at ones and are bypassed here, the one part of a
    drafter layer a llama target layer cannot fill."""
    target = testing.make_target_gguf(tmp_path / "t.gguf", testing.TargetSpec(arch=arch))
    info = read_target(target)
    sh = target_shape(target)
    model = build_model(_config(info, n_head=sh["n_head"], n_head_kv=sh["n_head_kv"], head_dim=sh["head_dim"],
                                n_ff=sh["n_ff"]), target, init_layers=[2]).double()
    layer = model.layers[0]
    if arch == "llama":
        assert (layer.self_attn.q_norm.weight == 1).all()
        layer.self_attn.q_norm = layer.self_attn.k_norm = torch.nn.Identity()
    L = 10
    x = np.random.default_rng(5).standard_normal((L, 64))
    want = _target_layer_ref(target, 2, x)
    with torch.no_grad():
        xt = torch.from_numpy(x)
        ctx = layer.input_layernorm(xt)[None]  # the target's keys/values come from the normed input
        pos = torch.arange(L)
        ck, cv = layer.self_attn.context_kv(ctx, pos[None])
        mask = torch.cat([pos[:, None] > pos[None, :], torch.eye(L, dtype=torch.bool)], -1)[None]
        got = layer(xt[None, :, None, :], pos[None, :, None], ck, cv, mask)[0, :, 0]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-6)  # rotary angles: float32
    other = build_model(_config(info, n_head=sh["n_head"], n_head_kv=sh["n_head_kv"], head_dim=sh["head_dim"],
                                n_ff=sh["n_ff"]), target, init_layers=[1])
    assert not torch.equal(other.layers[0].mlp.up_proj.weight.double(), layer.mlp.up_proj.weight)


def test_target_init_refuses_a_layer_it_cannot_hold(tmp_path: Path) -> None:
    target = testing.make_target_gguf(tmp_path / "t.gguf", testing.TargetSpec(arch="qwen2"))
    info = read_target(target)
    with pytest.raises(ValueError, match="llama"):
        build_model(_config(info), target, init_layers=[1])


# ------------------------------------------------------------------ prompts from many sources


def test_magpie_prompts_are_seeded_distinct_and_clean(hot_target: Path) -> None:
    with Synthesiser(hot_target, n_threads=1) as synth:
        assert "<|im_start|>" in synth.markers
        a = magpie_prompts(synth, 6, seed=1, max_attempts=60)
        b = magpie_prompts(synth, 6, seed=1, max_attempts=60)
        c = magpie_prompts(synth, 6, seed=2, max_attempts=60)
        opening = user_turn_opening(synth.llm)
        raw = [synth._complete(opening, seed=i, temperature=1.0, top_p=0.95, max_tokens=96) for i in range(40)]
    assert a == b and a != c and len(a) >= 3
    assert len(dedupe(a)) == len(a)
    for p in a + c:
        assert "<|" not in p and "im_start" not in p and "im_end" not in p
    # the random target does leak markup (it samples special tokens): the filter is what removes it
    assert any(clean_prompt(t, synth.markers) is None for t in raw)


def test_dedupe_drops_exact_and_near_duplicates() -> None:
    texts = ["How do I bake sourdough bread at home?", "how do I bake  sourdough bread at home",
             "How do I bake sourdough bread at home quickly?", "What is the capital of Peru?"]
    assert dedupe(texts) == [texts[0], texts[3]]
    assert dedupe(texts, exclude=["What is the capital of Peru"]) == [texts[0]]
    d = Deduper()
    assert d.add("a b c d e") and not d.add("A b, c d e!")


def test_prompt_filter_and_conversation_lines() -> None:
    markers = ["<|im_start|>", "<|im_end|>", "<|"]
    assert clean_prompt("  Tell me about volcanoes please  ", markers) == "Tell me about volcanoes please"
    assert clean_prompt("Hi<|im_end|>assistant", markers) is None
    assert clean_prompt("assistant: sure, here is the answer", markers) is None
    assert clean_prompt("ok", markers) is None
    conv = [{"role": "user", "content": "a\nb"}, {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"}]
    assert as_messages(json.dumps(conv)) == conv
    assert as_messages("[not json") == [{"role": "user", "content": "[not json"}]


def test_train_command_with_the_recipe(tmp_path: Path, hot_target: Path) -> None:
    """`pydflash2 train` end to end with soft labels and target-initialised layers."""
    from pydflash2.cli import main as cli_main

    common = ["train", "--target", str(hot_target), "--max-prompts", "6", "--max-new", "16", "--n-seq", "3",
              "--taps", "3", "--layers", "1", "--block-size", "6", "--draft-vocab", "300", "--max-steps", "4",
              "--batch", "2", "--anchors", "4", "--top-k", "4", "--rank", "8", "--outtype", "f16",
              "--eval-prompts", "0", "--threads", "1"]
    out = tmp_path / "run"
    assert cli_main([*common, "--out", str(out), "--soft-top-k", "8", "--init-layers", "first"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["soft_top_k"] == 8 and summary["init_layers"] == [0]
    assert summary["loss"]["soft_weight"] == 0.5 and summary["loss"]["selector_gold_slot"]
    assert summary["config"]["n_head"] == 4 and summary["config"]["head_dim"] == 16  # the target's shape
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert log[0]["soft_kl"] > 0
    hard = tmp_path / "hard"
    assert cli_main([*common, "--out", str(hard), "--soft-weight", "0.5"]) == 2  # no soft labels to weigh
