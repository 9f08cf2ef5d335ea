"""The DFlash2 drafter in PyTorch, exactly as docs/dflash2.md section 1 defines it
(and as our ggml graph and upstream llama.cpp run it), with parameter names
that are the published Hugging Face names, so `state_dict()` is the checkpoint.

Frozen, not trained: the target's token embedding and output head (dequantised
from the target GGUF). Trained: fc, the norms, the layers with their local
convolutions, and the candidate selector.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DrafterConfig:
    n_embd: int
    n_vocab: int
    target_layer_ids: list[int]
    mask_token_id: int
    n_layer: int = 1
    n_head: int = 8
    n_head_kv: int = 4
    head_dim: int = 64
    n_ff: int = 1536
    block_size: int = 8
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    version: int = 2  # 1: DFlash (no conv, no selector)
    conv_kernel_size: int = 2
    conv_group_size: int = 64
    selector_rank: int = 32
    selector_top_k: int = 16
    # target token ids of the draft vocabulary rows (empty: the full vocabulary)
    draft_ids: list[int] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def n_draft(self) -> int:
        return len(self.draft_ids) or self.n_vocab


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """NEOX rotary embedding (halves rotated), x [..., n, heads, D], pos [..., n]."""
    D = x.shape[-1]
    half = D // 2
    inv = theta ** (-torch.arange(half, dtype=torch.float32, device=x.device) * 2.0 / D)
    ang = pos.to(torch.float32)[..., None] * inv  # [..., n, half]
    cos, sin = ang.cos()[..., None, :], ang.sin()[..., None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class LocalConv(nn.Module):
    """Grouped dynamic causal block-local convolution (DFlash2)."""

    def __init__(self, H: int, K: int, group: int) -> None:
        super().__init__()
        self.K, self.group, self.G = K, group, H // group
        base = torch.zeros(2, K, H)
        base[:, 0, :] = 1.0  # identity at init
        self.base_kernel = nn.Parameter(base)
        self.kernel_projection = nn.Linear(H, 2 * K * self.G, bias=False)
        nn.init.zeros_(self.kernel_projection.weight)

    def coefficients(self, u: torch.Tensor) -> torch.Tensor:
        """dyn [..., n, 2, K, G] from the normed sublayer input u [..., n, H]."""
        return self.kernel_projection(u).unflatten(-1, (2, self.K, self.G))

    def forward(self, x: torch.Tensor, dyn: torch.Tensor, side: int) -> torch.Tensor:
        # x [..., n, H] (n = block positions); taps never reach before the block start
        n = x.shape[-2]
        out = torch.zeros_like(x)
        for t in range(min(self.K, n)):
            coef = self.base_kernel[side, t] + dyn[..., t:, side, t, :].repeat_interleave(self.group, dim=-1)
            out[..., t:, :] = out[..., t:, :] + coef * x[..., : n - t, :]
        return out


class Attention(nn.Module):
    def __init__(self, c: DrafterConfig) -> None:
        super().__init__()
        H, D = c.n_embd, c.head_dim
        self.c = c
        self.q_proj = nn.Linear(H, c.n_head * D, bias=False)
        self.k_proj = nn.Linear(H, c.n_head_kv * D, bias=False)
        self.v_proj = nn.Linear(H, c.n_head_kv * D, bias=False)
        self.o_proj = nn.Linear(c.n_head * D, H, bias=False)
        self.q_norm = RMSNorm(D, c.rms_eps)
        self.k_norm = RMSNorm(D, c.rms_eps)

    def context_kv(self, ctx: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V rows of the context features ctx [B, Lc, H] at positions pos [B, Lc]."""
        c = self.c
        k = self.k_norm(self.k_proj(ctx).unflatten(-1, (c.n_head_kv, c.head_dim)))
        return rope(k, pos, c.rope_theta), self.v_proj(ctx).unflatten(-1, (c.n_head_kv, c.head_dim))

    def forward(self, a: torch.Tensor, pos: torch.Tensor, ctx_k: torch.Tensor, ctx_v: torch.Tensor,
                mask: torch.Tensor) -> torch.Tensor:
        """a [B, A, n, H] block rows at positions pos [B, A, n]; mask [B, A*n, Lc + A*n] (True = attend)."""
        c = self.c
        B, A, n, _ = a.shape
        q = rope(self.q_norm(self.q_proj(a).unflatten(-1, (c.n_head, c.head_dim))), pos, c.rope_theta)
        k = rope(self.k_norm(self.k_proj(a).unflatten(-1, (c.n_head_kv, c.head_dim))), pos, c.rope_theta)
        v = self.v_proj(a).unflatten(-1, (c.n_head_kv, c.head_dim))
        q = q.reshape(B, A * n, c.n_head, c.head_dim).transpose(1, 2)
        k = torch.cat([ctx_k, k.reshape(B, A * n, c.n_head_kv, c.head_dim)], 1).transpose(1, 2)
        v = torch.cat([ctx_v, v.reshape(B, A * n, c.n_head_kv, c.head_dim)], 1).transpose(1, 2)
        rep = c.n_head // c.n_head_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None])  # not causal: the mask says it all
        return self.o_proj(o.transpose(1, 2).reshape(B, A, n, c.n_head * c.head_dim))


