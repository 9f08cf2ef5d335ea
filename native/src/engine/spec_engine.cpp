#include "engine/spec_engine.h"

#include "common/errors.h"
#include "common/json_writer.h"
#include "engine/verify.h"

#include <algorithm>
#include <string>

namespace pdf2 {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::vector<int32_t> feature_layers(const Drafter * d) { return d ? d->hparams().target_layers : std::vector<int32_t>{}; }

}  // namespace

SpecEngine::SpecEngine(llama_context * target, Drafter * drafter, const EngineOptions & opts,
                       CallbackCapture * capture)
    : target_(target, opts.n_max == 0 ? std::vector<int32_t>{} : feature_layers(drafter), capture),
      drafter_(opts.n_max == 0 ? nullptr : drafter),
      opts_(opts),
      policy_(0) {
    if (opts.n_max < -1) {
        throw Error("n_max must be >= 0, or -1 for adaptive");
    }
    if (drafter_ != nullptr) {
        check_drafter_fits(*drafter_, target_, static_cast<uint32_t>(target_.n_ctx()), "the target context");
        const DrafterHParams & hp = drafter_->hparams();
        max_draft_ = std::min<int>(static_cast<int>(hp.block_size) - 1, target_.n_batch() - 1);
        if (opts.n_max > 0) {
            max_draft_ = std::min(max_draft_, opts.n_max);
        }
        feed_drafter_ = true;
        // feature buffers at their largest from the start: no multi-MB reallocations per request
        // (they fragment the heap of a long-running process; see BatchEngine)
        const size_t width = static_cast<size_t>(target_.feature_width());
        feat_.reserve(static_cast<size_t>(target_.n_batch()) * width);
        queued_features_.reserve(static_cast<size_t>(target_.n_batch() + max_draft_ + 1) * width);
    } else if (opts.n_max != 0) {
        throw Error("speculative decoding needs a drafter (or n_max = 0 for plain decoding)");
    }
    policy_ = DraftLengthPolicy(max_draft_);
    reset_stats();
}

void SpecEngine::reset_stats() {
    stats_ = EngineStats{};
    stats_.drafted.assign(static_cast<size_t>(max_draft_), 0);
    stats_.accepted.assign(static_cast<size_t>(max_draft_), 0);
    stats_.n_max_used.assign(static_cast<size_t>(max_draft_) + 1, 0);
}

void SpecEngine::cap_draft(int max_draft) {
    if (max_draft < 0) {
        throw Error("draft cap must be >= 0");
    }
    if (max_draft < max_draft_) {
        max_draft_ = max_draft;
        policy_ = DraftLengthPolicy(max_draft_);
        reset_stats();
    }
}

void SpecEngine::set_head_capture(CallbackCapture * capture) {
    target_.set_head_capture(capture);
    lazy_head_ = capture != nullptr;
}

void SpecEngine::set_costs(const std::vector<double> & verify_s, const std::vector<double> & draft_s) {
    policy_.set_costs(verify_s, draft_s);
}

void SpecEngine::queue_rows(int32_t row0, int32_t n, int32_t pos0) {
    if (!feed_drafter_ || n <= 0) {
        return;
    }
    const auto t0 = Clock::now();
    target_.features(row0, n, feat_);
    queued_features_.insert(queued_features_.end(), feat_.begin(), feat_.end());
    for (int32_t i = 0; i < n; ++i) {
        queued_positions_.push_back(pos0 + i);
    }
    stats_.inject_s += seconds_since(t0);
}

void SpecEngine::flush_rows() {
    if (queued_positions_.empty()) {
        return;
    }
    const auto t0 = Clock::now();
    const double setup0 = drafter_->graph_setup_seconds();
    drafter_->inject(queued_features_.data(), static_cast<size_t>(target_.feature_width()), queued_positions_.data(),
                     static_cast<int>(queued_positions_.size()));
    queued_features_.clear();
    queued_positions_.clear();
    const double setup = drafter_->graph_setup_seconds() - setup0;
    stats_.graph_setup_s += setup;
    stats_.inject_s += seconds_since(t0) - setup;
}

