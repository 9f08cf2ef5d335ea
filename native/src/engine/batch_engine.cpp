#include "engine/batch_engine.h"

#include "common/errors.h"
#include "common/json_writer.h"
#include "engine/verify.h"

#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <string>

namespace pdf2 {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int MAX_SLOTS = 64;
constexpr uint32_t BATCH_ROWS = 512;
constexpr int MAX_TREE_BUDGET = 255;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// capture: installed as the graph evaluation callback (targets without layer-input taps), or null
llama_context * make_context(llama_model * model, const BatchEngineOptions & o, CallbackCapture * capture) {
    if (model == nullptr) {
        throw Error("target model is NULL");
    }
    if (o.n_slots < 1 || o.n_slots > MAX_SLOTS) {
        throw Error("number of slots must be in 1.." + std::to_string(MAX_SLOTS) + ", got " + std::to_string(o.n_slots));
    }
    if (o.n_ctx_slot < 32) {
        throw Error("context per slot must be at least 32 tokens, got " + std::to_string(o.n_ctx_slot));
    }
    // a tree's rows take cells beyond its slot's positions (siblings share a position) until its verify
    const int64_t total = (static_cast<int64_t>(o.n_ctx_slot) + (o.tree_budget > 0 ? o.tree_budget + 1 : 0)) * o.n_slots;
    if (total > (int64_t{1} << 24)) {
        throw Error("context per slot x slots = " + std::to_string(total) + " tokens is too large");
    }
    llama_context_params p = llama_context_default_params();
    p.n_ctx = static_cast<uint32_t>(total);
    p.n_batch = BATCH_ROWS;
    p.n_ubatch = BATCH_ROWS;
    p.n_seq_max = static_cast<uint32_t>(o.n_slots);
    // One KV stream per slot: a slot's K/V rows sit at the cells of their
    // positions, as in a single-sequence context, so attention sums them in
    // the same order whatever the other slots hold (a unified cache
    // interleaves the slots' cells and changes the SIMD grouping).
    p.kv_unified = false;
    if (o.tree_budget > 0) {
        // a tree's branch sequences share the slot's cells: one stream for all (a copy of the
        // context into a branch is then metadata only), and a sequence per branch
        const int64_t n_seq = static_cast<int64_t>(o.n_slots) * (1 + o.tree_budget);
        if (n_seq > static_cast<int64_t>(llama_max_parallel_sequences())) {
            throw Error("tree verification needs slots x (1 + tree budget) = " + std::to_string(n_seq) +
                        " sequences, llama.cpp allows " + std::to_string(llama_max_parallel_sequences()));
        }
        p.n_seq_max = static_cast<uint32_t>(n_seq);
        p.kv_unified = true;
    }
    if (o.n_threads > 0) {
        p.n_threads = o.n_threads;
    }
    if (o.n_threads_batch > 0) {
        p.n_threads_batch = o.n_threads_batch;
    }
    p.flash_attn_type = o.flash_attn < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO
                        : o.flash_attn == 0 ? LLAMA_FLASH_ATTN_TYPE_DISABLED
                                            : LLAMA_FLASH_ATTN_TYPE_ENABLED;
    p.no_perf = true;
    if (capture != nullptr) {
        p.cb_eval = &CallbackCapture::eval_callback;
        p.cb_eval_user_data = capture;
    }
    llama_context * ctx = llama_init_from_model(model, p);
    if (ctx == nullptr) {
        throw Error("failed to create the target context (" + std::to_string(total) + " tokens, " +
                    std::to_string(o.n_slots) + " sequences)");
    }
    return ctx;
}

std::vector<int32_t> feature_layers(const std::vector<Drafter *> & drafters, int n_max) {
    if (n_max == 0 || drafters.empty() || drafters[0] == nullptr) {
        return {};
    }
    return drafters[0]->hparams().target_layers;
}

// The options of a borrowed context: one slot over all of it, its own threads.
BatchEngineOptions borrowed_options(const BorrowedTarget & t, BatchEngineOptions o) {
    if (t.ctx == nullptr) {
        throw Error("target context is NULL");
    }
    o.n_slots = 1;
    o.n_ctx_slot = static_cast<int32_t>(llama_n_ctx(t.ctx));
    if (o.tree_budget > 0 && static_cast<int64_t>(llama_n_seq_max(t.ctx)) < 1 + static_cast<int64_t>(o.tree_budget)) {
        throw Error("tree verification of " + std::to_string(o.tree_budget) + " nodes needs a target context with " +
                    std::to_string(1 + o.tree_budget) + " sequences and a unified KV cache, this one has " +
                    std::to_string(llama_n_seq_max(t.ctx)) + " (load_target(..., tree_budget=...) makes one)");
    }
    o.n_threads = llama_n_threads(t.ctx);
    o.n_threads_batch = llama_n_threads_batch(t.ctx);
    return o;
}

}  // namespace

BatchEngine::BatchEngine(llama_model * model, const std::vector<Drafter *> & drafters, const BatchEngineOptions & opts)
    : opts_(opts),
      // the callback serves the lazy LM head whenever slots draft, and the features on the callback path
      ctx_(make_context(model, opts, opts.n_max != 0 ? &own_capture_ : nullptr), true),
      feature_capture_(capture_for(model, feature_layers(drafters, opts.n_max))),
      head_capture_(opts.n_max != 0 ? &own_capture_ : nullptr),
      target_(ctx_.ctx, feature_layers(drafters, opts.n_max), feature_capture_) {
    init(drafters, head_capture_ != nullptr);
}

BatchEngine::BatchEngine(const BorrowedTarget & t, Drafter * drafter, const BatchEngineOptions & opts)
    : opts_(borrowed_options(t, opts)),
      ctx_(t.ctx, false),
      feature_capture_(t.feature_capture),
      head_capture_(t.head_capture),
      target_(t.ctx, feature_layers({drafter}, opts.n_max), t.feature_capture),
      borrowed_(true) {
    if (opts.n_max != 0 && drafter == nullptr) {
        throw Error("speculative decoding needs a drafter (or n_max = 0 for plain decoding)");
    }
    init(drafter != nullptr ? std::vector<Drafter *>{drafter} : std::vector<Drafter *>{}, head_capture_ != nullptr);
}

