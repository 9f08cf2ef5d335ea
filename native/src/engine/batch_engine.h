// BatchEngine: the draft-verify loop (shared doc section 4), the one the
// Python API, the CLI and the server all run. Several requests at once
// (continuous batching, as llama-server does it): each slot is its own
// llama.cpp sequence (seq_id = slot index) in ONE target context, with its own
// drafter (K/V cache), sampler and draft-length policy. One step drafts a block
// for every decoding slot, verifies all their blocks in a single llama_decode,
// then prefills a chunk of any newly started prompt. A slot started between two
// steps joins at the next one.
//
// The context is the engine's own (the server: n_slots sequences), or one it
// borrows with a single slot (the Speculator runs in a llama-cpp-python Llama's
// context; the Llama may decode there between requests, so a borrowed slot
// keeps no prompt cache).
#pragma once

#include "engine/cost_model.h"
#include "engine/draft_length.h"
#include "engine/draft_sources.h"
#include "engine/engine_stats.h"
#include "engine/step_ledger.h"
#include "engine/path_calibration.h"
#include "engine/slot.h"
#include "drafter/draft_tree.h"
#include "drafter/drafter.h"
#include "capture/feature_capture_callback.h"
#include "engine/target_runner.h"
#include "engine/target_sampling.h"
#include "engine/tree_budget.h"

#include <llama.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace pdf2 {

class JsonWriter;

// How many drafts a step verifies.
enum class DraftLength {
    Plain,     // none: plain decoding (no drafter)
    Fixed,     // the block: n_max, capped by the drafter's block and the target's batch
    Adaptive,  // each step's from the cost model (draft_length.h)
};

struct BatchEngineOptions {
    int n_slots = 1;
    int32_t n_ctx_slot = 4096;  // context of each slot (the KV cache holds n_slots x this)
    int n_threads = 0;          // one-row decodes; <= 0: llama.cpp's default
    int n_threads_batch = 0;    // larger decodes; <= 0: llama.cpp's default
    int flash_attn = -1;        // -1 auto, 0 off, 1 on
    DraftLength draft_length = DraftLength::Adaptive;
    int n_max = 0;                    // DraftLength::Fixed: drafts per block
    std::optional<int> max_draft;     // a cap on any step's drafts (exact mode keeps verify batches small)
    std::optional<SelectorMode> selector;  // none: sample when the target samples, else greedy
    int q_top_k = 16;                 // DFlash1: support of the draft distribution when sampling
    // > 0: a step verifies the best-first tree of this many drafted nodes over the DFlash2 lattice
    // (draft_tree.h) instead of the greedy selector's chain, in the same one decode: each node is a row
    // in the sequences of every leaf below it (llama.cpp's own way to decode a tree), so that it
    // attends to the committed context and its ancestors only. Needs a unified KV cache and
    // n_slots * (1 + tree_budget) sequences: an own context is made so; a borrowed one must be.
    int tree_budget = 0;
    // tree_budget is then the largest budget: each step's comes from the cost model (tree_budget.h),
    // 0 = the chain's choice (draft_length.h); the costs must include verifies of tree_budget+1 rows
    bool tree_auto = false;
    // > 0: context drafts (context_draft_source.h) may run: a step then verifies the context's
    // tree, or one merged with the lattice's, of at most this many nodes (kContextBranches leaves);
    // each request's mode from set_context_drafts()
    int context_nodes = 0;

    bool drafts() const { return draft_length != DraftLength::Plain; }
    // steps verify drafted rows, the drafter's or the context's (the lazy LM head serves them)
    bool verifies_blocks() const { return drafts() || context_nodes > 0; }
    // a slot's tree rows (the lattice tree's nodes, or a context or merged tree's), and its branch
    // sequences (one per leaf: a context or merged tree keeps to kContextBranches leaves)
    int tree_rows() const { return std::max(tree_budget, context_nodes); }
    int tree_branches() const { return std::max(tree_budget, context_nodes > 0 ? kContextBranches : 0); }
};

// A context the engine decodes in without owning it (one slot, sequence 0).
struct BorrowedTarget {
    llama_context * ctx = nullptr;
    CallbackCapture * feature_capture = nullptr;  // its cb_eval user data when features come that way, else null
    CallbackCapture * head_capture = nullptr;     // its cb_eval user data for the lazy LM head, else null
};