class MLP(nn.Module):
    def __init__(self, H: int, F_: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(H, F_, bias=False)
        self.up_proj = nn.Linear(H, F_, bias=False)
        self.down_proj = nn.Linear(F_, H, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.n_embd, c.rms_eps)
        self.post_attention_layernorm = RMSNorm(c.n_embd, c.rms_eps)
        self.self_attn = Attention(c)
        self.mlp = MLP(c.n_embd, c.n_ff)
        self.v2 = c.version == 2
        if self.v2:
            self.attention_conv = LocalConv(c.n_embd, c.conv_kernel_size, c.conv_group_size)
            self.mlp_conv = LocalConv(c.n_embd, c.conv_kernel_size, c.conv_group_size)

    def forward(self, x, pos, ctx_k, ctx_v, mask):  # noqa: ANN001, ANN201
        u = self.input_layernorm(x)
        if self.v2:
            dyn = self.attention_conv.coefficients(u)
            h = self.self_attn(self.attention_conv(u, dyn, 0), pos, ctx_k, ctx_v, mask)
            h = self.attention_conv(h, dyn, 1)
        else:
            h = self.self_attn(u, pos, ctx_k, ctx_v, mask)
        x = x + h
        u = self.post_attention_layernorm(x)
        if self.v2:
            dyn = self.mlp_conv.coefficients(u)
            f = self.mlp_conv(self.mlp(self.mlp_conv(u, dyn, 0)), dyn, 1)
        else:
            f = self.mlp(u)
        return x + f


class CandidateSelector(nn.Module):
    """score_i(p, c) = unary_i[c] + sum_r Pred[p, r] * h_i[r] * Succ[c, r]."""

    def __init__(self, c: DrafterConfig) -> None:
        super().__init__()
        self.hidden_projection = nn.Linear(c.n_embd, c.selector_rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.randn(c.n_vocab, c.selector_rank) * 0.02)
        self.successor_codebook = nn.Parameter(torch.randn(c.n_vocab, c.selector_rank) * 0.02)

    def scores(self, unary: torch.Tensor, cand: torch.Tensor, hidden: torch.Tensor, pred: torch.Tensor):  # noqa: ANN201
        """unary/cand [..., k] (target ids), hidden [..., H], pred [...] predecessor ids -> [..., k]."""
        h = self.hidden_projection(hidden)  # [..., R]
        pv = self.predecessor_codebook[pred] * h  # [..., R]
        sv = self.successor_codebook[cand]  # [..., k, R]
        return unary + (sv * pv[..., None, :]).sum(-1)


class DFlash2Drafter(nn.Module):
    def __init__(self, c: DrafterConfig, embed: np.ndarray | torch.Tensor, head: np.ndarray | torch.Tensor) -> None:
        super().__init__()
        self.config = c
        n_tl = len(c.target_layer_ids)
        self.fc = nn.Linear(n_tl * c.n_embd, c.n_embd, bias=False)
        self.hidden_norm = RMSNorm(c.n_embd, c.rms_eps)
        self.layers = nn.ModuleList([Layer(c) for _ in range(c.n_layer)])
        self.norm = RMSNorm(c.n_embd, c.rms_eps)
        if c.version == 2:
            self.candidate_selector = CandidateSelector(c)
        # frozen target tables: buffers, not parameters, and not in the checkpoint
        draft_ids = np.asarray(c.draft_ids or range(c.n_vocab), dtype=np.int64)
        if isinstance(head, torch.Tensor):  # meta tables: a shape-only model (the dry run's count)
            emb_t, rows = embed, head.index_select(0, torch.from_numpy(draft_ids).to(head.device))
        else:
            emb_t = torch.from_numpy(np.array(embed, dtype=np.float32))
            rows = torch.from_numpy(np.array(head[draft_ids], dtype=np.float32))
        self.register_buffer("embed", emb_t, persistent=False)
        self.register_buffer("draft_ids", torch.from_numpy(draft_ids), persistent=False)
        self.register_buffer("head_rows", rows, persistent=False)
        t2d = np.full(c.n_vocab, -100, dtype=np.int64)  # -100: outside the draft vocabulary
        t2d[draft_ids] = np.arange(len(draft_ids))
        self.register_buffer("t2d", torch.from_numpy(t2d), persistent=False)
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if name.endswith("kernel_projection.weight") or "codebook" in name or "norm" in name:
                continue
            if name.endswith("base_kernel"):
                continue
            if p.ndim == 2:
                std = 0.02
                if name.endswith(("o_proj.weight", "down_proj.weight")):
                    std = 0.02 / math.sqrt(2 * max(1, self.config.n_layer))
                nn.init.normal_(p, std=std)

    def forward(self, feats: torch.Tensor, ctx_valid: torch.Tensor, anchor_pos: torch.Tensor,
                anchor_tok: torch.Tensor, n: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """feats [B, Lc, n_tl*H] (row j = position j), ctx_valid [B, Lc], anchor_pos/anchor_tok [B, A].

        Block a of sequence b is [anchor, MASK...] at positions p..p+n-1 and attends to
        the context rows j < p of its sequence plus its own n rows. Returns
        (hidden [B, A, n, H] after the final norm, logits [B, A, n, V_draft])."""
        c = self.config
        n = n or c.block_size
        B, Lc, _ = feats.shape
        A = anchor_pos.shape[1]
        ctx = self.hidden_norm(self.fc(feats))
        ctx_pos = torch.arange(Lc, device=feats.device).expand(B, Lc)
        pos = anchor_pos[..., None] + torch.arange(n, device=feats.device)  # [B, A, n]
        tok = torch.full((B, A, n), c.mask_token_id, dtype=torch.long, device=feats.device)
        tok[..., 0] = anchor_tok
        x = self.embed[tok]
        # [B, A*n, Lc + A*n]: context strictly before the anchor, plus the own block
        see_ctx = (ctx_pos[:, None, :] < anchor_pos[..., None]) & ctx_valid[:, None, :]  # [B, A, Lc]
        see_ctx = see_ctx[:, :, None, :].expand(B, A, n, Lc).reshape(B, A * n, Lc)
        blk = torch.arange(A, device=feats.device).repeat_interleave(n)
        see_blk = (blk[:, None] == blk[None, :]).expand(B, A * n, A * n)
        mask = torch.cat([see_ctx, see_blk], dim=-1)
        for layer in self.layers:
            ck, cv = layer.self_attn.context_kv(ctx, ctx_pos)
            x = layer(x, pos, ck, cv, mask)
        hidden = self.norm(x)
        return hidden, hidden @ self.head_rows.T