void BatchEngine::init(const std::vector<Drafter *> & drafters, bool has_head) {
    const BatchEngineOptions & opts = opts_;
    if (opts.n_max < -1) {
        throw Error("n_max must be >= 0, or -1 for adaptive");
    }
    if (opts.tree_budget < 0 || opts.tree_budget > MAX_TREE_BUDGET) {
        throw Error("tree budget must be in 0.." + std::to_string(MAX_TREE_BUDGET) + ", got " +
                    std::to_string(opts.tree_budget));
    }
    slots_.resize(static_cast<size_t>(opts.n_slots));
    if (opts.n_max != 0) {
        if (drafters.size() != slots_.size()) {
            throw Error("speculative decoding needs one drafter per slot (" + std::to_string(slots_.size()) +
                        "), got " + std::to_string(drafters.size()) + " (or n_max = 0 for plain decoding)");
        }
        max_draft_ = target_.n_batch() - 1;
        for (size_t i = 0; i < drafters.size(); ++i) {
            Drafter * d = drafters[i];
            if (d == nullptr) {
                throw Error("drafter of slot " + std::to_string(i) + " is NULL");
            }
            for (size_t j = 0; j < i; ++j) {
                if (drafters[j] == d) {
                    throw Error("slots " + std::to_string(j) + " and " + std::to_string(i) +
                                " share one drafter: each slot needs its own (its cache holds that slot's context)");
                }
            }
            const DrafterHParams & hp = d->hparams();
            if (hp.target_layers != drafters[0]->hparams().target_layers) {
                throw Error("the slots' drafters tap different target layers");
            }
            check_drafter_fits(*d, target_, static_cast<uint32_t>(opts.n_ctx_slot), "the context per slot");
            if (opts.tree_budget > 0 && hp.version != 2) {
                throw Error("tree verification needs a DFlash2 drafter (its selector lattice holds the paths)");
            }
            max_draft_ = std::min<int>(max_draft_, static_cast<int>(hp.block_size) - 1);
            slots_[i].drafter = d;
        }
        if (opts.n_max > 0) {
            max_draft_ = std::min(max_draft_, opts.n_max);
        }
        if (opts.max_draft >= 0) {
            max_draft_ = std::min(max_draft_, opts.max_draft);
        }
        feed_drafters_ = true;
        if (has_head) {
            target_.set_head_capture(head_capture_);
        }
    }
    shared_policy_ = DraftLengthPolicy(max_draft_);
    for (Slot & s : slots_) {
        s.policy = shared_policy_;
    }
    if (opts.tree_auto && (opts.tree_budget < 1 || opts.n_max == 0)) {
        throw Error("an automatic tree budget needs a largest budget >= 1 and a drafter");
    }
    tree_policy_ = TreeBudgetPolicy(opts.tree_auto && max_draft_ > 0 ? opts.tree_budget : 0);
    target_.claim();
    batch_cap_ = target_.n_batch();
    const llama_model * model = llama_get_model(ctx_.ctx);
    // (a unified cache, as trees take, splits a batch in row order whatever its sequences)
    fill_gaps_ = !llama_model_is_recurrent(model) && !llama_model_is_hybrid(model) && opts.tree_budget == 0;
    if (batch_cap_ < opts.n_slots) {
        throw Error("target batch (" + std::to_string(batch_cap_) + " rows) is smaller than the number of slots");
    }
    batch_ = llama_batch_init(batch_cap_, 0, std::max(1, opts.tree_budget));  // a tree's anchor is in every branch
    stats_.accepted_per_pos.assign(static_cast<size_t>(max_draft_), 0);
    if (feed_drafters_) {
        // feature rows are copied at every step and prompt chunk: buffers of their largest size
        // from the start (address space only until used), so that requests of varying lengths
        // do not reallocate multi-MB vectors and fragment the heap (a soak's RSS crept up)
        const size_t width = static_cast<size_t>(target_.feature_width());
        feat_.reserve(static_cast<size_t>(batch_cap_) * width);
        for (Slot & s : slots_) {
            s.queued_features.reserve(static_cast<size_t>(batch_cap_ + max_draft_ + 1) * width);
            s.queued_positions.reserve(static_cast<size_t>(batch_cap_ + max_draft_ + 1));
        }
    }
}

BatchEngine::~BatchEngine() { llama_batch_free(batch_); }

CallbackCapture * BatchEngine::capture_for(const llama_model * model, const std::vector<int32_t> & layers) {
    if (model == nullptr || layers.empty() || capture_path(model_arch(model)) != CapturePath::Callback) {
        return nullptr;  // no features wanted, or llama.cpp's own taps give them
    }
    return &own_capture_;
}

BatchEngine::Slot & BatchEngine::slot_at(int slot) {
    if (slot < 0 || slot >= n_slots()) {
        throw Error("slot " + std::to_string(slot) + " does not exist (0.." + std::to_string(n_slots() - 1) + ")");
    }
    return slots_[static_cast<size_t>(slot)];
}

void BatchEngine::set_costs(const std::vector<double> & verify_s, const std::vector<double> & draft_s) {
    costs_verify_ = verify_s;
    costs_draft_ = draft_s;
    shared_policy_.set_costs(verify_s, draft_s);
    for (Slot & s : slots_) {
        s.policy.set_costs(verify_s, draft_s);
    }
}

void BatchEngine::start(int slot, const std::vector<llama_token> & prompt, const SamplingParams & sampling,
                        int32_t max_tokens) {
    Slot & s = slot_at(slot);
    if (max_tokens < 0) {
        throw Error("max_tokens must be >= 0 (0: no limit), got " + std::to_string(max_tokens));
    }
    if (s.state != State::Idle) {
        throw Error("slot " + std::to_string(slot) + " is busy: stop it first");
    }
    if (prompt.empty()) {
        throw Error("the prompt is empty: at least one token is needed");
    }
    if (static_cast<int32_t>(prompt.size()) >= opts_.n_ctx_slot) {
        throw Error("the prompt (" + std::to_string(prompt.size()) + " tokens) does not fit the context (" +
                    std::to_string(opts_.n_ctx_slot) + " tokens)");
    }
    for (const llama_token t : prompt) {
        if (t < 0 || t >= target_.n_vocab()) {
            throw Error("token id " + std::to_string(t) + " is outside the target vocabulary");
        }
    }
    // validates every parameter (the grammar too) before the slot changes
    auto sampler = std::make_unique<TargetSampler>(sampling, target_.vocab(), opts_.n_ctx_slot);
    if (borrowed_) {
        // the owner may have decoded in its context since, and other engines may share it:
        // its taps are set for this engine again, and nothing it holds is trusted
        target_.claim();
        s.history.clear();
    }
    const int32_t keep = reuse_prefix(s, slot, prompt);
    s.sampler = std::move(sampler);
    s.prompt = prompt;
    s.history = prompt;  // positions >= keep are prefilled next
    s.n_prefilled = keep;
    s.n_reused = keep;
    s.pos = 0;
    s.anchor = -1;
    s.max_tokens = max_tokens;
    s.stats = SlotStats{};
    s.stats.n_prompt = static_cast<int64_t>(prompt.size());
    s.stats.n_reused = keep;
    s.stats.drafted.assign(static_cast<size_t>(max_draft_), 0);
    s.stats.accepted.assign(static_cast<size_t>(max_draft_), 0);
    s.stats.n_max_used.assign(static_cast<size_t>(max_draft_) + 1, 0);
    stats_.n_prompt_reused += keep;
    s.policy = shared_policy_;  // the costs, and the acceptance seen so far
    s.state = State::Prefill;
}

void BatchEngine::stop(int slot) {
    Slot & s = slot_at(slot);
    if (s.state == State::Idle) {
        return;
    }
    flush_pending(slot, s);
    // what the sequence holds: the prefilled prompt rows, or every committed row
    const int32_t held = s.state == State::Prefill ? s.n_prefilled : s.pos - static_cast<int32_t>(s.pending.size());
    s.pending.clear();
    s.history.resize(static_cast<size_t>(std::min<int32_t>(held, static_cast<int32_t>(s.history.size()))));
    s.state = State::Idle;
    s.prompt.clear();
    s.sampler.reset();
}

namespace {

// the common prefix of what a slot holds and a prompt, leaving at least the
// last prompt token to decode (its logits give the first answer token)
size_t reusable_rows(const std::vector<llama_token> & history, const std::vector<llama_token> & prompt) {
    const size_t limit = std::min(history.size(), prompt.empty() ? 0 : prompt.size() - 1);
    size_t keep = 0;
    while (keep < limit && history[keep] == prompt[keep]) {
        ++keep;
    }
    return keep;
}

}  // namespace