class BatchEngine {
  public:
    // model: the target (it must outlive the engine). drafters: one per slot
    // (each with its own cache), or empty for plain decoding (n_max = 0).
    BatchEngine(llama_model * model, const std::vector<Drafter *> & drafters, const BatchEngineOptions & opts);
    // One slot in a context the caller owns (opts.n_slots, n_ctx_slot, threads and
    // flash_attn are the context's). drafter may be null for plain decoding.
    BatchEngine(const BorrowedTarget & target, Drafter * drafter, const BatchEngineOptions & opts);
    ~BatchEngine();
    BatchEngine(const BatchEngine &) = delete;
    BatchEngine & operator=(const BatchEngine &) = delete;

    int n_slots() const { return static_cast<int>(slots_.size()); }
    int max_draft() const { return max_draft_; }
    // tokens a step commits per slot at most, minus one: the drafter's block, or a context path's depth
    int step_width() const { return step_width_; }
    // rows of the largest verify the cost model prices: the chain's, or an auto tree's
    int max_verify_rows() const { return std::max({max_draft_, cost_model_.max_tree_budget(), opts_.context_nodes}) + 1; }
    int32_t n_ctx_slot() const { return opts_.n_ctx_slot; }

    // plain_s: a plain decode's step without the drafter's features (0: not measured); head_s: the
    // lazy head's product for one row (0: none); learn: the costs were measured here and the steps
    // as they run correct them (CostModel::observe_device). verify_full_s: the same decodes with
    // every row's LM head in the decode's graph (the full head; empty or zeros: not measured). With
    // both measured the engine chooses the head its verifies run (choose_head) and prices with it.
    void set_costs(const std::vector<double> & verify_s, const std::vector<double> & draft_s, double plain_s = 0.0,
                   double head_s = 0.0, bool learn = false, const std::vector<double> & verify_full_s = {});
    // Times target decodes of B = 1..max_verify_rows() rows, drafter blocks of n = 1..max_draft
    // drafts, and a plain decode that skips the drafter's features, on a slot that has finished its
    // prefill. Where the lazy head can run, verify_s holds its decodes (and head_s its product) and
    // verify_full_s the same decodes with the full head; else verify_full_s is empty.
    void measure_costs(int slot, int reps, std::vector<double> & verify_s, std::vector<double> & draft_s,
                       double & plain_s, double & head_s, std::vector<double> & verify_full_s);
    // Which LM head the verifies run: chosen from the measured costs (Auto), or set.
    enum class HeadMode { Auto = 0, Lazy = 1, Full = 2 };
    void set_head_mode(HeadMode mode);
    // verify decodes of at most this many rows compute every row's head in their graph (the full
    // head); larger ones cut it (the lazy head). 0: none
    int full_head_rows() const { return full_head_rows_; }
    // Whether some verify decodes stop before the LM head (the lazy head here, working, and not every
    // verify size given the full head): the stats' `head` and `lazy_head` read it.
    bool verifies_cut_head() const {
        return head_capture_ != nullptr && target_.lazy_head_error().empty() && full_head_rows_ < max_verify_rows();
    }

