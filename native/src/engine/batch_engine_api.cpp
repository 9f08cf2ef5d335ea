// C entry points of the engine: thin, never-aborting wrappers of pdf2::BatchEngine.
#include "engine/batch_engine.h"
#include "capture/capture_handle.h"
#include "drafter/drafter_handle.h"
#include "common/errors.h"

#include "pydflash2.h"

#include <cmath>

#include <algorithm>
#include <memory>
#include <string>

struct pdf2_batch_engine {
    std::unique_ptr<pdf2::BatchEngine> impl;
};

namespace {

pdf2::BatchEngine & get(pdf2_batch_engine * e) { return pdf2::handle_impl(e, "batch engine"); }

// The C ABI's encoding of the drafting options, decoded once: n_max -1 = adaptive, 0 = plain,
// > 0 = that many (the drafter's block caps it); max_draft < 0 = no cap; selector -1 = auto;
// tree_budget < 0 = automatic, at most -tree_budget nodes.
void set_draft_options(pdf2::BatchEngineOptions & opts, int32_t n_max, int32_t max_draft, int32_t selector,
                       int32_t q_top_k, int32_t tree_budget, int32_t context_nodes) {
    pdf2::check_selector_options(selector, q_top_k);
    if (n_max < -1) {
        throw pdf2::Error("n_max must be >= 0, or -1 for adaptive");
    }
    opts.draft_length = n_max < 0 ? pdf2::DraftLength::Adaptive
                        : n_max == 0 ? pdf2::DraftLength::Plain
                                     : pdf2::DraftLength::Fixed;
    opts.n_max = std::max(0, n_max);
    if (max_draft >= 0) opts.max_draft = max_draft;
    if (selector >= 0) opts.selector = static_cast<pdf2::SelectorMode>(selector);
    opts.q_top_k = q_top_k;
    opts.tree_budget = tree_budget < 0 ? -tree_budget : tree_budget;
    opts.tree_auto = tree_budget < 0;
    opts.context_nodes = context_nodes;  // the engine checks its range
}

}  // namespace

extern "C" pdf2_batch_engine * pdf2_batch_engine_new(void * target_model, int32_t n_slots, int32_t n_ctx_slot,
                                                     int32_t n_threads, int32_t n_threads_batch, int32_t flash_attn,
                                                     pdf2_drafter ** drafters,
                                                     int32_t n_drafters, int32_t n_max, int32_t max_draft,
                                                     int32_t selector, int32_t q_top_k, int32_t tree_budget,
                                                     int32_t context_nodes) {
    return pdf2::guarded<pdf2_batch_engine *>(nullptr, [&] {
        if (flash_attn < -1 || flash_attn > 1) {
            throw pdf2::Error("flash_attn must be -1 (auto), 0 (off) or 1 (on)");
        }
        if (n_drafters < 0 || (n_drafters > 0 && drafters == nullptr)) {
            throw pdf2::Error("drafters is NULL");
        }
        std::vector<pdf2::Drafter *> ds;
        for (int32_t i = 0; i < n_drafters; ++i) {
            ds.push_back(drafters[i] != nullptr ? drafters[i]->impl.get() : nullptr);
        }
        pdf2::BatchEngineOptions opts;
        opts.n_slots = n_slots;
        opts.n_ctx_slot = n_ctx_slot;
        opts.n_threads = n_threads;
        opts.n_threads_batch = n_threads_batch;
        opts.flash_attn = flash_attn;
        set_draft_options(opts, n_max, max_draft, selector, q_top_k, tree_budget, context_nodes);
        auto e = std::make_unique<pdf2_batch_engine>();
        e->impl = std::make_unique<pdf2::BatchEngine>(static_cast<llama_model *>(target_model), ds, opts);
        return e.release();
    });
}

extern "C" pdf2_batch_engine * pdf2_batch_engine_new_borrowed(void * target_ctx, pdf2_capture * feature_capture,
                                                              pdf2_capture * head_capture, pdf2_drafter * drafter,
                                                              int32_t n_max, int32_t max_draft, int32_t selector,
                                                              int32_t q_top_k, int32_t tree_budget,
                                                              int32_t context_nodes) {
    return pdf2::guarded<pdf2_batch_engine *>(nullptr, [&] {
        pdf2::BorrowedTarget t;
        t.ctx = static_cast<llama_context *>(target_ctx);
        t.feature_capture = feature_capture != nullptr ? capture_impl(feature_capture) : nullptr;
        t.head_capture = head_capture != nullptr ? capture_impl(head_capture) : nullptr;
        pdf2::BatchEngineOptions opts;
        set_draft_options(opts, n_max, max_draft, selector, q_top_k, tree_budget, context_nodes);
        auto e = std::make_unique<pdf2_batch_engine>();
        e->impl = std::make_unique<pdf2::BatchEngine>(t, drafter != nullptr ? drafter->impl.get() : nullptr, opts);
        return e.release();
    });
}