int32_t BatchEngine::cached_prefix(int slot, const std::vector<llama_token> & prompt) {
    const Slot & s = slot_at(slot);
    if (s.state != State::Idle) {
        throw Error("slot " + std::to_string(slot) + " is busy");
    }
    return static_cast<int32_t>(reusable_rows(s.history, prompt));
}

int32_t BatchEngine::reuse_prefix(Slot & s, int slot, const std::vector<llama_token> & prompt) {
    const size_t keep = reusable_rows(s.history, prompt);
    const auto k = static_cast<int32_t>(keep);
    llama_memory_seq_rm(llama_get_memory(ctx_.ctx), slot, k, -1);
    if (s.drafter != nullptr) {
        s.drafter->truncate(k);
        // rows committed but not yet injected: keep those below k (positions ascend)
        const auto cut = std::lower_bound(s.queued_positions.begin(), s.queued_positions.end(), k);
        const size_t n_kept = static_cast<size_t>(cut - s.queued_positions.begin());
        s.queued_positions.resize(n_kept);
        s.queued_features.resize(n_kept * static_cast<size_t>(target_.feature_width()));
    }
    s.history.resize(keep);
    return k;
}

int BatchEngine::choose_n_draft(Slot & s) {
    if (s.drafter == nullptr || max_draft_ == 0) {
        return 0;
    }
    return opts_.n_max < 0 ? s.policy.best() : max_draft_;  // probes: see step()
}

int BatchEngine::batch_draft_length(const std::vector<size_t> & decoding) const {
    // Each slot's policy prices a block as if it were decoded alone, where a
    // drafted row costs a fraction of the first (weights are read once). In a
    // batch of many slots on a CPU every row costs about the same, so the
    // common length maximises the batch's rate under a linear model: the first
    // row, plus the marginal row cost measured on one slot for every other row,
    // plus each slot's (serial) drafter time.
    const std::vector<double> & v = costs_verify_;
    const std::vector<double> & d = costs_draft_;
    const double row = std::max(0.0, (v.back() - v.front()) / static_cast<double>(v.size() - 1));
    const double b = static_cast<double>(decoding.size());
    int best = 0;
    double best_rate = -1.0;
    for (int n = 0; n <= max_draft_; ++n) {
        double tokens = 0.0;
        for (const size_t i : decoding) {
            tokens += slots_[i].policy.expected_tokens(n);
        }
        double seconds = v.front() + (b * (n + 1) - 1.0) * row;
        if (n > 0 && !d.empty()) {
            seconds += b * d[std::min(static_cast<size_t>(n - 1), d.size() - 1)];
        }
        const double rate = tokens / std::max(seconds, 1e-9);
        if (rate > best_rate) {
            best = n;
            best_rate = rate;
        }
    }
    return best;
}

double BatchEngine::step_seconds(int n_slots, int rows, int n) const {
    const std::vector<double> & v = costs_verify_;
    const std::vector<double> & d = costs_draft_;
    const double draft = n > 0 && !d.empty() ? d[std::min(static_cast<size_t>(n - 1), d.size() - 1)] : 0.0;
    if (n_slots <= 1) {
        return v[std::min(static_cast<size_t>(std::max(rows, 1) - 1), v.size() - 1)] + draft;
    }
    const double row = std::max(0.0, (v.back() - v.front()) / static_cast<double>(v.size() - 1));
    return v.front() + (n_slots * rows - 1.0) * row + n_slots * draft;
}

int BatchEngine::auto_tree_budget(const std::vector<size_t> & decoding, int n_chain, bool chain_probe) {
    if (tree_policy_.max_budget() == 0 || decoding.empty() || costs_verify_.size() < 2) {
        return 0;
    }
    const int n_dec = static_cast<int>(decoding.size());
    double chain_tokens = 0.0;
    for (const size_t i : decoding) chain_tokens += slots_[i].policy.expected_tokens(n_chain);
    const double chain_rate = chain_tokens / std::max(step_seconds(n_dec, n_chain + 1, n_chain), 1e-9);
    // per slot: (1 + expected accepted) over its share of the step
    const auto [b, rate] = tree_policy_.best([&](int nodes) { return step_seconds(n_dec, nodes + 1, max_draft_) / n_dec; });
    const bool chosen = tree_policy_.has_trees() && b > 0 && rate > chain_rate;
    // a chosen tree restarts the probe schedule; no tree probe while the chain probes (one at a time)
    const bool probe = (chosen || !chain_probe) && tree_policy_.schedule(chosen);
    const int budget = chosen ? b : !probe ? 0 : tree_policy_.has_trees() && b > 0 ? b : tree_policy_.probe_budget();
    n_tree_probes_ += probe ? 1 : 0;
    n_auto_tree_steps_ += budget > 0 ? 1 : 0;
    return budget;
}

void BatchEngine::queue_rows(Slot & s, int32_t row0, int32_t n, int32_t pos0) {
    if (!feed_drafters_ || n <= 0) {
        return;
    }
    const auto t0 = Clock::now();
    target_.features(row0, n, feat_);
    s.queued_features.insert(s.queued_features.end(), feat_.begin(), feat_.end());
    for (int32_t i = 0; i < n; ++i) {
        s.queued_positions.push_back(pos0 + i);
    }
    stats_.inject_s += seconds_since(t0);
}

void BatchEngine::flush_rows(Slot & s) {
    if (s.queued_positions.empty()) {
        return;
    }
    const auto t0 = Clock::now();
    const double setup0 = s.drafter->graph_setup_seconds();
    const uint64_t builds0 = s.drafter->n_graph_builds();
    s.drafter->inject(s.queued_features.data(), static_cast<size_t>(target_.feature_width()),
                      s.queued_positions.data(), static_cast<int>(s.queued_positions.size()));
    s.queued_features.clear();
    s.queued_positions.clear();
    const double setup = s.drafter->graph_setup_seconds() - setup0;
    stats_.graph_setup_s += setup;
    stats_.n_graph_builds += static_cast<int64_t>(s.drafter->n_graph_builds() - builds0);
    stats_.inject_s += seconds_since(t0) - setup;
}