llama_token SpecEngine::begin(const std::vector<llama_token> & prompt, const SamplingParams & sampling) {
    if (prompt.empty()) {
        throw Error("the prompt is empty: at least one token is needed");
    }
    if (static_cast<int32_t>(prompt.size()) >= target_.n_ctx()) {
        throw Error("the prompt (" + std::to_string(prompt.size()) + " tokens) does not fit the context (" +
                    std::to_string(target_.n_ctx()) + " tokens)");
    }
    sampler_ = std::make_unique<TargetSampler>(sampling, target_.n_vocab());
    reset_stats();
    stats_.n_prompt = static_cast<int64_t>(prompt.size());
    started_ = false;

    const auto t0 = Clock::now();
    target_.claim();
    target_.clear();
    queued_features_.clear();
    queued_positions_.clear();
    if (drafter_ != nullptr) {
        drafter_->truncate(0);
    }
    const int32_t n = static_cast<int32_t>(prompt.size());
    for (int32_t at = 0; at < n; at += target_.n_batch()) {
        const int32_t chunk = std::min(target_.n_batch(), n - at);
        target_.decode(prompt.data() + at, chunk, at, false);
        queue_rows(0, chunk, at);
    }
    const float * logits = target_.logits(0);
    llama_token first;
    if (sampling.greedy()) {
        first = argmax_token(logits, target_.n_vocab());
    } else {
        SparseDist p;
        sampler_->distribution(logits, p);
        first = sampler_->draw(p);
    }
    if (opts_.n_max != 0) {
        flush_rows();  // the prompt's rows go into the drafter with the prefill (as upstream's prefill does)
    }
    stats_.prefill_s = seconds_since(t0) - stats_.inject_s - stats_.graph_setup_s;  // those count as inject, setup
    in_begin_s_ = stats_.inject_s + stats_.graph_setup_s;
    graph_builds0_ = drafter_ != nullptr ? drafter_->n_graph_builds() : 0;
    head_rows0_ = target_.lazy_head_rows();
    stats_.n_generated = 1;
    pos_ = n;
    anchor_ = first;
    started_ = true;
    return first;
}

int SpecEngine::choose_n_draft() {
    if (drafter_ == nullptr || max_draft_ == 0) {
        return 0;
    }
    return opts_.n_max < 0 ? policy_.choose() : max_draft_;
}

