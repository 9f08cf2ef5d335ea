// C entry points of the drafter: thin, never-aborting wrappers of pdf2::Drafter.
#include "drafter/drafter.h"
#include "drafter/drafter_handle.h"
#include "common/errors.h"

#include "pydflash2.h"

#include <algorithm>


namespace {

pdf2::Drafter & get(const pdf2_drafter * d) { return pdf2::handle_impl(d, "drafter"); }

template <typename Fn>
int run(Fn && fn) {
    return pdf2::guarded<int>(-1, [&] {
        fn();
        return 0;
    });
}

}  // namespace

extern "C" pdf2_drafter * pdf2_drafter_new(const char * drafter_path, const char * target_path, uint32_t n_ctx,
                                           int32_t n_threads, const char * device, int32_t cache_f32) {
    return pdf2::guarded<pdf2_drafter *>(nullptr, [&] {
        if (drafter_path == nullptr) {
            throw pdf2::Error("drafter path is NULL");
        }
        pdf2::DrafterOptions opts;
        opts.device = device ? device : "";
        opts.n_threads = n_threads;
        opts.n_ctx = n_ctx;
        opts.cache_type = cache_f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
        auto h = std::make_unique<pdf2_drafter>();
        h->impl = std::make_unique<pdf2::Drafter>(drafter_path, target_path ? target_path : "", opts);
        return h.release();
    });
}

extern "C" pdf2_drafter * pdf2_drafter_new_sharing(const pdf2_drafter * other, uint32_t n_ctx, int32_t cache_f32) {
    return pdf2::guarded<pdf2_drafter *>(nullptr, [&] {
        pdf2::DrafterOptions opts;
        opts.n_ctx = n_ctx;
        opts.cache_type = cache_f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
        auto h = std::make_unique<pdf2_drafter>();
        h->impl = std::make_unique<pdf2::Drafter>(get(other).shared_model(), opts);
        return h.release();
    });
}

extern "C" void pdf2_drafter_free(pdf2_drafter * d) { delete d; }

extern "C" char * pdf2_drafter_hparams_json(const pdf2_drafter * d) {
    return pdf2::guarded<char *>(nullptr, [&] { return pdf2::dup_string(pdf2::hparams_to_json(get(d).hparams())); });
}

extern "C" int pdf2_drafter_set_max_graphs(pdf2_drafter * d, int32_t n) {
    return pdf2::guarded<int>(-1, [&] {
        if (n < 1) {  // before the conversion to size_t would wrap a negative count
            throw pdf2::Error("max graphs must be >= 1, got " + std::to_string(n));
        }
        get(d).set_max_graph_slots(static_cast<size_t>(n));
        return 0;
    });
}

extern "C" int pdf2_drafter_reserve_graphs(pdf2_drafter * d) {
    return pdf2::guarded<int>(-1, [&] {
        get(d).reserve_graph_slots();
        return 0;
    });
}

extern "C" char * pdf2_drafter_info_json(const pdf2_drafter * d) {
    return pdf2::guarded<char *>(nullptr, [&] { return pdf2::dup_string(get(d).info_json()); });
}

extern "C" int32_t pdf2_drafter_n_cached(const pdf2_drafter * d) {
    return pdf2::guarded<int32_t>(-1, [&] { return static_cast<int32_t>(get(d).cache().n_cached()); });
}

extern "C" int32_t pdf2_drafter_last_pos(const pdf2_drafter * d) {
    return pdf2::guarded<int32_t>(-1, [&] { return get(d).cache().last_pos(); });
}

extern "C" int32_t pdf2_drafter_feature_width(const pdf2_drafter * d) {
    return pdf2::guarded<int32_t>(-1, [&] { return static_cast<int32_t>(get(d).feature_width()); });
}

extern "C" int pdf2_drafter_inject(pdf2_drafter * d, const float * features, int64_t width, const int32_t * positions,
                                   int32_t n) {
    return run([&] {
        if (width < 0) throw pdf2::Error("negative feature width");
        get(d).inject(features, static_cast<size_t>(width), positions, n);
    });
}

extern "C" int pdf2_drafter_truncate(pdf2_drafter * d, int32_t pos) {
    return run([&] { get(d).truncate(pos); });
}

extern "C" int pdf2_drafter_propose(pdf2_drafter * d, int32_t anchor, int32_t pos, int32_t n) {
    return run([&] { get(d).propose(anchor, pos, n); });
}

extern "C" int pdf2_drafter_inject_and_propose(pdf2_drafter * d, const float * features, int64_t width,
                                               const int32_t * positions, int32_t m, int32_t anchor, int32_t pos,
                                               int32_t n) {
    return run([&] {
        if (width < 0) throw pdf2::Error("negative feature width");
        if (m < 0) throw pdf2::Error("negative row count");
        get(d).inject_and_propose(features, static_cast<size_t>(width), positions, m, anchor, pos, n);
    });
}

extern "C" int pdf2_drafter_get_lattice(const pdf2_drafter * d, int32_t * candidates, float * scores) {
    return run([&] {
        const pdf2::Drafter & dr = get(d);
        if (dr.hparams().version != 2) throw pdf2::Error("get_lattice: this is a DFlash1 drafter (no selector)");
        const pdf2::Proposal & p = dr.last();
        if (!p.valid()) throw pdf2::Error("get_lattice: no proposal yet");
        if (candidates) std::copy(p.lattice.cand.begin(), p.lattice.cand.end(), candidates);
        if (scores) std::copy(p.lattice.scores.begin(), p.lattice.scores.end(), scores);
    });
}

extern "C" int pdf2_drafter_get_logits(const pdf2_drafter * d, float * logits) {
    return run([&] {
        const pdf2::Drafter & dr = get(d);
        if (dr.hparams().version != 1) throw pdf2::Error("get_logits: this is a DFlash2 drafter (use get_lattice)");
        const pdf2::Proposal & p = dr.last();
        if (!p.valid()) throw pdf2::Error("get_logits: no proposal yet");
        if (logits) std::copy(p.logits.begin(), p.logits.end(), logits);
    });
}

extern "C" int pdf2_drafter_select_path(const pdf2_drafter * d, int32_t selector, float temperature, uint64_t seed,
                                        int32_t top_k, int32_t * tokens, int32_t * q_ids, float * q) {
    return run([&] {
        if (selector < 0 || selector > 2) throw pdf2::Error("selector must be 0 (greedy), 1 (sample) or 2 (viterbi)");
        const pdf2::DraftPath r =
            get(d).select_path(static_cast<pdf2::SelectorMode>(selector), temperature, seed, top_k);
        if (tokens) std::copy(r.tokens.begin(), r.tokens.end(), tokens);
        if (q_ids) std::copy(r.q_ids.begin(), r.q_ids.end(), q_ids);
        if (q) std::copy(r.q.begin(), r.q.end(), q);
    });
}