void BatchEngine::draft(Slot & s, int n, int tree_budget) {
    s.drafts.clear();
    s.q.clear();
    s.tree_step = false;
    if (n <= 0) {
        return;
    }
    const auto t0 = Clock::now();
    const bool greedy = s.sampler->params().greedy();
    const double setup0 = s.drafter->graph_setup_seconds();
    const uint64_t builds0 = s.drafter->n_graph_builds();
    // the rows committed since the last block are injected by the same graph that proposes
    s.drafter->inject_and_propose(s.queued_features.data(), static_cast<size_t>(target_.feature_width()),
                                  s.queued_positions.data(), static_cast<int>(s.queued_positions.size()), s.anchor,
                                  s.pos, n + 1);
    s.queued_features.clear();
    s.queued_positions.clear();
    const double setup = s.drafter->graph_setup_seconds() - setup0;
    stats_.graph_setup_s += setup;
    stats_.n_graph_builds += static_cast<int64_t>(s.drafter->n_graph_builds() - builds0);
    const auto t_walk = Clock::now();
    stats_.propose_s += std::chrono::duration<double>(t_walk - t0).count() - setup;
    const Proposal & prop = s.drafter->last();
    if (tree_budget > 0 && prop.lattice.n_pos > 0) {
        // the tree replaces the walk; the target's verify follows its own choice down it (finish_tree)
        s.tree = build_draft_tree(prop.lattice, std::max(tree_budget, tree_policy_.max_budget()));
        if (tree_policy_.max_budget() > 0 && prop.lattice.n_pos == max_draft_) {
            tree_policy_.observe_tree(s.tree);  // what every budget would verify (a smaller one: a prefix)
        }
        if (s.tree.size() > tree_budget) {
            for (auto * v : {&s.tree.parent, &s.tree.depth, &s.tree.token, &s.tree.cand}) v->resize(tree_budget);
            s.tree.logp.resize(static_cast<size_t>(tree_budget));
        }
        s.drafts.assign(s.tree.token.begin(), s.tree.token.end());
        s.tree_step = !s.drafts.empty();
        stats_.walk_s += seconds_since(t_walk);
        stats_.draft_s += seconds_since(t0);
        return;
    }
    if (tree_policy_.max_budget() > 0 && prop.lattice.n_pos == max_draft_) {
        tree_policy_.observe_tree(build_draft_tree(prop.lattice, tree_policy_.max_budget()));
    }
    WalkMode mode = opts_.walk < 0 ? (greedy ? WalkMode::Greedy : WalkMode::Sample) : static_cast<WalkMode>(opts_.walk);
    if (greedy && mode == WalkMode::Sample) {
        mode = WalkMode::Greedy;  // a greedy target accepts only its argmax: sampled drafts would be wasted
    }
    const float walk_t = mode == WalkMode::Sample ? s.sampler->params().temperature : 0.0f;
    const WalkResult w = s.drafter->walk(mode, walk_t, s.sampler->rng()(), opts_.q_top_k);
    s.drafts.assign(w.tokens.begin(), w.tokens.end());
    if (mode == WalkMode::Greedy && greedy) {
        constrain_drafts(s);
    }
    s.q.resize(s.drafts.size());
    for (size_t j = 0; j < s.drafts.size(); ++j) {
        for (int c = 0; c < w.k; ++c) {
            const size_t idx = j * static_cast<size_t>(w.k) + static_cast<size_t>(c);
            if (w.q[idx] > 0.0f) {
                s.q[j].ids.push_back(w.q_ids[idx]);
                s.q[j].probs.push_back(w.q[idx]);
            }
        }
    }
    stats_.walk_s += seconds_since(t_walk);
    stats_.draft_s += seconds_since(t0);
}

// With a grammar, the greedy walk over a DFlash2 lattice takes at each position the best
// candidate the grammar allows after the drafts before it (a copy of the slot's grammar
// follows the walk), so that constrained output keeps its acceptance; the block ends where
// no candidate is allowed. The target's verification decides as always: this only changes
// which drafts it sees.
void BatchEngine::constrain_drafts(Slot & s) {
    const Proposal & prop = s.drafter->last();
    SamplerPtr g = s.sampler->grammar_copy();
    if (!g || prop.lattice.n_pos <= 0) {
        return;
    }
    const Lattice & lat = prop.lattice;
    const int n = std::min<int>(lat.n_pos, static_cast<int>(s.drafts.size()));
    std::vector<int> order(static_cast<size_t>(lat.k));
    int prev = 0;  // position 0: every predecessor row is the anchor's
    s.drafts.clear();
    for (int i = 0; i < n; ++i) {
        const float * row = lat.row(i, prev);
        for (int c = 0; c < lat.k; ++c) order[static_cast<size_t>(c)] = c;
        std::stable_sort(order.begin(), order.end(), [row](int a, int b) { return row[a] > row[b]; });
        int pick = -1;
        for (const int c : order) {
            const llama_token t = lat.cand[static_cast<size_t>(i) * lat.k + static_cast<size_t>(c)];
            if (t >= 0 && t < target_.n_vocab() && grammar_allows(g.get(), t)) {
                pick = c;
                break;
            }
        }
        if (pick < 0) {
            break;
        }
        const llama_token t = lat.cand[static_cast<size_t>(i) * lat.k + static_cast<size_t>(pick)];
        if (llama_vocab_is_eog(target_.vocab(), t)) {
            s.drafts.push_back(t);  // nothing follows an end of generation
            break;
        }
        llama_sampler_accept(g.get(), t);
        s.drafts.push_back(t);
        prev = pick;
    }
}

void BatchEngine::add_row(llama_token token, int32_t pos, int seq, bool logits) {
    const int32_t i = batch_.n_tokens;
    batch_.token[i] = token;
    batch_.pos[i] = pos;
    batch_.n_seq_id[i] = 1;
    batch_.seq_id[i][0] = seq;
    batch_.logits[i] = logits ? 1 : 0;
    batch_.n_tokens = i + 1;
}

void BatchEngine::add_row(llama_token token, int32_t pos, const std::vector<int32_t> & seqs, bool logits) {
    const int32_t i = batch_.n_tokens;
    batch_.token[i] = token;
    batch_.pos[i] = pos;
    batch_.n_seq_id[i] = static_cast<int32_t>(seqs.size());
    std::copy(seqs.begin(), seqs.end(), batch_.seq_id[i]);
    batch_.logits[i] = logits ? 1 : 0;
    batch_.n_tokens = i + 1;
}

// The tree decoded the way llama.cpp decodes trees (examples/speculative): one sequence per
// leaf, holding a copy of the slot's context (metadata in a unified cache), and every node a
// row in the sequences of the leaves below it. A row then attends to the context and to its
// ancestors only (llama.cpp masks cells by sequence and position), and one decode computes all.
void BatchEngine::add_tree_rows(int idx, Slot & s) {
    const DraftTree & t = s.tree;
    const int n = t.size();
    std::vector<char> has_child(static_cast<size_t>(n), 0);
    for (int v = 0; v < n; ++v) {
        if (t.parent[static_cast<size_t>(v)] >= 0) has_child[static_cast<size_t>(t.parent[static_cast<size_t>(v)])] = 1;
    }
    std::vector<std::vector<int32_t>> seqs(static_cast<size_t>(n));
    s.branches.clear();
    s.node_branch.assign(static_cast<size_t>(n), -1);
    for (int leaf = 0; leaf < n; ++leaf) {
        if (has_child[static_cast<size_t>(leaf)]) continue;
        const int32_t b = n_slots() + idx * opts_.tree_budget + static_cast<int32_t>(s.branches.size());
        s.branches.push_back(b);
        for (int v = leaf; v >= 0; v = t.parent[static_cast<size_t>(v)]) {
            seqs[static_cast<size_t>(v)].push_back(b);
            if (s.node_branch[static_cast<size_t>(v)] < 0) s.node_branch[static_cast<size_t>(v)] = b;
        }
    }
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    for (const int32_t b : s.branches) {
        llama_memory_seq_rm(mem, b, -1, -1);  // nothing should be left; a failed step may have left rows
        llama_memory_seq_cp(mem, idx, b, -1, -1);
    }
    std::vector<int32_t> all = s.branches;  // pending rows: committed, so in the slot and every branch
    all.push_back(idx);
    add_pending_rows(idx, s, all);
    s.row0 = batch_.n_tokens;
    add_row(s.anchor, s.pos, s.branches, true);
    // Depth first, best child first: a row's cells come in batch order, so the first-child chain
    // sits at the cells of its positions and every path's cells increase with depth. Flash
    // attention then sums each row's keys in position order, as a chain's, gaps skipped
    // (benchmarks/tree_attention.py: bit-identical rows); the commit keeps that order (finish_tree).
    s.node_row.assign(static_cast<size_t>(n), 0);
    std::vector<int32_t> stack;
    for (int v = n - 1; v >= 0; --v) {
        if (t.parent[static_cast<size_t>(v)] < 0) stack.push_back(v);  // later siblings deeper in the stack
    }
    int32_t row = 1;
    while (!stack.empty()) {
        const int32_t v = stack.back();
        stack.pop_back();
        s.node_row[static_cast<size_t>(v)] = row++;
        add_row(t.token[static_cast<size_t>(v)], s.pos + t.depth[static_cast<size_t>(v)], seqs[static_cast<size_t>(v)],
                true);
        for (int c = n - 1; c > v; --c) {
            if (t.parent[static_cast<size_t>(c)] == v) stack.push_back(c);
        }
    }
}

