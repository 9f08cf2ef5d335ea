#include "engine/batch_engine.h"

#include "common/errors.h"
#include "common/json_writer.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <exception>
#include <string>

namespace pdf2 {

namespace {

constexpr int MAX_SLOTS = 64;
constexpr uint32_t BATCH_ROWS = 512;
constexpr int MAX_TREE_BUDGET = 255;

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
    const int rows = o.tree_rows();
    const int64_t total = (static_cast<int64_t>(o.n_ctx_slot) + (rows > 0 ? rows + 1 : 0)) * o.n_slots;
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
    if (rows > 0) {
        // a tree's branch sequences share the slot's cells: one stream for all (a copy of the
        // context into a branch is then metadata only), and a sequence per branch
        const int64_t n_seq = static_cast<int64_t>(o.n_slots) * (1 + o.tree_branches());
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

std::vector<int32_t> feature_layers(const std::vector<Drafter *> & drafters, const BatchEngineOptions & o) {
    if (!o.drafts() || drafters.empty() || drafters[0] == nullptr) {
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
    const int branches = o.tree_branches();
    if (branches > 0 && static_cast<int64_t>(llama_n_seq_max(t.ctx)) < 1 + static_cast<int64_t>(branches)) {
        throw Error("tree verification of " + std::to_string(branches) + " branches needs a target context with " +
                    std::to_string(1 + branches) + " sequences and a unified KV cache, this one has " +
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
      ctx_(make_context(model, opts, opts.verifies_blocks() ? &own_capture_ : nullptr), true),
      feature_capture_(capture_for(model, feature_layers(drafters, opts))),
      head_capture_(opts.verifies_blocks() ? &own_capture_ : nullptr),
      target_(ctx_.ctx, feature_layers(drafters, opts), feature_capture_) {
    init(drafters, head_capture_ != nullptr);
}

BatchEngine::BatchEngine(const BorrowedTarget & t, Drafter * drafter, const BatchEngineOptions & opts)
    : opts_(borrowed_options(t, opts)),
      ctx_(t.ctx, false),
      feature_capture_(t.feature_capture),
      head_capture_(t.head_capture),
      target_(t.ctx, feature_layers({drafter}, opts), t.feature_capture),
      borrowed_(true) {
    if (opts.drafts() && drafter == nullptr) {
        throw Error("speculative decoding needs a drafter (or n_max = 0 for plain decoding)");
    }
    init(drafter != nullptr ? std::vector<Drafter *>{drafter} : std::vector<Drafter *>{}, head_capture_ != nullptr);
}

void BatchEngine::init(const std::vector<Drafter *> & drafters, bool has_head) {
    const BatchEngineOptions & opts = opts_;
    if (opts.tree_budget < 0 || opts.tree_budget > MAX_TREE_BUDGET) {
        throw Error("tree budget must be in 0.." + std::to_string(MAX_TREE_BUDGET) + ", got " +
                    std::to_string(opts.tree_budget));
    }
    if (opts.context_nodes < 0 || opts.context_nodes > MAX_TREE_BUDGET) {
        throw Error("context tree nodes must be in 0.." + std::to_string(MAX_TREE_BUDGET) + ", got " +
                    std::to_string(opts.context_nodes));
    }
    tree_branches_ = opts.tree_branches();
    slots_.resize(static_cast<size_t>(opts.n_slots));
    if (opts.drafts()) {
        init_drafters(drafters, has_head);
    } else if (has_head && opts.context_nodes > 0) {
        target_.set_head_capture(head_capture_);  // context drafts alone: their rejected rows need no head
    }
    if (opts.tree_auto && (opts.tree_budget < 1 || !opts.drafts())) {
        throw Error("an automatic tree budget needs a largest budget >= 1 and a drafter");
    }
    const int tree_max_budget = opts.tree_auto && max_draft_ > 0 ? opts.tree_budget : 0;
    cost_model_ = CostModel(max_draft_, tree_max_budget);
    source_kit_.lattice = {LatticeKit(max_draft_, tree_max_budget), LatticeKit(max_draft_, tree_max_budget)};
    target_.claim();
    batch_cap_ = target_.n_batch();
    const llama_model * model = llama_get_model(ctx_.ctx);
    const bool cells_cut = !llama_model_is_recurrent(model) && !llama_model_is_hybrid(model);  // by position
    // (a unified cache, as trees take, splits a batch in row order whatever its sequences)
    fill_gaps_ = cells_cut && tree_branches_ == 0;
    // (only this slot's sequences hold cells past its position)
    cut_trees_at_once_ = cells_cut && opts.n_slots == 1;
    if (batch_cap_ < opts.n_slots) {
        throw Error("target batch (" + std::to_string(batch_cap_) + " rows) is smaller than the number of slots");
    }
    batch_ = llama_batch_init(batch_cap_, 0, std::max(1, tree_branches_));  // a tree's anchor is in every branch
    // context paths may go deeper than the drafter's block
    step_width_ = std::max(max_draft_, opts.context_nodes > 0 ? kContextMaxDepth : 0);
    stats_.set_step_width(step_width_);
    if (feed_drafters_) {
        // feature rows are copied at every step and prompt chunk: buffers of their largest size
        // from the start (address space only until used), so that requests of varying lengths
        // do not reallocate multi-MB vectors and fragment the heap (a soak's RSS crept up)
        const size_t width = static_cast<size_t>(target_.feature_width());
        DFlashSourceOptions source_opts;
        source_opts.selector = opts.selector;
        source_opts.q_top_k = opts.q_top_k;
        source_opts.feature_width = target_.feature_width();
        source_opts.max_draft = max_draft_;
        for (Slot & s : slots_) {
            s.feed().features.reserve(static_cast<size_t>(batch_cap_ + max_draft_ + 1) * width);
            s.feed().positions.reserve(static_cast<size_t>(batch_cap_ + max_draft_ + 1));
            s.sources().add(std::make_unique<DFlashDraftSource>(*s.drafter(), s.feed(),
                                                                       source_kit_.lattice, target_.vocab(), source_opts));
        }
    }
    if (opts.context_nodes > 0) init_context();
}

// One drafter per slot, each its own, fitting the target; max_draft_ = the smallest block.
void BatchEngine::init_drafters(const std::vector<Drafter *> & drafters, bool has_head) {
    const BatchEngineOptions & opts = opts_;
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
        slots_[i].set_drafter(d);
    }
    if (opts.draft_length == DraftLength::Fixed) {
        max_draft_ = std::min(max_draft_, opts.n_max);
    }
    if (opts.max_draft) {
        max_draft_ = std::min(max_draft_, *opts.max_draft);
    }
    feed_drafters_ = true;
    if (has_head) {
        target_.set_head_capture(head_capture_);
    }
}

BatchEngine::~BatchEngine() { llama_batch_free(batch_); }

CallbackCapture * BatchEngine::capture_for(const llama_model * model, const std::vector<int32_t> & layers) {
    if (model == nullptr || layers.empty() || capture_path(model_arch(model)) != CapturePath::Callback) {
        return nullptr;  // no features wanted, or llama.cpp's own taps give them
    }
    return &own_capture_;
}

void BatchEngine::queue_rows(Slot & s, int32_t row0, int32_t n, int32_t pos0) {
    std::vector<int32_t> rows(static_cast<size_t>(std::max(0, n)));
    for (int32_t i = 0; i < n; ++i) rows[static_cast<size_t>(i)] = row0 + i;
    queue_rows(s, rows, pos0);
}

// The features of committed rows (batch rows `rows`, at positions pos0, pos0 + 1, ...) for the drafter.
void BatchEngine::queue_rows(Slot & s, const std::vector<int32_t> & rows, int32_t pos0) {
    if (!feed_drafters_ || rows.empty() || !target_.feeding()) {
        return;  // (a starved plain step: the drafter does without these rows)
    }
    const StepLedger::Scope features(stats_.ledger(), Part::Features);
    DrafterFeed & feed = s.feed();
    target_.append_features(rows.data(), static_cast<int32_t>(rows.size()), feed.features);
    for (size_t i = 0; i < rows.size(); ++i) {
        feed.positions.push_back(pos0 + static_cast<int32_t>(i));
    }
}

void BatchEngine::flush_rows(Slot & s) {
    DrafterFeed & feed = s.feed();
    if (feed.positions.empty()) {
        return;
    }
    const StepLedger::Scope inject(stats_.ledger(), Part::Inject);
    Drafter & drafter = *s.drafter();
    const double setup0 = drafter.graph_setup_seconds();
    const uint64_t builds0 = drafter.n_graph_builds();
    drafter.inject(feed.features.data(), static_cast<size_t>(target_.feature_width()), feed.positions.data(),
                   static_cast<int>(feed.positions.size()));
    feed.features.clear();
    feed.positions.clear();
    stats_.ledger().add(Part::GraphSetup, drafter.graph_setup_seconds() - setup0);
    stats_.graph_builds(static_cast<int64_t>(drafter.n_graph_builds() - builds0));
}

// A step: the verify rows, then prompt chunks; the cost model learns the host work of steps that
// prefilled nothing, and the device's of those that were one decode.
int BatchEngine::step(std::vector<int32_t> & counts, std::vector<llama_token> & tokens) {
    StepLedger & ledger = stats_.ledger();
    const double host0 = ledger.host();
    // the device's work but the lazy head's, which observe_device takes as priced (below)
    const auto decode_sync = [&] { return ledger.seconds(Part::Decode) + ledger.seconds(Part::Sync); };
    const double decode_sync0 = decode_sync();
    const int64_t read0 = target_.lazy_head_rows_read();
    VerifyShape verify;
    int prefill_rows = 0;
    {
        const StepLedger::Scope other(ledger, Part::Other);  // what the parts inside do not name
        verify = verify_step(counts, tokens);
        prefill_rows = prefill_chunks(counts, tokens);
    }
    if (verify.rows + prefill_rows > 0) ledger.end_step(verify.rows + prefill_rows);
    if (verify.rows > 0 && prefill_rows == 0) {
        cost_model_.observe_host(verify.plain, verify.rows, ledger.host() - host0);
        if (verify.decodes == 1) {
            // The lazy head as priced (a product per row read), not as it ran: where it runs rows in
            // groups (TargetRunner::head_rows) deep verifies cost less than priced and shallow ones
            // more, which the one scale the verifies learn cannot hold (on the F32 stand-in it made
            // the lattice look cheap in chat, where verifies read one or two rows).
            const auto read = static_cast<int>(target_.lazy_head_rows_read() - read0);
            const double device_s = decode_sync() - decode_sync0 + cost_model_.costs().head_s * read;
            const int extra_heads = read - verify.slots;  // the table reads one a slot
            cost_model_.observe_device(verify.plain, verify.slots, verify.rows_per_slot, extra_heads, device_s);
        }
    }
    return verify.rows + prefill_rows;
}

// Plan, draft, then per group of equal rows build the batch, decode, verify and commit.
BatchEngine::VerifyShape BatchEngine::verify_step(std::vector<int32_t> & counts, std::vector<llama_token> & tokens) {
    counts.assign(slots_.size(), 0);
    tokens.assign(slots_.size() * (static_cast<size_t>(step_width_) + 1), -1);
    for (Slot & s : slots_) {
        s.clear_logprobs();
    }
    StepPlan plan = [&] {
        const StepLedger::Scope planning(stats_.ledger(), Part::Plan);
        for (size_t i = 0; i < slots_.size(); ++i) {
            if (slots_[i].fill(opts_.n_ctx_slot)) counts[i] = -1;  // its context is full
        }
        return plan_step(slot_views());
    }();
    const Decodes decodes = group_decodes(draft_blocks(plan));
    if (!plan.decoding.empty()) stats_.step_decided(std::move(plan.decisions));
    VerifyShape shape;
    for (const auto & [n_rows, members] : decodes) {
        // a plain step feeds the drafter only where its copies cost little (StepCosts::starve_plain)
        feed_rows_ = !(n_rows == 1 && cost_model_.unfed_plain());
        shape.plain = shape.plain && n_rows == 1;
        if (!feed_rows_ && feed_drafters_) stats_.unfed_step();
        const int32_t n_fillers = add_group_rows(n_rows, members);
        decode_group(n_rows, members);
        shape.rows += batch_.n_tokens - n_fillers;
        shape.decodes += 1;
        shape.slots = static_cast<int>(members.size());
        shape.rows_per_slot = n_rows;
        for (const int i : members) {
            Slot & s = slots_[static_cast<size_t>(i)];
            s.pending_decoded();  // ahead of this step's rows
            if (s.rows().block.is_tree) {
                commit_tree(i, s, counts, tokens);
            } else {
                commit_chain(i, s, counts, tokens);
            }
        }
    }
    return shape;
}

}  // namespace pdf2