extern "C" void pdf2_batch_engine_free(pdf2_batch_engine * e) { delete e; }

extern "C" int pdf2_batch_engine_release_target(pdf2_batch_engine * e) {
    return pdf2::guarded<int>(-1, [&] {
        get(e).release_target();
        return 0;
    });
}

extern "C" int32_t pdf2_batch_engine_max_draft(pdf2_batch_engine * e) {
    return pdf2::guarded<int32_t>(-1, [&] { return static_cast<int32_t>(get(e).max_draft()); });
}

extern "C" int32_t pdf2_batch_engine_step_width(pdf2_batch_engine * e) {
    return pdf2::guarded<int32_t>(-1, [&] { return static_cast<int32_t>(get(e).step_width()); });
}

extern "C" int pdf2_batch_engine_set_context_drafts(pdf2_batch_engine * e, int32_t slot, int32_t mode,
                                                    const char * key) {
    return pdf2::guarded<int>(-1, [&] {
        if (mode < 0 || mode > 2) {
            throw pdf2::Error("context drafts mode must be 0 (off), 1 (request) or 2 (global), got " +
                              std::to_string(mode));
        }
        get(e).set_context_drafts(slot, static_cast<pdf2::ContextDrafts>(mode), key != nullptr ? key : "");
        return 0;
    });
}

extern "C" int pdf2_batch_engine_add_draft_source(pdf2_batch_engine * e, const char * name) {
    return pdf2::guarded<int>(-1, [&] {
        if (name == nullptr) throw pdf2::Error("the draft source's name is NULL");
        get(e).add_draft_source(name);
        return 0;
    });
}

extern "C" int pdf2_batch_engine_set_head_mode(pdf2_batch_engine * e, int32_t mode) {
    return pdf2::guarded<int>(-1, [&] {
        if (mode < 0 || mode > 2) throw pdf2::Error("head mode must be 0 (auto), 1 (lazy) or 2 (full)");
        get(e).set_head_mode(static_cast<pdf2::BatchEngine::HeadMode>(mode));
        return 0;
    });
}

extern "C" int pdf2_batch_engine_set_lazy_head_group(pdf2_batch_engine * e, int32_t rows) {
    return pdf2::guarded<int>(-1, [&] {
        get(e).set_lazy_head_group(rows);
        return 0;
    });
}

extern "C" int pdf2_batch_engine_set_context_cache_limits(pdf2_batch_engine * e, int32_t max_keys,
                                                         int32_t max_documents, int64_t max_tokens) {
    return pdf2::guarded<int>(-1, [&] {
        if (max_keys < 1 || max_documents < 1 || max_tokens < 1) {
            throw pdf2::Error("context cache limits must be >= 1, got " + std::to_string(max_keys) + " keys, " +
                              std::to_string(max_documents) + " documents, " + std::to_string(max_tokens) + " tokens");
        }
        get(e).set_context_cache_limits(static_cast<size_t>(max_keys), max_documents, static_cast<size_t>(max_tokens));
        return 0;
    });
}

extern "C" int32_t pdf2_batch_engine_max_verify_rows(pdf2_batch_engine * e) {
    return pdf2::guarded<int32_t>(-1, [&] { return static_cast<int32_t>(get(e).max_verify_rows()); });
}

extern "C" int pdf2_batch_engine_set_exact_batches(pdf2_batch_engine * e, int32_t max_rows) {
    return pdf2::guarded<int>(-1, [&] {
        get(e).set_exact_batches(max_rows);
        return 0;
    });
}

extern "C" int pdf2_batch_engine_set_costs(pdf2_batch_engine * e, const double * verify_s, int32_t n_verify,
                                           const double * draft_s, int32_t n_draft, double plain_s,
                                           double head_s, int32_t learn, const double * verify_full_s,
                                           int32_t n_full) {
    return pdf2::guarded<int>(-1, [&] {
        if (verify_s == nullptr || n_verify < 1 || (n_draft > 0 && draft_s == nullptr)) {
            throw pdf2::Error("costs: verify_s needs at least one entry");
        }
        if (n_full < 0 || (n_full > 0 && (verify_full_s == nullptr || n_full != n_verify))) {
            throw pdf2::Error("costs: verify_full_s needs as many entries as verify_s (or none)");
        }
        if (!std::isfinite(plain_s) || plain_s < 0.0) throw pdf2::Error("costs: plain_s must be finite and >= 0");
        if (!std::isfinite(head_s) || head_s < 0.0) throw pdf2::Error("costs: head_s must be finite and >= 0");
        get(e).set_costs(std::vector<double>(verify_s, verify_s + n_verify),
                         std::vector<double>(draft_s, draft_s + std::max(0, n_draft)), plain_s, head_s, learn != 0,
                         std::vector<double>(verify_full_s, verify_full_s + n_full));
        return 0;
    });
}