void BatchEngine::add_pending_rows(int idx, Slot & s, const std::vector<int32_t> & seqs) {
    (void)idx;
    for (size_t j = 0; j < s.pending.size(); ++j) {
        add_row(s.pending[j], s.pending_pos0 + static_cast<int32_t>(j), seqs, true);
    }
}

void BatchEngine::flush_pending(int idx, Slot & s) {
    if (s.pending.empty() || s.state == State::Idle) {
        return;
    }
    try {
        batch_.n_tokens = 0;
        add_pending_rows(idx, s, {idx});
        decode_batch(true);
        s.pending.clear();
    } catch (const Error &) {
        // the sequence keeps what it held; stop() cuts the slot's history back to that
        llama_memory_seq_rm(llama_get_memory(ctx_.ctx), idx, s.pending_pos0, -1);
    }
}

void BatchEngine::remove_branches(Slot & s) {
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    for (const int32_t b : s.branches) {
        llama_memory_seq_rm(mem, b, -1, -1);
    }
    s.branches.clear();
}

void BatchEngine::add_filler_rows(int seq, int n) {
    const llama_pos p0 = llama_memory_seq_pos_max(llama_get_memory(ctx_.ctx), seq) + 1;
    if (p0 + n > opts_.n_ctx_slot) {
        return;  // no room in its stream: llama.cpp splits the batch there, which costs time only
    }
    // Fillers of plain steps (one row a slot) skip the LM head. A lazy-head verify (n > 1) wants
    // every row of the batch to output, and so does a capture of the last layer's output.
    const bool logits = n > 1 || target_.outputs_all_rows();
    for (int j = 0; j < n; ++j) {
        add_row(0, p0 + j, seq, logits);
    }
    fillers_.emplace_back(seq, p0);
    stats_.n_filler_rows += n;
}

void BatchEngine::remove_filler_rows() {
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    for (const auto & [seq, p0] : fillers_) {
        llama_memory_seq_rm(mem, seq, p0, -1);
    }
    fillers_.clear();
}

void BatchEngine::decode_batch(bool prefill, bool lazy_head) {
    // On the callback path the capture copies the batch's rows of every feature
    // layer. A batch is one ubatch (at most n_ubatch rows; one sequence, or equal
    // rows per sequence in slot order), so the graph's rows are the batch's rows in
    // order, as with the taps; any other split fails check_complete's shape test.
    const bool capturing = target_.capture_path() == CapturePath::Callback && !target_.feature_layers().empty();
    if (capturing) {
        feature_capture_->arm(target_.feature_layers(), target_.n_embd(), batch_.n_tokens);
    }
    // verify rows of drafting slots: the head runs later, for the rows each verify reaches
    const bool cut = lazy_head && target_.arm_lazy_head(batch_.n_tokens);
    // Verify rows are generation work: they run with the one-row decodes' threads (n_threads),
    // not the prompt threads (n_threads_batch, which llama.cpp takes for any batch > 1): more
    // threads than plain decoding uses spin at every graph barrier on a busy machine.
    const int32_t nt = llama_n_threads(ctx_.ctx);
    const int32_t ntb = llama_n_threads_batch(ctx_.ctx);
    const bool swap_threads = !prefill && batch_.n_tokens > 1 && nt != ntb;
    if (swap_threads) {
        llama_set_n_threads(ctx_.ctx, nt, nt);
    }
    const auto t0 = Clock::now();
    const int32_t rc = llama_decode(ctx_.ctx, batch_);
    const double dt = seconds_since(t0);
    if (swap_threads) {
        llama_set_n_threads(ctx_.ctx, nt, ntb);
    }
    stats_.decode_s += dt;
    (prefill ? stats_.prefill_decode_s : stats_.verify_decode_s) += dt;
    if (capturing) {
        feature_capture_->disarm();
    }
    target_.end_lazy_head(cut, batch_.n_tokens);
    if (rc != 0) {
        throw Error("target llama_decode failed (code " + std::to_string(rc) + ") on a batch of " +
                    std::to_string(batch_.n_tokens) + " rows");
    }
    if (capturing) {
        feature_capture_->check_complete(target_.arch());
    }
    stats_.n_steps += 1;
    stats_.n_rows += batch_.n_tokens;
}

const float * BatchEngine::row_logits(int32_t row) {
    if (target_.last_decode_lazy()) {
        return target_.lazy_logits(row);  // the head runs now, for this row only
    }
    const float * r = llama_get_logits_ith(ctx_.ctx, row);
    if (r == nullptr) {
        throw Error("target produced no logits for batch row " + std::to_string(row));
    }
    return r;
}