    // Queues a prompt on an idle slot; it is prefilled by the next step(s),
    // from the first token where it differs from what the slot holds (the
    // previous request's prompt and answer: a shared system prompt is reused,
    // as llama-server and llama-cpp-python reuse it).
    // max_tokens > 0: the request wants at most that many tokens, so a step drafts
    // at most what is still wanted minus one (rows verified past the end would be
    // thrown away; upstream caps its drafts the same way). <= 0: no cap.
    void start(int slot, const std::vector<llama_token> & prompt, const SamplingParams & sampling,
               int32_t max_tokens = 0);
    // The same with a sampler chain built beforehand (pdf2_prepare_sampling, on another thread, so
    // that a long grammar parse never holds up the step loop). Takes it, also when it throws.
    void start(int slot, const std::vector<llama_token> & prompt, std::unique_ptr<TargetSampler> sampler,
               int32_t max_tokens = 0);
    // Frees a slot for the next request; a no-op on an idle slot. Its K/V
    // rows stay for prefix reuse.
    void stop(int slot);
    // Context drafts for the slot's next requests: off, their own context, or also the past
    // outputs of `key` (the global cache: one per API key). Needs context_nodes > 0.
    void set_context_drafts(int slot, ContextDrafts mode, const std::string & key);
    // Adds a registered candidate source (draft_sources.cpp, e.g. "repeat") to every slot; its
    // offers join the merged trees. Needs context_nodes > 0 (the tree rows) and idle slots.
    void add_draft_source(const std::string & name);
    // Bounds of the global context cache: keys kept (least recently used out), and per key its past
    // outputs and their tokens. Empties the cache.
    void set_context_cache_limits(size_t max_keys, int max_documents, size_t max_tokens);
    // Rows per lazy head product (TargetRunner::set_head_rows: 0 = time and choose).
    // A group set (> 0) runs the lazy head (exact batches set one row: set_exact_batches).
    void set_lazy_head_group(int32_t rows);
    // Rows of `prompt` that start() on this idle slot would reuse (what it holds
    // from its last request): a scheduler gives a request the slot that holds most.
    int32_t cached_prefix(int slot, const std::vector<llama_token> & prompt);
    // Exact mode over a target whose matmul kernels switch with the batch size (repacked or
    // K-quant weights, exactness.py): a row then equals plain decoding's only when decoded in the
    // batch shape plain decoding gives it. max_rows: the largest batch whose rows equal batch-1
    // rows; no decode of verify rows holds more (a group of slots larger than that is verified in
    // several decodes, and no filler rows join it), prompts are prefilled in plain decoding's
    // chunks (n_batch rows from position 0, a slot at a time), and a slot reuses only whole such
    // chunks of its last prompt. 0: off (any batch shape).
    void set_exact_batches(int max_rows);

    // One target decode for all busy slots. counts[s]: tokens committed for
    // slot s (0 = none this step, -1 = its context is full), written to
    // tokens[s * (max_draft+1) ...]. Returns the rows decoded (0 = all idle).
    int step(std::vector<int32_t> & counts, std::vector<llama_token> & tokens);

    const BatchStats & stats() const { return stats_.engine(); }
    std::string stats_json() const;
    // The slot's current (or last) request: its counters and acceptance estimate.
    std::string slot_stats_json(int slot);

    // Log-probabilities of the tokens the slot's last step committed (empty unless
    // its request asked for logprobs; entries past n_committed are stale).
    const std::vector<TokenLogprob> & logprobs(int slot, int32_t & n_committed);

    // Hands a borrowed context back as it was (no layer-input taps); call while it lives.
    void release_target() { target_.release(); }

  private:
    using State = Slot::State;

    // One step's plan (step_planner.cpp): per decoding slot, how many drafts and tree nodes, and
    // from which sources (by index: no source is special).
    struct SlotPlan {
        int n_drafts = 0;
        int tree_budget = 0;    // > 0: a tree of at most this many nodes
        int proposer = -1;      // the source that proposes the slot's blocks (the drafter's), -1: none
        // the merged tree (merged_draft_source.h) over the known candidates, with the proposer's
        // block or (propose false) alone; its deepest path and most nodes
        bool merged = false;
        bool propose = false;
        int merge_depth = 0;
        int merge_nodes = 0;
        double expected = 1.0;  // the tokens the cost model expects it to commit
        int decision = -1;      // the decision (StepPlan::decisions) its plan came from (-1: none)
        // what the stats call it (engine_stats.h, PlanRun)
        std::string name() const;
    };
    struct StepPlan {
        std::vector<size_t> decoding;  // slots that verify this step
        int common_length = 0;         // drafts every decoding slot verifies (equal rows: one ubatch)
        int probe_slot = -1;           // the slot that probes a block while the others decode plainly
        int probe_length = 0;
        int tree_budget = 0;           // the step's tree budget (0: chains)
        int row_share = 0;             // batch rows each decoding slot may take after its anchor
        std::vector<SlotPlan> slots;   // per slot (idle ones: nothing)
        std::vector<Decision> decisions;  // the cost model's, in the order made (the plan acts on them)
        // records a decision and returns its chosen option: for one slot, or every decoding slot
        // with a proposer
        const PricedOption & decide(size_t slot, Decision d);
        const PricedOption & decide_all(Decision d);
    };
    // What the planner reads of a decoding slot (slot_views): the slot as it is, and its sources' offers.
    struct SlotView {
        size_t index = 0;
        const Slot * slot = nullptr;
        int proposer = -1;          // the source that proposes its blocks (-1: none)
        Offer proposal;             // ... its offer
        std::vector<double> known;  // the known candidates' expected accepted drafts by nodes (size <= 1: none)
        int merge_depth = 0, merge_nodes = 0;  // ... their deepest path and most nodes
    };
    using Groups = std::map<int, std::vector<int>>;  // verify rows -> slots with that many

