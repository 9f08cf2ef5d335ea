"""Float64 NumPy reference of the DFlash / DFlash2 drafter, written from the math
of docs/dflash2.md section 1 (not from any ggml graph). Used by the drafter tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def read_tensors(path: str | Path) -> dict[str, np.ndarray]:
    r = gguf.GGUFReader(str(path))
    return {t.name: np.array(t.data, dtype=np.float64) for t in r.tensors if t.name != "d2t"}


def read_meta(path: str | Path) -> dict:
    r = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.ggml.tokens")}


class RefDrafter:
    def __init__(self, drafter_gguf: str | Path, target_gguf: str | Path) -> None:
        self.w = read_tensors(drafter_gguf)
        m = read_meta(drafter_gguf)
        tw = read_tensors(target_gguf)
        self.emb = tw["token_embd.weight"]
        self.head = tw.get("output.weight", self.emb)
        self.H = int(m["dflash.embedding_length"])
        self.n_layer = int(m["dflash.block_count"])
        self.n_head = int(m["dflash.attention.head_count"])
        self.n_head_kv = int(m["dflash.attention.head_count_kv"])
        self.D = int(m["dflash.attention.key_length"])
        self.eps = float(m["dflash.attention.layer_norm_rms_epsilon"])
        self.theta = float(m["dflash.rope.freq_base"])
        self.mask_id = int(m["tokenizer.ggml.mask_token_id"])
        self.v2 = "selector_hidden.weight" in self.w
        if self.v2:
            self.K = int(m["dflash.conv_kernel_size"])
            self.gs = int(m["dflash.conv_group_size"])
            self.top_k = int(m["dflash.selector_top_k"])
        self.ctx_k: list[np.ndarray] = [np.zeros((0, self.n_head_kv, self.D))] * self.n_layer
        self.ctx_v: list[np.ndarray] = [np.zeros((0, self.n_head_kv, self.D))] * self.n_layer
        self.ctx_pos = np.zeros(0, dtype=np.int64)

    # ---- pieces
    def rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:  # x [n, heads, D], NEOX halves
        half = self.D // 2
        inv = self.theta ** (-np.arange(half) * 2.0 / self.D)
        ang = pos[:, None].astype(np.float64) * inv[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def conv(self, y: np.ndarray, dyn: np.ndarray, base: np.ndarray, side: int) -> np.ndarray:
        n, H = y.shape
        G = H // self.gs
        d = dyn.reshape(n, 2, self.K, G)
        out = np.zeros_like(y)
        for i in range(n):
            for t in range(self.K):
                if i - t < 0:
                    continue
                coef = base[side, t] + np.repeat(d[i, side, t], self.gs)
                out[i] += coef * y[i - t]
        return out

    # ---- cache
    def inject(self, feats: np.ndarray, pos: np.ndarray) -> None:
        w = self.w
        c = self.rms(feats.astype(np.float64) @ w["fc.weight"].T, w["enc.output_norm.weight"])
        n = len(pos)
        for il in range(self.n_layer):
            p = f"blk.{il}."
            k = (c @ w[p + "attn_k.weight"].T).reshape(n, self.n_head_kv, self.D)
            k = self.rope(self.rms(k, w[p + "attn_k_norm.weight"]), np.asarray(pos))
            v = (c @ w[p + "attn_v.weight"].T).reshape(n, self.n_head_kv, self.D)
            self.ctx_k[il] = np.concatenate([self.ctx_k[il], k])
            self.ctx_v[il] = np.concatenate([self.ctx_v[il], v])
        self.ctx_pos = np.concatenate([self.ctx_pos, np.asarray(pos, dtype=np.int64)])

    def truncate(self, pos: int) -> None:
        keep = self.ctx_pos < pos
        self.ctx_pos = self.ctx_pos[keep]
        self.ctx_k = [k[keep] for k in self.ctx_k]
        self.ctx_v = [v[keep] for v in self.ctx_v]

    # ---- block
    def forward(self, anchor: int, pos0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(hidden [n, H] after the final norm, logits [n, V])."""
        w = self.w
        pos = pos0 + np.arange(n)
        x = self.emb[[anchor] + [self.mask_id] * (n - 1)].copy()
        r = self.n_head // self.n_head_kv
        for il in range(self.n_layer):
            p = f"blk.{il}."
            u = self.rms(x, w[p + "attn_norm.weight"])
            a = u
            if self.v2:
                dyn = u @ w[p + "attn_conv_proj.weight"].T
                a = self.conv(u, dyn, w[p + "attn_conv_base"], 0)
            q = self.rope(
                self.rms((a @ w[p + "attn_q.weight"].T).reshape(n, self.n_head, self.D), w[p + "attn_q_norm.weight"]),
                pos,
            )
            k = self.rope(
                self.rms(
                    (a @ w[p + "attn_k.weight"].T).reshape(n, self.n_head_kv, self.D), w[p + "attn_k_norm.weight"]
                ),
                pos,
            )
            v = (a @ w[p + "attn_v.weight"].T).reshape(n, self.n_head_kv, self.D)
            K = np.concatenate([self.ctx_k[il], k])
            V = np.concatenate([self.ctx_v[il], v])
            o = np.zeros((n, self.n_head, self.D))
            for h in range(self.n_head):
                s = q[:, h] @ K[:, h // r].T / np.sqrt(self.D)  # non-causal over [context; block]
                s = np.exp(s - s.max(-1, keepdims=True))
                o[:, h] = (s / s.sum(-1, keepdims=True)) @ V[:, h // r]
            hcur = o.reshape(n, -1) @ w[p + "attn_output.weight"].T
            if self.v2:
                hcur = self.conv(hcur, dyn, w[p + "attn_conv_base"], 1)
            x = x + hcur
            u = self.rms(x, w[p + "ffn_norm.weight"])
            mm = u
            if self.v2:
                dyn = u @ w[p + "ffn_conv_proj.weight"].T
                mm = self.conv(u, dyn, w[p + "ffn_conv_base"], 0)
            g = mm @ w[p + "ffn_gate.weight"].T
            f = (g / (1.0 + np.exp(-g)) * (mm @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
            if self.v2:
                f = self.conv(f, dyn, w[p + "ffn_conv_base"], 1)
            x = x + f
        hidden = self.rms(x, w["output_norm.weight"])
        return hidden, hidden @ self.head.T

    def selector(self, anchor: int, hidden: np.ndarray, logits: np.ndarray):
        """Per drafted position i (1..n-1): the top-k candidate set and a function
        score(pred_token, cand_token)."""
        w = self.w
        out = []
        for i in range(1, len(logits)):
            cand = np.argsort(-logits[i])[: self.top_k]
            h = w["selector_hidden.weight"] @ hidden[i]
            out.append((set(int(c) for c in cand), logits[i], h))
        pred, succ = w["selector_predecessor.weight"], w["selector_successor.weight"]

        def score(i: int, p_tok: int, c_tok: int) -> float:
            _, lg, h = out[i]
            return float(lg[c_tok] + np.sum(pred[p_tok] * h * succ[c_tok]))

        return [o[0] for o in out], score