extern "C" int pdf2_batch_engine_measure_costs(pdf2_batch_engine * e, int32_t slot, int32_t reps, double * verify_s,
                                               int32_t n_verify, double * draft_s, int32_t n_draft, double * plain_s,
                                               double * head_s, double * verify_full_s) {
    return pdf2::guarded<int>(-1, [&] {
        pdf2::BatchEngine & eng = get(e);
        if (verify_s == nullptr || draft_s == nullptr || plain_s == nullptr || head_s == nullptr ||
            verify_full_s == nullptr ||
            n_verify != eng.max_verify_rows() ||
            n_draft != eng.max_draft()) {
            throw pdf2::Error("costs arrays must hold max_verify_rows and max_draft entries (and plain_s and head_s one)");
        }
        std::vector<double> v, d, full;
        eng.measure_costs(slot, reps, v, d, *plain_s, *head_s, full);
        std::copy(v.begin(), v.end(), verify_s);
        std::fill_n(verify_full_s, n_verify, 0.0);  // zeros: not measured (no lazy head to choose against)
        std::copy(full.begin(), full.end(), verify_full_s);
        std::copy(d.begin(), d.end(), draft_s);
        return 0;
    });
}

namespace {

pdf2::SamplingParams params_of(const pdf2_sampling * sampling) {
    if (sampling == nullptr) {
        throw pdf2::Error("sampling parameters are NULL");
    }
    const pdf2_sampling & in = *sampling;
    pdf2::SamplingParams sp;
    sp.temperature = in.temperature;
    sp.top_k = in.top_k;
    sp.top_p = in.top_p;
    sp.min_p = in.min_p;
    sp.seed = in.seed;
    sp.repeat_penalty = in.repeat_penalty;
    sp.frequency_penalty = in.frequency_penalty;
    sp.presence_penalty = in.presence_penalty;
    sp.repeat_last_n = in.repeat_last_n;
    sp.grammar = in.grammar != nullptr ? in.grammar : "";
    if (in.n_logit_bias < 0 || (in.n_logit_bias > 0 && (in.logit_bias_tokens == nullptr ||
                                                          in.logit_bias_values == nullptr))) {
        throw pdf2::Error("logit_bias arrays are NULL");
    }
    for (int32_t i = 0; i < in.n_logit_bias; ++i) {
        sp.logit_bias.push_back(llama_logit_bias{in.logit_bias_tokens[i], in.logit_bias_values[i]});
    }
    sp.n_logprobs = in.n_logprobs;
    return sp;
}

std::vector<llama_token> prompt_of(const int32_t * prompt, int32_t n_prompt) {
    if (prompt == nullptr || n_prompt < 0) {
        throw pdf2::Error("prompt is NULL");
    }
    return std::vector<llama_token>(prompt, prompt + n_prompt);
}

}  // namespace

struct pdf2_prepared_sampling {
    std::unique_ptr<pdf2::TargetSampler> sampler;
    int32_t max_tokens = 0;
};

extern "C" int pdf2_batch_engine_start(pdf2_batch_engine * e, int32_t slot, const int32_t * prompt, int32_t n_prompt,
                                       const pdf2_sampling * sampling) {
    return pdf2::guarded<int>(-1, [&] {
        std::vector<llama_token> tokens = prompt_of(prompt, n_prompt);
        const pdf2::SamplingParams params = params_of(sampling);  // checks sampling is not NULL first
        get(e).start(slot, tokens, params, sampling->max_tokens);
        return 0;
    });
}

extern "C" pdf2_prepared_sampling * pdf2_prepare_sampling(void * target_model, int32_t n_ctx_slot,
                                                          const pdf2_sampling * sampling) {
    return pdf2::guarded<pdf2_prepared_sampling *>(nullptr, [&] {
        if (target_model == nullptr) {
            throw pdf2::Error("target model is NULL");
        }
        if (n_ctx_slot < 1) {
            throw pdf2::Error("context per slot must be >= 1, got " + std::to_string(n_ctx_slot));
        }
        const pdf2::SamplingParams params = params_of(sampling);  // checks sampling is not NULL first
        auto p = std::make_unique<pdf2_prepared_sampling>();
        const llama_vocab * vocab = llama_model_get_vocab(static_cast<const llama_model *>(target_model));
        p->sampler = std::make_unique<pdf2::TargetSampler>(params, vocab, n_ctx_slot);
        p->max_tokens = sampling->max_tokens;
        return p.release();
    });
}