    // step_planner.cpp
    std::vector<SlotView> slot_views();  // asks the decoding slots' sources for their offers
    StepPlan plan_step(const std::vector<SlotView> & views);  // reads the views only
    int row_share(int n_decoding) const;
    int slot_draft_length(StepPlan & plan, const SlotView & v);  // the cost model's wish, before the batch's caps
    SlotPlan plan_slot(const StepPlan & plan, const SlotView & v) const;  // the caps: context, max_tokens, share, pending
    Groups draft_blocks(const StepPlan & plan);
    void price_plan(const StepPlan & plan, size_t i);  // what the step's decisions priced the slot's plan at
    void draft(size_t i, const SlotPlan & p);
    DraftRequest draft_request(Slot & s, int n, int tree_budget) const;
    static double expected_committed(const SlotPlan & p, const SlotView & v);  // a chain's or tree's plan
    void plan_context(StepPlan & plan, const std::vector<SlotView> & views);  // known candidates alone or merged
    void draft_merged(Slot & s, const SlotPlan & p, DraftBlock & block);  // into the slot's block
    void record_draft_times(const DraftBlock & block);
    int context_prefix(const DraftBlock & b) const;  // the merged tree's best prefix

    // batch_builder.cpp
    int32_t add_group_rows(int n_rows, const std::vector<int> & members);  // returns the filler rows
    void add_chain_rows(int idx, Slot & s);
    void add_row(llama_token token, int32_t pos, int seq, bool logits);
    void add_row(llama_token token, int32_t pos, const std::vector<int32_t> & seqs, bool logits);
    // a tree slot's rows: the anchor, then its nodes, each in the branch sequences below it
    void add_tree_rows(int idx, Slot & s);
    void sync_branch(int idx, int32_t b);        // branch b holds the slot's committed context
    void cut_branches(int idx, llama_pos p0);    // the slot's branches lose positions >= p0
    void remove_branches(Slot & s);  // the tree's branch sequences emptied (a failed decode)
    void add_pending_rows(const Slot & s, const std::vector<int32_t> & seqs);
    void flush_pending(int idx, Slot & s);  // decodes them alone (a request ends with some)
    // n rows for sequence seq after what it holds, when its stream has room: see add_group_rows()
    void add_filler_rows(int seq, int n);
    void remove_filler_rows();
    void decode_group(int n_rows, const std::vector<int> & members);
    void decode_batch(bool prefill, bool lazy_head = false);  // prefill: a prompt chunk (else verify rows)
    const float * row_logits(int32_t row);  // of the last decode (lazily computed head rows included)
    int prefill_chunks(std::vector<int32_t> & counts, std::vector<llama_token> & tokens);

