// C entry points of the draft-verify engine: thin, never-aborting wrappers of pdf2::SpecEngine.
#include "capture/capture_handle.h"
#include "drafter/drafter_handle.h"
#include "common/errors.h"
#include "engine/spec_engine.h"

#include "pydflash2.h"

#include <memory>
#include <string>

struct pdf2_engine {
    std::unique_ptr<pdf2::SpecEngine> impl;
};

namespace {

pdf2::SpecEngine & get(pdf2_engine * e) { return pdf2::handle_impl(e, "engine"); }

}  // namespace

extern "C" pdf2_engine * pdf2_engine_new(void * target_ctx, pdf2_drafter * drafter, int32_t n_max, int32_t walk,
                                         int32_t q_top_k) {
    return pdf2_engine_new_capture(target_ctx, nullptr, drafter, n_max, walk, q_top_k);
}

extern "C" pdf2_engine * pdf2_engine_new_capture(void * target_ctx, pdf2_capture * capture, pdf2_drafter * drafter,
                                                 int32_t n_max, int32_t walk, int32_t q_top_k) {
    return pdf2::guarded<pdf2_engine *>(nullptr, [&] {
        pdf2::check_walk_options(walk, q_top_k);
        pdf2::EngineOptions opts;
        opts.n_max = n_max;
        opts.walk = walk;
        opts.q_top_k = q_top_k;
        pdf2::Drafter * d = drafter != nullptr ? drafter->impl.get() : nullptr;
        auto e = std::make_unique<pdf2_engine>();
        e->impl = std::make_unique<pdf2::SpecEngine>(static_cast<llama_context *>(target_ctx), d, opts,
                                                     capture != nullptr ? capture_impl(capture) : nullptr);
        return e.release();
    });
}

extern "C" void pdf2_engine_free(pdf2_engine * e) { delete e; }

extern "C" int pdf2_engine_set_head_capture(pdf2_engine * e, struct pdf2_capture * capture) {
    return pdf2::guarded<int>(-1, [&] {
        get(e).set_head_capture(capture != nullptr ? capture_impl(capture) : nullptr);
        return 0;
    });
}

extern "C" int pdf2_engine_release_target(pdf2_engine * e) {
    return pdf2::guarded<int>(-1, [&] {
        get(e).release_target();
        return 0;
    });
}

extern "C" int32_t pdf2_engine_max_draft(pdf2_engine * e) {
    return pdf2::guarded<int32_t>(-1, [&] { return static_cast<int32_t>(get(e).max_draft()); });
}

extern "C" int pdf2_engine_cap_draft(pdf2_engine * e, int32_t max_draft) {
    return pdf2::guarded<int>(-1, [&] {
        get(e).cap_draft(max_draft);
        return 0;
    });
}

extern "C" int pdf2_engine_set_costs(pdf2_engine * e, const double * verify_s, int32_t n_verify,
                                     const double * draft_s, int32_t n_draft) {
    return pdf2::guarded<int>(-1, [&] {
        if (verify_s == nullptr || n_verify < 1 || (n_draft > 0 && draft_s == nullptr)) {
            throw pdf2::Error("costs: verify_s needs at least one entry");
        }
        get(e).set_costs(std::vector<double>(verify_s, verify_s + n_verify),
                         std::vector<double>(draft_s, draft_s + std::max(0, n_draft)));
        return 0;
    });
}

extern "C" int pdf2_engine_measure_costs(pdf2_engine * e, int32_t reps, double * verify_s, int32_t n_verify,
                                         double * draft_s, int32_t n_draft) {
    return pdf2::guarded<int>(-1, [&] {
        pdf2::SpecEngine & eng = get(e);
        if (n_verify != eng.max_draft() + 1 || n_draft != eng.max_draft()) {
            throw pdf2::Error("costs arrays must hold max_draft+1 and max_draft entries");
        }
        std::vector<double> v, d;
        eng.measure_costs(reps, v, d);
        std::copy(v.begin(), v.end(), verify_s);
        std::copy(d.begin(), d.end(), draft_s);
        return 0;
    });
}

extern "C" int32_t pdf2_engine_begin(pdf2_engine * e, const int32_t * prompt, int32_t n_prompt, float temperature,
                                     int32_t top_k, float top_p, float min_p, uint64_t seed) {
    return pdf2::guarded<int32_t>(-1, [&] {
        if (prompt == nullptr || n_prompt < 0) {
            throw pdf2::Error("prompt is NULL");
        }
        const pdf2::SamplingParams sp{temperature, top_k, top_p, min_p, /*typical_p=*/1.0f, seed};
        return static_cast<int32_t>(get(e).begin(std::vector<llama_token>(prompt, prompt + n_prompt), sp));
    });
}

extern "C" int32_t pdf2_engine_step(pdf2_engine * e, int32_t * out, int32_t max_out, int32_t max_new) {
    return pdf2::guarded<int32_t>(-1, [&] {
        pdf2::SpecEngine & eng = get(e);
        if (out == nullptr || max_out < eng.max_draft() + 1) {
            throw pdf2::Error("step output buffer must hold max_draft+1 tokens");
        }
        std::vector<llama_token> toks;
        const int n = eng.step(toks, max_new);
        std::copy(toks.begin(), toks.end(), out);
        return static_cast<int32_t>(n);
    });
}

extern "C" char * pdf2_engine_stats_json(pdf2_engine * e) {
    return pdf2::guarded<char *>(nullptr, [&] { return pdf2::dup_string(get(e).stats_json()); });
}
