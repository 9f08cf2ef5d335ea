#include "drafter/drafter_graph.h"

#include "drafter/drafter_cache.h"
#include "drafter/drafter_model.h"
#include "common/errors.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace pdf2 {

DrafterGraph::~DrafterGraph() {
    if (ctx) ggml_free(ctx);
}

size_t drafter_graph_size(const DrafterModel & model) {
    const DrafterHParams & hp = model.hparams();
    // per layer: attention + MLP (< 128 nodes), the rows a propose graph may
    // inject first (< 32) and, for DFlash2, 4 block convolutions of up to 12 nodes per tap
    const size_t taps = std::min(hp.conv_kernel_size, hp.block_size);
    return 1024 + static_cast<size_t>(hp.n_layer) * (288 + 64 * taps);
}

size_t drafter_graph_ctx_bytes(const DrafterModel & model) {
    const size_t n_nodes = drafter_graph_size(model);
    return ggml_tensor_overhead() * n_nodes * 2 + ggml_graph_overhead_custom(n_nodes, false);
}

namespace {

// Shared state and small helpers of one graph build.
class Builder {
  public:
    Builder(const DrafterModel & model, const DrafterCache & cache, DrafterGraph & g, void * mem)
        : m_(model), hp_(model.hparams()), cache_(cache), g_(g) {
        ggml_init_params ip = {drafter_graph_ctx_bytes(model), mem, /*no_alloc =*/true};
        g.ctx = ggml_init(ip);
        if (g.ctx == nullptr) {
            throw Error("ggml_init failed for a drafter graph");
        }
        g.gf = ggml_new_graph_custom(g.ctx, drafter_graph_size(model), false);
        ctx0_ = g.ctx;
        for (uint32_t il = 0; il < hp_.n_layer; ++il) {
            k_dst_.push_back(cache.k(il));
            v_dst_.push_back(cache.v(il));
        }
    }

    void build_inject(int n);
    void build_propose(int n, int n_kv, int n_inject);

  private:
    ggml_tensor * input(ggml_type type, int64_t ne0, int64_t ne1, const char * name) {
        ggml_tensor * t = ne1 > 0 ? ggml_new_tensor_2d(ctx0_, type, ne0, ne1) : ggml_new_tensor_1d(ctx0_, type, ne0);
        ggml_set_name(t, name);
        ggml_set_input(t);
        return t;
    }

    void cb(ggml_tensor * t, const char * name, int il) {
        if (il >= 0) {
            ggml_format_name(t, "%s-%d", name, il);
        } else {
            ggml_set_name(t, name);
        }
    }

    ggml_tensor * rms_norm(ggml_tensor * x, ggml_tensor * w) {
        return ggml_mul(ctx0_, ggml_rms_norm(ctx0_, x, hp_.rms_eps), w);
    }