    // batch_engine.cpp: a step's verify rows; batch_engine_commits.cpp: the commits of verified rows
    struct VerifyShape {
        int rows = 0;           // verified (fillers left out)
        bool plain = true;      // none of them a draft
        int decodes = 0;        // groups of equal rows, a target decode each
        int slots = 0;          // the last group's slots, and each one's rows (fillers included)
        int rows_per_slot = 0;
    };
    VerifyShape verify_step(std::vector<int32_t> & counts, std::vector<llama_token> & tokens);
    void commit_chain(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens);
    void commit_tree(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens);
    // (node_accepted: a tree's nodes on the accepted path, else null)
    void commit_tokens(int idx, Slot & s, const std::vector<llama_token> & accepted, llama_token next,
                       const std::vector<char> * node_accepted, std::vector<int32_t> & counts,
                       std::vector<llama_token> & tokens);
    void commit_prefill(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens);
    void cut_tree_at_once(const Slot & s, const std::vector<int32_t> & path, int n_in_place);
    void write_context_stats(JsonWriter & w) const;  // batch_engine_stats.cpp
    void write_head_stats(JsonWriter & w) const;
    void write_ledger(JsonWriter & w) const;
    void write_source_stats(JsonWriter & w, const Slot * slot) const;  // one slot's request, or all
    void init_context();  // batch_engine_context.cpp: the slots' context sources, the global cache
    void queue_rows(Slot & s, int32_t row0, int32_t n, int32_t pos0);  // rows row0.. at positions pos0..
    void queue_rows(Slot & s, const std::vector<int32_t> & rows, int32_t pos0);
    int32_t reuse_prefix(Slot & s, int slot, const std::vector<llama_token> & prompt);
    int32_t reusable_prefix(const Slot & s, const std::vector<llama_token> & prompt) const;
    using Decodes = std::vector<std::pair<int, std::vector<int>>>;  // verify rows, slots: one decode each
    Decodes group_decodes(const Groups & groups) const;  // the groups, split at exact_rows_
    void flush_rows(Slot & s);
    void init(const std::vector<Drafter *> & drafters, bool has_head);
    void init_drafters(const std::vector<Drafter *> & drafters, bool has_head);
    Slot & slot_at(int slot);
    // &own_capture_ when the target's features need the evaluation callback (no taps), else null
    CallbackCapture * capture_for(const llama_model * model, const std::vector<int32_t> & layers);

    // The context decoded in: made by the engine (freed with it) or borrowed.
    struct TargetContext {
        llama_context * ctx = nullptr;
        bool owned = false;
        TargetContext(llama_context * c, bool own) : ctx(c), owned(own) {}
        TargetContext(const TargetContext &) = delete;
        TargetContext & operator=(const TargetContext &) = delete;
        ~TargetContext() {
            if (owned) llama_free(ctx);
        }
    };


    BatchEngineOptions opts_;
    CallbackCapture own_capture_;  // an own context's cb_eval user data: declared before ctx_, so it outlives it
    TargetContext ctx_;            // declared before target_: freed after it
    CallbackCapture * feature_capture_ = nullptr;  // features through the callback path, else null (taps)
    CallbackCapture * head_capture_ = nullptr;     // the lazy LM head's callback, else null
    TargetRunner target_;
    bool borrowed_ = false;  // the caller's context: claimed and cleared per request, no prompt cache
    // what steps cost and each option commits, and every choice among them (declared before
    // slots_: their lattice sources learn into its tree policy and calibration)
    CostModel cost_model_;
    // The head the verifies run (set_costs, set_head_mode): the tables as given, and the choice.
    struct GivenCosts {
        std::vector<double> verify_s, draft_s, verify_full_s;
        double plain_s = 0.0, head_s = 0.0;
        bool learn = false, given = false;
    } given_costs_;
    HeadMode head_mode_ = HeadMode::Auto;
    int full_head_rows_ = 0;
    HeadChoice head_choice_;
    void apply_costs();  // the cost model's tables for the head chosen from given_costs_
    double timed_verify(int slot, int b, bool lazy, bool & cut_seen, std::vector<double> & head_times);
    SourceKit source_kit_;  // what each kind of draft source learns over all slots (before slots_: they hold it)
    std::vector<Slot> slots_;
    int max_draft_ = 0;
    int step_width_ = 0;     // max_draft_, or deeper context paths
    int tree_branches_ = 0;  // branch sequences per slot (a tree's leaves)
    bool feed_drafters_ = false;
    bool feed_rows_ = true;  // this decode's verify rows feed the drafter
    llama_batch batch_;
    int32_t batch_cap_ = 0;
    // filler rows need sequences whose K/V can be cut back (not recurrent or hybrid memory)
    bool fill_gaps_ = false;
    bool cut_trees_at_once_ = false;  // one slot: a tree's rejected cells go in one walk (cut_tree_at_once)
    int exact_rows_ = 0;  // > 0: set_exact_batches (decodes in plain decoding's shapes)
    std::vector<std::pair<int, int32_t>> fillers_;  // this decode's filler rows: sequence, first position
    int prefill_cursor_ = 0;  // round-robin start for prompt chunks
    unsigned probe_turn_ = 0;  // round-robin choice of the slot that probes
    StatsRecorder stats_;  // the engine's and each request's counters, and the step ledger
};

}  // namespace pdf2