int BatchEngine::step(std::vector<int32_t> & counts, std::vector<llama_token> & tokens) {
    struct AddStepTime {  // also when the step throws
        double & total;
        Clock::time_point t0;
        ~AddStepTime() { total += seconds_since(t0); }
    } add_step_time{stats_.step_s, Clock::now()};
    counts.assign(slots_.size(), 0);
    tokens.assign(slots_.size() * (static_cast<size_t>(max_draft_) + 1), -1);
    for (Slot & s : slots_) {
        s.n_logprobs = 0;
    }
    int rows = 0;

    // 1. drafts. Every decoding slot verifies the same number of rows: llama.cpp
    // splits a multi-sequence batch into ubatches of equal rows per sequence,
    // so equal rows keep it one ubatch (and our rows in batch order). The
    // common draft length is the longest any slot's policy asks for.
    int n_decode = 0;
    int n_common = 0;
    std::vector<size_t> decoding;
    std::vector<int> wish(slots_.size(), 0);
    for (size_t i = 0; i < slots_.size(); ++i) {
        Slot & s = slots_[i];
        if (s.state == State::Decode && s.pos >= opts_.n_ctx_slot) {
            s.state = State::Full;
            counts[i] = -1;
        }
        if (s.state == State::Decode) {
            n_decode += 1;
            decoding.push_back(i);
            wish[i] = choose_n_draft(s);
            n_common = std::max(n_common, wish[i]);
        }
    }
    const bool adaptive = opts_.n_max < 0 && max_draft_ > 0 && costs_verify_.size() >= 2;
    if (adaptive && n_decode > 1) {
        n_common = batch_draft_length(decoding);
    }
    // While nobody drafts, a probe now and then lets the acceptance estimate
    // recover. One schedule for the engine, counted in steps (a new request
    // does not restart it: with many short requests, per-request schedules
    // probed in most of them), and one slot probes at a time, in turn.
    int probe_slot = -1;
    int n_probe = 0;
    if (opts_.n_max < 0 && max_draft_ > 0 && n_decode > 0) {
        const int n = shared_policy_.schedule(n_common);
        if (shared_policy_.probing()) {
            probe_slot = static_cast<int>(decoding[static_cast<size_t>(probe_turn_++) % decoding.size()]);
            n_probe = n;
        }
    }
    // tree_budget = auto: a tree for every decoding slot when the cost model prices it above the
    // chain's choice (or now and then as a probe), at the block's full depth; else the chain
    const int tree_b = !opts_.tree_auto ? opts_.tree_budget
                                        : auto_tree_budget(decoding, n_common, probe_slot >= 0);
    if (opts_.tree_auto && tree_b > 0) {
        n_common = max_draft_;
        probe_slot = -1;
    }
    const int share = n_decode > 0 ? batch_cap_ / n_decode - 1 : 0;
    std::map<int, std::vector<int>> groups;  // verify rows -> slots (a slot near its context end drafts less)
    for (size_t i = 0; i < slots_.size(); ++i) {
        Slot & s = slots_[i];
        if (s.state != State::Decode) {
            continue;
        }
        // the verify rows [anchor, d1..dn] must fit the slot's context
        // a probing slot drafts its probe (in a group of its own when the others do not draft)
        const int want = static_cast<int>(i) == probe_slot ? std::max(n_probe, n_common) : n_common;
        int n = s.drafter == nullptr ? 0 : std::min({want, opts_.n_ctx_slot - s.pos - 1, share});
        if (s.max_tokens > 0) {
            // no rows past the request's last token (a slot near its end may verify in a group of its own)
            n = std::max(0, std::min<int>(n, s.max_tokens - static_cast<int>(s.stats.n_generated) - 1));
        }
        const int n_pending = static_cast<int>(s.pending.size());
        n = std::max(0, std::min(n, share - n_pending));
        int tree_budget = 0;
        if (tree_b > 0 && n > 0) {
            // its rows share the batch like a chain's; a borrowed context holds no cells beyond its size
            tree_budget = std::min(tree_b, share - n_pending);
            if (borrowed_) tree_budget = std::min(tree_budget, opts_.n_ctx_slot - s.pos - 1);
        }
        draft(s, n, tree_budget);
        // a grammar may end the block early
        groups[n_pending + static_cast<int>(s.drafts.size()) + 1].push_back(static_cast<int>(i));
    }

    // 2. one target decode per group of equal rows (normally one), slots in order.
    // llama.cpp also needs the sequences of one ubatch to be consecutive: a slot
    // between two members (idle, prefilling, or in another group) would split the
    // batch, and each ubatch is a pass over the weights (a gap cost 40 -> 47 ms a
    // step of 8 slots at 2 threads). Such a slot gets n_rows filler rows after what
    // its sequence holds instead; they are cut off again right after the decode.
    for (const auto & [n_rows, members] : groups) {
        batch_.n_tokens = 0;
        const bool fill = fill_gaps_ && n_rows * (members.back() - members.front() + 1) <= batch_cap_;
        size_t next = 0;
        for (int i = members.front(); i <= members.back(); ++i) {
            if (members[next] != i) {
                if (fill) add_filler_rows(i, n_rows);
                continue;
            }
            ++next;
            Slot & s = slots_[static_cast<size_t>(i)];
            if (s.tree_step) {
                add_tree_rows(i, s);  // its pending rows first, then the anchor (row0) and the nodes
                continue;
            }
            add_pending_rows(i, s, {i});
            s.row0 = batch_.n_tokens;
            add_row(s.anchor, s.pos, i, true);
            for (size_t j = 0; j < s.drafts.size(); ++j) {
                add_row(s.drafts[j], s.pos + 1 + static_cast<int32_t>(j), i, true);
            }
        }
        const int32_t n_fillers = batch_.n_tokens - n_rows * static_cast<int32_t>(members.size());
        {
            struct RemoveFillers {  // right after the decode, also when it throws (with the trees' branches then)
                BatchEngine & engine;
                const std::vector<int> & members;
                ~RemoveFillers() {
                    engine.remove_filler_rows();
                    if (std::uncaught_exceptions() > 0) {
                        for (const int i : members) engine.remove_branches(engine.slots_[static_cast<size_t>(i)]);
                    }
                }
            } remove_fillers{*this, members};
            decode_batch(false, /*lazy_head =*/n_rows > 1);  // plain rows (one per slot) all need their head
        }
        rows += batch_.n_tokens - n_fillers;
        for (const int i : members) {
            finish_decode(i, slots_[static_cast<size_t>(i)], counts, tokens);
        }
    }

    // 3. prompt chunks, one decode per slot (a sequence alone is one ubatch), at
    // most batch_cap_ prompt rows per step so that decoding slots keep their pace
    const int n_slots_i = n_slots();
    int budget = batch_cap_;
    for (int k = 0; k < n_slots_i && budget > 0; ++k) {
        const int i = (prefill_cursor_ + k) % n_slots_i;
        Slot & s = slots_[static_cast<size_t>(i)];
        if (s.state != State::Prefill) {
            continue;
        }
        const int32_t left = static_cast<int32_t>(s.prompt.size()) - s.n_prefilled;
        const int32_t chunk = std::min(left, budget);
        batch_.n_tokens = 0;
        s.row0 = 0;
        for (int32_t j = 0; j < chunk; ++j) {
            const int32_t p = s.n_prefilled + j;
            add_row(s.prompt[static_cast<size_t>(p)], p, i, j == left - 1 || target_.outputs_all_rows());
        }
        s.n_rows = chunk;
        decode_batch(true);
        rows += chunk;
        budget -= chunk;
        finish_prefill(i, s, counts, tokens);
    }
    prefill_cursor_ = (prefill_cursor_ + 1) % n_slots_i;
    return rows;
}

void BatchEngine::finish_decode(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens) {
    s.pending.clear();  // decoded ahead of this step's rows
    if (s.tree_step) {
        finish_tree(idx, s, counts, tokens);
        return;
    }
    const auto t0 = Clock::now();
    const size_t width = static_cast<size_t>(max_draft_) + 1;
    const int n = static_cast<int>(s.drafts.size());
    const double head_s0 = target_.lazy_head_seconds();
    const LogitRows row = [this, &s](int j) { return row_logits(s.row0 + j); };
    const VerifyResult v = s.sampler->params().greedy() ? verify_greedy(s.drafts, row, *s.sampler)
                                                         : verify_stochastic(s.drafts, s.q, row, *s.sampler);
    const int k = v.n_accepted;
    if (n > 0) {
        llama_memory_seq_rm(llama_get_memory(ctx_.ctx), idx, s.pos + k + 1, -1);  // rejected drafts
    }
    // the lazy head is the target's forward finished row by row: it counts as verify decode
    const double head_s = target_.lazy_head_seconds() - head_s0;
    stats_.verify_decode_s += head_s;
    stats_.decode_s += head_s;
    stats_.verify_logic_s += seconds_since(t0) - head_s;
    if (s.sampler->params().n_logprobs >= 0) {
        s.n_logprobs = 0;
        for (int j = 0; j <= k; ++j) {  // rows the verify read: the head ran for them already
            record_logprob(s, row(j), j < k ? s.drafts[static_cast<size_t>(j)] : v.next);
        }
    }
    queue_rows(s, s.row0, k + 1, s.pos);  // anchor + accepted drafts are committed
    s.history.push_back(s.anchor);
    s.history.insert(s.history.end(), s.drafts.begin(), s.drafts.begin() + k);
    llama_token * out = tokens.data() + static_cast<size_t>(idx) * width;
    for (int j = 0; j < k; ++j) {
        out[j] = s.drafts[static_cast<size_t>(j)];
    }
    out[k] = v.next;
    counts[static_cast<size_t>(idx)] = k + 1;
    stats_.n_generated += k + 1;
    SlotStats & st = s.stats;
    st.n_generated += k + 1;
    st.n_steps += 1;
    st.n_max_used[static_cast<size_t>(n)] += 1;
    if (n > 0) {
        record_drafted_step(s, n, n, k);
        s.policy.observe(n, k);
        shared_policy_.observe(n, k);
    }
    s.pos += k + 1;
    s.anchor = v.next;
}