int SpecEngine::step(std::vector<llama_token> & out, int max_new) {
    if (!started_) {
        throw Error("step() before begin()");
    }
    const auto t_step = Clock::now();
    struct AddStepTime {  // also when the step throws
        double & total;
        Clock::time_point t0;
        ~AddStepTime() { total += seconds_since(t0); }
    } add_step_time{stats_.step_s, t_step};
    if (pos_ >= target_.n_ctx()) {
        return 0;
    }
    // the verify batch [anchor, d1..dn] must fit the context
    int n = std::min(choose_n_draft(), target_.n_ctx() - pos_ - 1);
    if (max_new > 0) {
        n = std::min(n, max_new - 1);
    }
    const bool greedy = sampler_->params().greedy();

    std::vector<llama_token> drafts;
    std::vector<SparseDist> q;
    if (n > 0) {
        const auto t0 = Clock::now();
        const double setup0 = drafter_->graph_setup_seconds();
        // the rows committed since the last block are injected by the same graph that proposes
        drafter_->inject_and_propose(queued_features_.data(), static_cast<size_t>(target_.feature_width()),
                                     queued_positions_.data(), static_cast<int>(queued_positions_.size()), anchor_,
                                     pos_, n + 1);
        queued_features_.clear();
        queued_positions_.clear();
        const double setup = drafter_->graph_setup_seconds() - setup0;
        stats_.graph_setup_s += setup;
        const auto t_walk = Clock::now();
        stats_.propose_s += std::chrono::duration<double>(t_walk - t0).count() - setup;
        WalkMode mode = opts_.walk < 0 ? (greedy ? WalkMode::Greedy : WalkMode::Sample)
                                       : static_cast<WalkMode>(opts_.walk);
        if (greedy && mode == WalkMode::Sample) {
            mode = WalkMode::Greedy;  // a greedy target accepts only its argmax: sampling drafts would waste them
        }
        const float walk_t = mode == WalkMode::Sample ? sampler_->params().temperature : 0.0f;
        const WalkResult w = drafter_->walk(mode, walk_t, sampler_->rng()(), opts_.q_top_k);
        drafts.assign(w.tokens.begin(), w.tokens.end());
        q.resize(drafts.size());
        for (size_t j = 0; j < drafts.size(); ++j) {
            for (int c = 0; c < w.k; ++c) {
                const size_t idx = j * static_cast<size_t>(w.k) + static_cast<size_t>(c);
                if (w.q[idx] > 0.0f) {
                    q[j].ids.push_back(w.q_ids[idx]);
                    q[j].probs.push_back(w.q[idx]);
                }
            }
        }
        stats_.walk_s += seconds_since(t_walk);
        stats_.draft_s += seconds_since(t0);
    }

    const auto t1 = Clock::now();
    batch_.assign(1, anchor_);
    batch_.insert(batch_.end(), drafts.begin(), drafts.end());
    target_.decode(batch_.data(), static_cast<int32_t>(batch_.size()), pos_, n > 0, /*generation =*/true,
                   /*lazy_head =*/n > 0 && lazy_head_);
    const auto t_logic = Clock::now();
    // rows are read in order, each as the verify reaches it (a lazy head computes it then)
    const double head_s0 = target_.lazy_head_seconds();
    const LogitRows row = [this](int j) { return target_.logits(j); };
    const VerifyResult v = greedy ? verify_greedy(drafts, row, target_.n_vocab())
                                  : verify_stochastic(drafts, q, row, *sampler_);
    // the lazy head is the target's forward finished row by row: it counts as verify decode
    const double head_s = target_.lazy_head_seconds() - head_s0;
    stats_.verify_decode_s += std::chrono::duration<double>(t_logic - t1).count() + head_s;
    const int k = v.n_accepted;
    if (n > 0) {
        target_.truncate(pos_ + k + 1);  // drop the rejected drafts from the target cache
    }
    const double logic_s = seconds_since(t_logic) - head_s;
    stats_.verify_logic_s += logic_s;
    stats_.verify_s += std::chrono::duration<double>(t_logic - t1).count() + head_s + logic_s;

    queue_rows(0, k + 1, pos_);  // anchor + accepted drafts are committed

    for (int j = 0; j < k; ++j) {
        out.push_back(drafts[static_cast<size_t>(j)]);
    }
    out.push_back(v.next);

    stats_.n_steps += 1;
    stats_.n_generated += k + 1;
    stats_.n_max_used[static_cast<size_t>(n)] += 1;
    if (n > 0) {
        stats_.n_spec_steps += 1;
        for (int j = 0; j < n && j <= k; ++j) {
            stats_.drafted[static_cast<size_t>(j)] += 1;
            if (j < k) {
                stats_.accepted[static_cast<size_t>(j)] += 1;
            }
        }
        policy_.observe(n, k);
    }
    pos_ += k + 1;
    anchor_ = v.next;
    return k + 1;
}