    ggml_tensor * rope(ggml_tensor * x) { return rope_at(x, g_.pos); }
    ggml_tensor * rope_at(ggml_tensor * x, ggml_tensor * pos) {
        return ggml_rope_ext(ctx0_, x, pos, nullptr, static_cast<int>(hp_.head_dim), GGML_ROPE_TYPE_NEOX,
                             static_cast<int>(hp_.n_ctx_train), hp_.rope_freq_base, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    }

    bool layer_is_swa(uint32_t il) const {
        return hp_.sliding_window > 0 && (hp_.sliding_window_pattern.empty() || hp_.sliding_window_pattern[il]);
    }

    // K/V rows of context features written into the cache: per layer the set_rows results
    // (views of the updated cache tensors) in k_dst_/v_dst_
    void inject_rows(ggml_tensor * features, ggml_tensor * pos, ggml_tensor * rows, int n);
    ggml_tensor * block_conv(ggml_tensor * x, ggml_tensor * dyn, ggml_tensor * base, int side, int il,
                             const char * name);
    ggml_tensor * attention(const DrafterLayer & L, ggml_tensor * a, uint32_t il);
    ggml_tensor * ffn(const DrafterLayer & L, ggml_tensor * m, uint32_t il);
    ggml_tensor * head(ggml_tensor * hidden);
    ggml_tensor * selector(ggml_tensor * logits, ggml_tensor * hidden);

    const DrafterModel & m_;
    const DrafterHParams & hp_;
    const DrafterCache & cache_;
    DrafterGraph & g_;
    ggml_context * ctx0_ = nullptr;
    std::vector<ggml_tensor *> k_dst_, v_dst_;  // per layer: the cache as the block's rows are written into it
};

// ---------------------------------------------------------------- inject

void Builder::build_inject(int n) {
    const int64_t H = hp_.n_embd;
    const int64_t n_inp = static_cast<int64_t>(hp_.target_layers.size()) * H;
    g_.n_tokens = n;
    g_.features = input(GGML_TYPE_F32, n_inp, n, "inp_target_features");
    g_.pos = input(GGML_TYPE_I32, n, 0, "inp_pos");
    g_.rows = input(GGML_TYPE_I64, n, 0, "inp_cache_rows");
    inject_rows(g_.features, g_.pos, g_.rows, n);
    for (uint32_t il = 0; il < hp_.n_layer; ++il) {
        ggml_build_forward_expand(g_.gf, k_dst_[il]);
        ggml_build_forward_expand(g_.gf, v_dst_[il]);
    }
}

void Builder::inject_rows(ggml_tensor * features, ggml_tensor * pos, ggml_tensor * rows, int n) {
    ggml_tensor * ctxh = ggml_mul_mat(ctx0_, m_.fc, features);
    cb(ctxh, "fc_out", -1);
    ctxh = rms_norm(ctxh, m_.enc_norm);
    cb(ctxh, "ctx_hidden", -1);

    const int64_t D = hp_.head_dim;
    const int64_t Hkv = hp_.n_head_kv;
    for (uint32_t il = 0; il < hp_.n_layer; ++il) {
        const DrafterLayer & L = m_.layers[il];
        ggml_tensor * k = ggml_reshape_3d(ctx0_, ggml_mul_mat(ctx0_, L.wk, ctxh), D, Hkv, n);
        k = rms_norm(k, L.k_norm);
        k = rope_at(k, pos);
        cb(k, "Kctx", il);
        ggml_tensor * v = ggml_mul_mat(ctx0_, L.wv, ctxh);
        cb(v, "Vctx", il);
        ggml_tensor * ks = ggml_set_rows(ctx0_, k_dst_[il], ggml_reshape_2d(ctx0_, k, D * Hkv, n), rows);
        ggml_tensor * vs = ggml_set_rows(ctx0_, v_dst_[il], v, rows);
        cb(ks, "Kctx_store", il);
        cb(vs, "Vctx_store", il);
        k_dst_[il] = ks;
        v_dst_[il] = vs;
    }
}

// ---------------------------------------------------------------- propose

// DFlash2 grouped dynamic block-local causal convolution, one side:
// out[i, c] = sum_{t < K} (base[side, t, c] + dyn[i, side, t, c / gs]) * x[i - t, c], x[<0] = 0.
ggml_tensor * Builder::block_conv(ggml_tensor * x, ggml_tensor * dyn, ggml_tensor * base, int side, int il,
                                  const char * name) {
    const int64_t H = hp_.n_embd;
    const int64_t n = x->ne[1];
    const int64_t K = hp_.conv_kernel_size;
    const int64_t gs = hp_.conv_group_size;
    const int64_t G = H / gs;
    const int64_t n_taps = std::min<int64_t>(K, n);  // taps reaching before the block add nothing

    ggml_tensor * acc = nullptr;
    for (int64_t t = 0; t < n_taps; ++t) {
        const int64_t slot = side * K + t;  // dyn/base are [2][K][..] side-major
        // per-token group coefficients of this tap, broadcast over each group's channels
        ggml_tensor * coeff = ggml_cont(ctx0_, ggml_view_2d(ctx0_, dyn, G, n, dyn->nb[1], slot * G * dyn->nb[0]));
        coeff = ggml_repeat_4d(ctx0_, ggml_reshape_3d(ctx0_, coeff, 1, G, n), gs, G, n, 1);
        ggml_tensor * base_t = ggml_view_3d(ctx0_, base, gs, G, 1, gs * base->nb[0], H * base->nb[0],
                                            slot * H * base->nb[0]);
        ggml_tensor * w = ggml_add(ctx0_, coeff, base_t);  // [gs, G, n]

        ggml_tensor * xs = x;
        if (t > 0) {
            // x shifted down t rows inside the block, zeros entering at the top
            xs = ggml_pad_ext(ctx0_, ggml_view_2d(ctx0_, x, H, n - t, x->nb[1], 0), 0, 0, static_cast<int>(t), 0,
                              0, 0, 0, 0);
        }
        ggml_tensor * term = ggml_mul(ctx0_, ggml_reshape_3d(ctx0_, xs, gs, G, n), w);
        acc = acc ? ggml_add(ctx0_, acc, term) : term;
    }
    acc = ggml_reshape_2d(ctx0_, acc, H, n);
    cb(acc, name, il);
    return acc;
}

ggml_tensor * Builder::attention(const DrafterLayer & L, ggml_tensor * a, uint32_t il) {
    const int64_t D = hp_.head_dim;
    const int64_t Hq = hp_.n_head;
    const int64_t Hkv = hp_.n_head_kv;
    const int64_t n = a->ne[1];
    const int64_t n_kv = g_.n_kv;

    ggml_tensor * q = ggml_reshape_3d(ctx0_, ggml_mul_mat(ctx0_, L.wq, a), D, Hq, n);
    ggml_tensor * k = ggml_reshape_3d(ctx0_, ggml_mul_mat(ctx0_, L.wk, a), D, Hkv, n);
    ggml_tensor * v = ggml_mul_mat(ctx0_, L.wv, a);
    q = rope(rms_norm(q, L.q_norm));
    k = rope(rms_norm(k, L.k_norm));
    cb(q, "Qcur", il);
    cb(k, "Kcur", il);
    cb(v, "Vcur", il);

    // the block's rows go to the scratch rows after the context; the attention
    // reads [context; block] through views of the updated cache tensors
    ggml_tensor * ks = ggml_set_rows(ctx0_, k_dst_[il], ggml_reshape_2d(ctx0_, k, D * Hkv, n), g_.rows);
    ggml_tensor * vs = ggml_set_rows(ctx0_, v_dst_[il], v, g_.rows);
    cb(ks, "Kblk_store", il);
    cb(vs, "Vblk_store", il);
    const size_t es = ggml_element_size(ks);
    ggml_tensor * kk = ggml_view_3d(ctx0_, ks, D, n_kv, Hkv, ks->nb[1], D * es, 0);
    ggml_tensor * vv = ggml_view_3d(ctx0_, vs, D, n_kv, Hkv, vs->nb[1], D * es, 0);
    cb(kk, "K_all", il);
    cb(vv, "V_all", il);

    ggml_tensor * qp = ggml_permute(ctx0_, q, 0, 2, 1, 3);  // [D, n, Hq]
    ggml_tensor * mask = layer_is_swa(il) ? g_.mask_swa : g_.mask;
    ggml_tensor * o = ggml_flash_attn_ext(ctx0_, qp, kk, vv, mask, 1.0f / std::sqrt(static_cast<float>(D)), 0.0f,
                                          0.0f);  // [D, Hq, n]
    o = ggml_reshape_2d(ctx0_, o, D * Hq, n);
    cb(o, "attn_heads", il);
    o = ggml_mul_mat(ctx0_, L.wo, o);
    cb(o, "attn_out", il);
    return o;
}

ggml_tensor * Builder::ffn(const DrafterLayer & L, ggml_tensor * m, uint32_t il) {
    ggml_tensor * gate = ggml_mul_mat(ctx0_, L.ffn_gate, m);
    ggml_tensor * up = ggml_mul_mat(ctx0_, L.ffn_up, m);
    ggml_tensor * act = ggml_mul(ctx0_, ggml_silu(ctx0_, gate), up);
    cb(act, "ffn_act", il);
    ggml_tensor * out = ggml_mul_mat(ctx0_, L.ffn_down, act);
    cb(out, "ffn_out", il);
    return out;
}

// target head on the drafted rows; DFlash2 applies logit_scale and softcap in
// the graph (upstream does so only for DFlash2, whose selector reads them)
ggml_tensor * Builder::head(ggml_tensor * hidden) {
    ggml_tensor * cur = ggml_mul_mat(ctx0_, m_.output, hidden);
    if (m_.is_v2()) {
        if (hp_.logit_scale != 0.0f) {
            cur = ggml_scale(ctx0_, cur, hp_.logit_scale);
        }
        if (hp_.logit_softcap > 0.0f) {
            cur = ggml_scale(ctx0_, cur, 1.0f / hp_.logit_softcap);
            cur = ggml_tanh(ctx0_, cur);
            cur = ggml_scale(ctx0_, cur, hp_.logit_softcap);
        }
    }
    if (m_.d2t != nullptr && !m_.is_v2()) {
        // reduced draft vocabulary: d2t holds the target row of every draft row. DFlash1 hands
        // out full-vocabulary logits; DFlash2's selector ranks the draft rows and maps its
        // candidates to target ids itself (no -inf fill of the other 40k+ rows)
        const int64_t Vd = cur->ne[0];
        const int64_t P = cur->ne[1];
        const int64_t V = hp_.n_vocab;
        ggml_tensor * full = ggml_fill(ctx0_, ggml_new_tensor_3d(ctx0_, GGML_TYPE_F32, 1, V, P), -INFINITY);
        cur = ggml_set_rows(ctx0_, full, ggml_reshape_3d(ctx0_, cur, 1, Vd, P), ggml_reshape_3d(ctx0_, m_.d2t, Vd, 1, 1));
        cur = ggml_reshape_2d(ctx0_, cur, V, P);
    }
    cb(cur, "logits", -1);
    return cur;
}

// lattice of the drafted positions 1..n-1 (P of them):
// score_i(p, c) = unary_i[c] + sum_r Pred[p, r] * h_i[r] * Succ[cand_i[c], r]
ggml_tensor * Builder::selector(ggml_tensor * logits, ggml_tensor * hidden) {
    const int64_t k = hp_.selector_top_k;
    const int64_t R = hp_.selector_rank;
    const int64_t V = logits->ne[0];
    const int64_t P = logits->ne[1];

    ggml_tensor * top = ggml_top_k(ctx0_, logits, static_cast<int>(k));  // I32 [k, P]: rows of logits
    cb(top, "sel_top_rows", -1);
    ggml_tensor * unary = ggml_reshape_2d(ctx0_, ggml_get_rows(ctx0_, ggml_reshape_3d(ctx0_, logits, 1, V, P), top), k, P);
    cb(unary, "sel_unary", -1);
    ggml_tensor * cand = top;  // target token ids
    if (m_.d2t_ids != nullptr) {
        // the logits cover the draft vocabulary: its rows -> target ids
        cand = ggml_reshape_2d(ctx0_, ggml_get_rows(ctx0_, m_.d2t_ids, ggml_reshape_1d(ctx0_, top, k * P)), k, P);
    }
    cb(cand, "sel_candidates", -1);
    ggml_tensor * h = ggml_mul_mat(ctx0_, m_.sel_hidden, hidden);  // [R, P]
    cb(h, "sel_hidden_proj", -1);

    ggml_tensor * succ = ggml_reshape_3d(ctx0_, ggml_get_rows(ctx0_, m_.sel_succ, ggml_reshape_1d(ctx0_, cand, k * P)),
                                         R, k, P);
    cb(succ, "sel_succ", -1);

    // predecessors: the anchor for position 1, the previous position's candidates after
    ggml_tensor * anchor = ggml_view_1d(ctx0_, g_.tokens, 1, 0);
    ggml_tensor * pred = ggml_repeat_4d(ctx0_, ggml_get_rows(ctx0_, m_.sel_pred, anchor), R, k, 1, 1);
    if (P > 1) {
        ggml_tensor * prev_ids = ggml_cont(ctx0_, ggml_view_2d(ctx0_, cand, k, P - 1, cand->nb[1], 0));
        ggml_tensor * pred_c =
            ggml_reshape_3d(ctx0_, ggml_get_rows(ctx0_, m_.sel_pred, ggml_reshape_1d(ctx0_, prev_ids, k * (P - 1))), R,
                            k, P - 1);
        pred = ggml_concat(ctx0_, pred, pred_c, 2);
    }
    cb(pred, "sel_pred", -1);
    ggml_tensor * cond = ggml_mul(ctx0_, pred, ggml_reshape_3d(ctx0_, h, R, 1, P));  // [R, k(pred), P]
    ggml_tensor * score = ggml_mul_mat(ctx0_, succ, cond);                            // [k(cand), k(pred), P]
    score = ggml_add(ctx0_, score, ggml_reshape_3d(ctx0_, unary, k, 1, P));
    cb(score, "sel_scores", -1);

    ggml_tensor * packed = ggml_concat(ctx0_, ggml_cast(ctx0_, cand, GGML_TYPE_F32),
                                       ggml_reshape_2d(ctx0_, score, k * k, P), 0);
    cb(packed, "dflash2_lattice", -1);
    return packed;
}

void Builder::build_propose(int n, int n_kv, int n_inject) {
    const int64_t H = hp_.n_embd;
    g_.n_tokens = n;
    g_.n_kv = n_kv;
    if (n_inject > 0) {
        // the committed rows first: their K/V rows land in the cache before the block attends to it
        const int64_t n_inp = static_cast<int64_t>(hp_.target_layers.size()) * H;
        g_.n_inject = n_inject;
        g_.inj_features = input(GGML_TYPE_F32, n_inp, n_inject, "inp_target_features");
        g_.inj_pos = input(GGML_TYPE_I32, n_inject, 0, "inp_inject_pos");
        g_.inj_rows = input(GGML_TYPE_I64, n_inject, 0, "inp_inject_rows");
        inject_rows(g_.inj_features, g_.inj_pos, g_.inj_rows, n_inject);
    }
    g_.tokens = input(GGML_TYPE_I32, n, 0, "inp_tokens");
    g_.pos = input(GGML_TYPE_I32, n, 0, "inp_pos");
    g_.rows = input(GGML_TYPE_I64, n, 0, "inp_cache_rows");
    g_.mask = input(GGML_TYPE_F16, n_kv, n, "inp_kq_mask");
    bool any_swa = false;
    for (uint32_t il = 0; il < hp_.n_layer; ++il) any_swa = any_swa || layer_is_swa(il);
    if (any_swa) {
        g_.mask_swa = input(GGML_TYPE_F16, n_kv, n, "inp_kq_mask_swa");
    }

    ggml_tensor * x = ggml_get_rows(ctx0_, m_.tok_embd, g_.tokens);
    if (hp_.embedding_scale != 0.0f) {
        x = ggml_scale(ctx0_, x, hp_.embedding_scale);
    }
    cb(x, "inp_block_embd", -1);

    for (uint32_t il = 0; il < hp_.n_layer; ++il) {
        const DrafterLayer & L = m_.layers[il];

        // attention sublayer
        ggml_tensor * u = rms_norm(x, L.attn_norm);
        cb(u, "attn_norm", il);
        ggml_tensor * dyn = nullptr;
        ggml_tensor * a = u;
        if (L.attn_conv_proj) {
            dyn = ggml_mul_mat(ctx0_, L.attn_conv_proj, u);
            cb(dyn, "attn_conv_dyn", il);
            a = block_conv(u, dyn, L.attn_conv_base, 0, il, "attn_conv_in");
        }
        ggml_tensor * h = attention(L, a, il);
        if (dyn) {
            h = block_conv(h, dyn, L.attn_conv_base, 1, il, "attn_conv_out");
        }
        x = ggml_add(ctx0_, x, h);
        cb(x, "ffn_inp", il);

        // MLP sublayer
        u = rms_norm(x, L.ffn_norm);
        cb(u, "ffn_norm", il);
        dyn = nullptr;
        ggml_tensor * mm = u;
        if (L.ffn_conv_proj) {
            dyn = ggml_mul_mat(ctx0_, L.ffn_conv_proj, u);
            cb(dyn, "ffn_conv_dyn", il);
            mm = block_conv(u, dyn, L.ffn_conv_base, 0, il, "ffn_conv_in");
        }
        ggml_tensor * f = ffn(L, mm, il);
        if (dyn) {
            f = block_conv(f, dyn, L.ffn_conv_base, 1, il, "ffn_conv_out");
        }
        x = ggml_add(ctx0_, x, f);
        cb(x, "l_out", il);
    }

    ggml_tensor * hidden = rms_norm(x, m_.out_norm);
    cb(hidden, "result_norm", -1);
    // only the drafted positions 1..n-1 need the head
    hidden = ggml_view_2d(ctx0_, hidden, H, n - 1, hidden->nb[1], hidden->nb[1]);
    cb(hidden, "draft_hidden", -1);
    ggml_tensor * logits = head(hidden);
    g_.out = m_.is_v2() ? selector(logits, hidden) : logits;
    ggml_set_output(g_.out);
    ggml_build_forward_expand(g_.gf, g_.out);
}

}  // namespace

std::unique_ptr<DrafterGraph> build_inject_graph(const DrafterModel & model, const DrafterCache & cache, int n_rows,
                                                 void * mem) {
    auto g = std::make_unique<DrafterGraph>();
    Builder(model, cache, *g, mem).build_inject(n_rows);
    return g;
}

std::unique_ptr<DrafterGraph> build_propose_graph(const DrafterModel & model, const DrafterCache & cache, int n_tokens,
                                                  int n_kv, int n_inject, void * mem) {
    auto g = std::make_unique<DrafterGraph>();
    Builder(model, cache, *g, mem).build_propose(n_tokens, n_kv, n_inject);
    return g;
}

}  // namespace pdf2