// A verified step that drafted: per block position (tree depth) 1..depth, whether the verify
// reached it and accepted its draft; n_drafted rows were drafted (a chain's n, a tree's nodes).
void BatchEngine::record_drafted_step(Slot & s, int depth, int n_drafted, int k) {
    SlotStats & st = s.stats;
    st.n_spec_steps += 1;
    for (int j = 0; j < depth && j <= k; ++j) {
        st.drafted[static_cast<size_t>(j)] += 1;  // the verify reached position j+1
        st.accepted[static_cast<size_t>(j)] += j < k ? 1 : 0;
    }
    stats_.n_drafts += 1;
    stats_.n_draft_tokens += n_drafted;
    stats_.n_accepted += k;
    for (int j = 0; j < k; ++j) {
        stats_.accepted_per_pos[static_cast<size_t>(j)] += 1;
    }
}

// The verify of a tree: from the anchor's row, the target chooses its next token after its
// whole sampler chain (argmax at T=0, a draw from its distribution otherwise), and the verify
// descends into the child holding that token while there is one. Every committed token is the
// target's own choice at the committed prefix, so the output is what the target alone writes
// (greedy: plain greedy decoding; sampled: its law). With fixed candidates as children
// (one-hot draft distributions) this is the multi-draft rule of SpecInfer without sampled drafts.
// Then the accepted path's cells join the slot's sequence and the branches are cut off.
void BatchEngine::finish_tree(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens) {
    const auto t0 = Clock::now();
    const double head_s0 = target_.lazy_head_seconds();
    const DraftTree & t = s.tree;
    const int n = t.size();
    const bool greedy = s.sampler->params().greedy();
    const bool want_logprobs = s.sampler->params().n_logprobs >= 0;
    if (want_logprobs) s.n_logprobs = 0;
    std::vector<int32_t> path;  // accepted nodes, by depth
    int node = -1;
    llama_token next = -1;
    SparseDist p;
    for (;;) {
        const float * logits = row_logits(s.row0 + (node < 0 ? 0 : s.node_row[static_cast<size_t>(node)]));
        llama_token x;
        if (greedy) {
            x = s.sampler->greedy(logits);
        } else {
            s.sampler->distribution(logits, p);
            x = s.sampler->draw(p);
        }
        s.sampler->accept(x);
        if (want_logprobs) record_logprob(s, logits, x);
        int child = -1;
        for (int v = node + 1; v < n; ++v) {  // children come after their parent
            if (t.parent[static_cast<size_t>(v)] == node && t.token[static_cast<size_t>(v)] == x) {
                child = v;
                break;
            }
        }
        if (child < 0) {
            next = x;
            break;
        }
        path.push_back(child);
        node = child;
    }
    const int k = static_cast<int>(path.size());
    // The path's first m nodes are the first-child chain, at the cells of their positions: they join
    // the slot's sequence where they are. The rest sat at later cells; kept there, later rows would
    // fill the freed cells below them and break the position order of the cache, so they are decoded
    // again ahead of the next step's rows (exact: the same inputs in the same order).
    int m = 0;
    while (m < k && s.node_row[static_cast<size_t>(path[static_cast<size_t>(m)])] == m + 1) ++m;
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    // the branch through the last accepted node holds exactly the anchor and the path at positions pos..pos+k
    const int32_t b = node >= 0 ? s.node_branch[static_cast<size_t>(node)] : s.branches.front();
    llama_memory_seq_cp(mem, b, idx, s.pos, s.pos + m + 1);
    remove_branches(s);
    s.pending.clear();
    for (int j = m; j < k; ++j) s.pending.push_back(t.token[static_cast<size_t>(path[static_cast<size_t>(j)])]);
    s.pending_pos0 = s.pos + m + 1;
    const double head_s = target_.lazy_head_seconds() - head_s0;
    stats_.verify_decode_s += head_s;
    stats_.decode_s += head_s;
    stats_.verify_logic_s += seconds_since(t0) - head_s;

    queue_rows(s, s.row0, 1, s.pos);  // the anchor, then the accepted nodes' rows (not adjacent in the batch)
    s.history.push_back(s.anchor);
    llama_token * out = tokens.data() + static_cast<size_t>(idx) * (static_cast<size_t>(max_draft_) + 1);
    for (int j = 0; j < k; ++j) {
        const int v = path[static_cast<size_t>(j)];
        queue_rows(s, s.row0 + s.node_row[static_cast<size_t>(v)], 1, s.pos + 1 + j);
        out[j] = t.token[static_cast<size_t>(v)];
        s.history.push_back(out[j]);
    }
    out[k] = next;
    counts[static_cast<size_t>(idx)] = k + 1;
    stats_.n_generated += k + 1;
    SlotStats & st = s.stats;
    st.n_generated += k + 1;
    st.n_steps += 1;
    st.n_tree_steps += 1;
    const int depth = *std::max_element(t.depth.begin(), t.depth.end());
    st.n_max_used[static_cast<size_t>(std::min(depth, max_draft_))] += 1;
    record_drafted_step(s, depth, n, k);
    if (tree_policy_.max_budget() > 0) {
        // the chain's estimate learns what the chain would have done: the greedy walk is the tree's
        // first-child chain (rows 1..its length), of which the path kept its first m nodes
        int chain = 0;
        for (int v = 0; v < n; ++v) chain += s.node_row[static_cast<size_t>(v)] == t.depth[static_cast<size_t>(v)];
        s.policy.observe(chain, m);
        shared_policy_.observe(chain, m);
        tree_policy_.observe_verify(t, path);
    } else {
        s.policy.observe(depth, k);
        shared_policy_.observe(depth, k);
    }
    s.pos += k + 1;
    s.anchor = next;
    s.tree_step = false;
}

void BatchEngine::finish_prefill(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens) {
    queue_rows(s, s.row0, s.n_rows, s.n_prefilled);
    s.n_prefilled += s.n_rows;
    stats_.n_prompt += s.n_rows;
    if (s.n_prefilled < static_cast<int32_t>(s.prompt.size())) {
        return;
    }
    const float * logits = row_logits(s.row0 + s.n_rows - 1);
    llama_token first;
    if (s.sampler->params().greedy()) {
        first = s.sampler->greedy(logits);
    } else {
        SparseDist p;
        s.sampler->distribution(logits, p);
        first = s.sampler->draw(p);
    }
    s.sampler->accept(first);
    if (s.sampler->params().n_logprobs >= 0) {
        s.n_logprobs = 0;
        record_logprob(s, logits, first);
    }
    s.state = State::Decode;
    s.pos = s.n_prefilled;
    s.anchor = first;
    tokens[static_cast<size_t>(idx) * (static_cast<size_t>(max_draft_) + 1)] = first;
    counts[static_cast<size_t>(idx)] = 1;
    stats_.n_generated += 1;
    s.stats.n_generated += 1;
}