void SpecEngine::measure_costs(int reps, std::vector<double> & verify_s, std::vector<double> & draft_s) {
    if (!started_) {
        throw Error("measure_costs() needs a prefilled context: call begin() first");
    }
    reps = std::max(1, reps);
    const int max_b = max_draft_ + 1;
    if (pos_ + max_b > target_.n_ctx()) {
        throw Error("context too small to measure costs");
    }
    flush_rows();
    verify_s.assign(static_cast<size_t>(max_b), 0.0);
    draft_s.assign(static_cast<size_t>(max_draft_), 0.0);
    std::vector<llama_token> tokens(static_cast<size_t>(max_b), anchor_);
    std::vector<std::vector<double>> vt(static_cast<size_t>(max_b)), dt(static_cast<size_t>(max_draft_));
    for (int r = 0; r < reps; ++r) {
        // interleave the sizes so that machine noise spreads evenly over them
        for (int b = 1; b <= max_b; ++b) {
            const auto t0 = Clock::now();
            // as a verify runs it: with a lazy head, the decode plus the head of its first row
            target_.decode(tokens.data(), b, pos_, b > 1, /*generation =*/true, /*lazy_head =*/b > 1 && lazy_head_);
            (void) target_.logits(0);
            vt[static_cast<size_t>(b - 1)].push_back(seconds_since(t0));
            target_.truncate(pos_);
        }
        for (int n = 1; n <= max_draft_; ++n) {
            const auto t0 = Clock::now();
            drafter_->propose(anchor_, pos_, n + 1);
            (void) drafter_->walk(WalkMode::Greedy, 0.0f, 0, opts_.q_top_k);
            dt[static_cast<size_t>(n - 1)].push_back(seconds_since(t0));
        }
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    for (size_t i = 0; i < vt.size(); ++i) verify_s[i] = median(vt[i]);
    for (size_t i = 0; i < dt.size(); ++i) draft_s[i] = median(dt[i]);
}

std::string SpecEngine::stats_json() const {
    JsonWriter w;
    w.begin_object();
    w.field("n_prompt", stats_.n_prompt);
    w.field("n_generated", stats_.n_generated);
    w.field("n_steps", stats_.n_steps);
    w.field("n_spec_steps", stats_.n_spec_steps);
    const int64_t after_first = stats_.n_generated - 1;
    w.field("tau", stats_.n_steps > 0 ? static_cast<double>(after_first) / static_cast<double>(stats_.n_steps) : 0.0);
    w.field("max_draft", max_draft_);
    w.field("prefill_s", stats_.prefill_s);
    w.field("draft_s", stats_.draft_s);
    w.field("verify_s", stats_.verify_s);
    w.field("inject_s", stats_.inject_s);
    auto array = [&](const char * name, const std::vector<int64_t> & v) {
        w.key(name).begin_array();
        for (const int64_t x : v) w.value(x);
        w.end_array();
    };
    // per-phase breakdown: prefill + the phases + step_other_s = the native time of the request
    const double in_phases = stats_.inject_s + stats_.propose_s + stats_.walk_s + stats_.verify_decode_s +
                             stats_.verify_logic_s + stats_.graph_setup_s;
    w.key("phases").begin_object();
    w.field("n_steps", stats_.n_steps);
    w.field("prefill_s", stats_.prefill_s);
    w.field("inject_s", stats_.inject_s);
    w.field("propose_s", stats_.propose_s);
    w.field("walk_s", stats_.walk_s);
    w.field("verify_decode_s", stats_.verify_decode_s);
    w.field("verify_logic_s", stats_.verify_logic_s);
    w.field("graph_setup_s", stats_.graph_setup_s);
    // inject during begin() (prompt features) lies outside step(): only the step's own share is subtracted
    w.field("step_other_s", std::max(0.0, stats_.step_s - (in_phases - in_begin_s_)));
    w.end_object();
    // rows whose LM head ran lazily (0 without the lazy head: every verify row's logits were computed)
    w.field("lazy_head", lazy_head_ && target_.lazy_head_error().empty());
    if (!target_.lazy_head_error().empty()) {
        w.field("lazy_head_error", target_.lazy_head_error());
    }
    w.field("lazy_head_rows", target_.lazy_head_rows() - head_rows0_);
    w.field("drafter_graph_builds",
            static_cast<int64_t>(drafter_ != nullptr ? drafter_->n_graph_builds() - graph_builds0_ : 0));
    array("drafted_per_position", stats_.drafted);
    array("accepted_per_position", stats_.accepted);
    array("n_max_histogram", stats_.n_max_used);
    w.key("acceptance_estimate").begin_array();
    for (const double a : policy_.acceptance()) w.value(a);
    w.end_array();
    w.end_object();
    return w.str();
}

}  // namespace pdf2