extern "C" void pdf2_prepared_sampling_free(pdf2_prepared_sampling * p) { delete p; }

extern "C" int pdf2_batch_engine_start_prepared(pdf2_batch_engine * e, int32_t slot, const int32_t * prompt,
                                                int32_t n_prompt, pdf2_prepared_sampling * prepared) {
    std::unique_ptr<pdf2_prepared_sampling> owned(prepared);  // taken, whatever happens
    return pdf2::guarded<int>(-1, [&] {
        if (owned == nullptr || owned->sampler == nullptr) {
            throw pdf2::Error("prepared sampling is NULL (or was used already)");
        }
        std::vector<llama_token> tokens = prompt_of(prompt, n_prompt);
        get(e).start(slot, tokens, std::move(owned->sampler), owned->max_tokens);
        return 0;
    });
}

extern "C" int32_t pdf2_batch_engine_cached_prefix(pdf2_batch_engine * e, int32_t slot, const int32_t * prompt,
                                                   int32_t n_prompt) {
    return pdf2::guarded<int32_t>(-1, [&] {
        if (prompt == nullptr || n_prompt < 0) {
            throw pdf2::Error("prompt is NULL");
        }
        return get(e).cached_prefix(slot, std::vector<llama_token>(prompt, prompt + n_prompt));
    });
}

extern "C" int pdf2_batch_engine_stop(pdf2_batch_engine * e, int32_t slot) {
    return pdf2::guarded<int>(-1, [&] {
        get(e).stop(slot);
        return 0;
    });
}

extern "C" int32_t pdf2_batch_engine_step(pdf2_batch_engine * e, int32_t * counts, int32_t n_counts, int32_t * tokens,
                                          int32_t n_tokens) {
    return pdf2::guarded<int32_t>(-1, [&] {
        pdf2::BatchEngine & eng = get(e);
        const int32_t width = eng.step_width() + 1;
        if (counts == nullptr || tokens == nullptr || n_counts != eng.n_slots() ||
            n_tokens != eng.n_slots() * width) {
            throw pdf2::Error("step buffers must hold n_slots counts and n_slots x (step_width+1) tokens");
        }
        std::vector<int32_t> c;
        std::vector<llama_token> t;
        const int rows = eng.step(c, t);
        std::copy(c.begin(), c.end(), counts);
        std::copy(t.begin(), t.end(), tokens);
        return static_cast<int32_t>(rows);
    });
}

extern "C" char * pdf2_batch_engine_stats_json(pdf2_batch_engine * e) {
    return pdf2::guarded<char *>(nullptr, [&] { return pdf2::dup_string(get(e).stats_json()); });
}

extern "C" int32_t pdf2_batch_engine_logprobs(pdf2_batch_engine * e, int32_t slot, float * logprob, int32_t * top_ids,
                                              float * top_logprobs, int32_t n_top, int32_t capacity) {
    return pdf2::guarded<int32_t>(-1, [&] {
        if (logprob == nullptr || n_top < 0 || capacity < 0 || (n_top > 0 && (top_ids == nullptr ||
                                                                             top_logprobs == nullptr))) {
            throw pdf2::Error("logprobs buffers are NULL");
        }
        int32_t n = 0;
        const std::vector<pdf2::TokenLogprob> & lp = get(e).logprobs(slot, n);
        n = std::min(n, capacity);
        for (int32_t i = 0; i < n; ++i) {
            const pdf2::TokenLogprob & t = lp[static_cast<size_t>(i)];
            logprob[i] = t.logprob;
            for (int32_t j = 0; j < n_top; ++j) {
                const bool have = static_cast<size_t>(j) < t.top_ids.size();
                top_ids[i * n_top + j] = have ? t.top_ids[static_cast<size_t>(j)] : -1;
                top_logprobs[i * n_top + j] = have ? t.top_logprobs[static_cast<size_t>(j)] : 0.0f;
            }
        }
        return n;
    });
}

extern "C" char * pdf2_batch_engine_slot_stats_json(pdf2_batch_engine * e, int32_t slot) {
    return pdf2::guarded<char *>(nullptr, [&] { return pdf2::dup_string(get(e).slot_stats_json(slot)); });
}