void BatchEngine::record_logprob(Slot & s, const float * logits, llama_token token) {
    if (s.logprobs.size() <= static_cast<size_t>(s.n_logprobs)) {
        s.logprobs.resize(static_cast<size_t>(s.n_logprobs) + 1);
    }
    token_logprob(logits, target_.n_vocab(), token, s.sampler->params().n_logprobs,
                  s.logprobs[static_cast<size_t>(s.n_logprobs)]);
    s.n_logprobs += 1;
}

const std::vector<TokenLogprob> & BatchEngine::logprobs(int slot, int32_t & n_committed) {
    Slot & s = slot_at(slot);
    n_committed = s.n_logprobs;
    return s.logprobs;
}

void BatchEngine::measure_costs(int slot, int reps, std::vector<double> & verify_s, std::vector<double> & draft_s) {
    Slot & s = slot_at(slot);
    if (s.state != State::Decode || s.drafter == nullptr) {
        throw Error("measure_costs() needs a slot that has finished its prefill and a drafter");
    }
    reps = std::max(1, reps);
    const int max_b = max_verify_rows();
    if (s.pos + max_b > opts_.n_ctx_slot) {
        throw Error("context too small to measure costs");
    }
    flush_rows(s);
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    const BatchStats saved = stats_;  // measuring is no request's work
    std::vector<std::vector<double>> vt(static_cast<size_t>(max_b)), dt(static_cast<size_t>(max_draft_));
    for (int r = 0; r < reps; ++r) {
        // interleave the sizes so that machine noise spreads evenly over them
        for (int b = 1; b <= max_b; ++b) {
            batch_.n_tokens = 0;
            for (int j = 0; j < b; ++j) {
                add_row(s.anchor, s.pos + j, slot, true);
            }
            // as a verify runs it: with a lazy head, the decode plus the head of its first row
            const auto t0 = Clock::now();
            decode_batch(false, /*lazy_head =*/b > 1);
            (void) row_logits(0);
            vt[static_cast<size_t>(b - 1)].push_back(seconds_since(t0));
            llama_memory_seq_rm(mem, slot, s.pos, -1);
        }
        for (int n = 1; n <= max_draft_; ++n) {
            const auto t0 = Clock::now();
            s.drafter->propose(s.anchor, s.pos, n + 1);
            (void) s.drafter->walk(WalkMode::Greedy, 0.0f, 0, opts_.q_top_k);
            dt[static_cast<size_t>(n - 1)].push_back(seconds_since(t0));
        }
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    verify_s.assign(vt.size(), 0.0);
    draft_s.assign(dt.size(), 0.0);
    for (size_t i = 0; i < vt.size(); ++i) verify_s[i] = median(vt[i]);
    for (size_t i = 0; i < dt.size(); ++i) draft_s[i] = median(dt[i]);
    stats_ = saved;
}

std::string BatchEngine::stats_json() const {
    JsonWriter w;
    w.begin_object();
    w.field("n_slots", static_cast<int64_t>(slots_.size()));
    w.field("max_draft", max_draft_);
    w.field("n_steps", stats_.n_steps);
    w.field("n_rows", stats_.n_rows);
    w.field("n_filler_rows", stats_.n_filler_rows);
    w.field("lazy_head_rows", target_.lazy_head_rows());  // verify rows whose LM head ran (lazily)
    // whether verify decodes stop before the LM head (and why not, once tried and refused)
    w.field("lazy_head", head_capture_ != nullptr && feed_drafters_ && target_.lazy_head_error().empty());
    if (!target_.lazy_head_error().empty()) {
        w.field("lazy_head_error", target_.lazy_head_error());
    }
    w.field("n_prompt", stats_.n_prompt);
    w.field("n_prompt_reused", stats_.n_prompt_reused);
    w.field("n_generated", stats_.n_generated);
    w.field("n_drafts", stats_.n_drafts);
    w.field("n_draft_tokens", stats_.n_draft_tokens);
    w.field("n_accepted", stats_.n_accepted);
    w.field("draft_s", stats_.draft_s);
    w.field("decode_s", stats_.decode_s);
    w.field("inject_s", stats_.inject_s);
    w.field("propose_s", stats_.propose_s);
    w.field("walk_s", stats_.walk_s);
    w.field("verify_decode_s", stats_.verify_decode_s);
    w.field("prefill_decode_s", stats_.prefill_decode_s);
    w.field("verify_logic_s", stats_.verify_logic_s);
    w.field("graph_setup_s", stats_.graph_setup_s);
    w.field("step_s", stats_.step_s);
    w.field("drafter_graph_builds", stats_.n_graph_builds);
    w.key("accepted_per_position").begin_array();
    for (const int64_t x : stats_.accepted_per_pos) w.value(x);
    w.end_array();
    int64_t busy = 0;
    for (const Slot & s : slots_) busy += s.state == State::Idle ? 0 : 1;
    w.field("busy_slots", busy);
    if (tree_policy_.max_budget() > 0) {
        // tree_budget = auto: the steps that verified a tree (probes included), and the model's
        // expected accepted drafts per budget b = 1..max (what the next choice weighs)
        w.key("tree_auto").begin_object();
        w.field("max_budget", tree_policy_.max_budget());
        w.field("tree_steps", n_auto_tree_steps_);
        w.field("probes", n_tree_probes_);
        w.key("expected_accepted").begin_array();
        for (int b = 1; b <= tree_policy_.max_budget(); ++b) w.value(tree_policy_.expected_accepted(b));
        w.end_array();
        w.key("chain_acceptance").begin_array();
        for (const double a : shared_policy_.acceptance()) w.value(a);
        w.end_array();
        if (costs_verify_.size() >= 2) {
            // the choice one slot would make now: the best tree, against the chain's best n (0 = plain)
            const auto [b, tree_rate] = tree_policy_.best([&](int nodes) { return step_seconds(1, nodes + 1, max_draft_); });
            const int n = shared_policy_.best();
            w.field("best_budget", b);
            w.field("tree_expected_tokens", 1.0 + tree_policy_.expected_accepted(b));
            w.field("tree_rate", tree_rate);
            w.field("chain_n", n);
            w.field("chain_expected_tokens", shared_policy_.expected_tokens(n));
            w.field("chain_rate", shared_policy_.expected_rate(n));
            w.field("plain_rate", shared_policy_.expected_rate(0));
        }
        w.end_object();
    }
    w.end_object();
    return w.str();
}

std::string BatchEngine::slot_stats_json(int slot) {
    const Slot & s = slot_at(slot);
    const SlotStats & st = s.stats;
    JsonWriter w;
    w.begin_object();
    w.field("n_prompt", st.n_prompt);
    w.field("n_reused", st.n_reused);
    w.field("n_generated", st.n_generated);
    w.field("n_steps", st.n_steps);
    w.field("n_spec_steps", st.n_spec_steps);
    const int64_t after_first = std::max<int64_t>(0, st.n_generated - 1);
    w.field("tau", st.n_steps > 0 ? static_cast<double>(after_first) / static_cast<double>(st.n_steps) : 0.0);
    w.field("max_draft", max_draft_);
    auto array = [&](const char * name, const std::vector<int64_t> & v) {
        w.key(name).begin_array();
        for (const int64_t x : v) w.value(x);
        w.end_array();
    };
    array("drafted_per_position", st.drafted);
    array("accepted_per_position", st.accepted);
    array("n_max_histogram", st.n_max_used);
    w.field("n_tree_steps", st.n_tree_steps);
    w.key("acceptance_estimate").begin_array();
    for (const double a : s.policy.acceptance()) w.value(a);
    w.end_array();
    w.end_object();
    return w.str();
}

}  // namespace pdf2
