// A slot of the engine: one request at a time on one llama.cpp sequence. The slot owns its
// lifecycle (a request begins, its prompt is prefilled, it decodes until it ends or fills its
// context) and the bookkeeping of what it commits (history, position, anchor, pending rows) and of
// its step's rows and plan; the engine owns the decodes, the KV cells and the stats. Its data is
// private: the engine changes it through methods that say what happens, and the planner and the
// stats read it through const accessors.
#pragma once

#include "drafter/drafter.h"
#include "engine/draft_sources.h"
#include "engine/engine_stats.h"
#include "engine/target_sampling.h"

#include <llama.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pdf2 {

class Slot {
  public:
    enum class State { Idle, Prefill, Decode, Full };

    // The request a slot serves, from begin() to end().
    struct Request {
        std::vector<llama_token> prompt;
        int32_t max_tokens = 0;  // > 0: drafts stop at the request's last token
        std::unique_ptr<TargetSampler> sampler;
        SlotStats stats;
        std::vector<TokenLogprob> logprobs;  // of the tokens the last step committed (when asked for)
        int32_t n_logprobs = 0;              // ... how many of them are valid
    };
    // What the slot's target sequence holds, and where it goes on.
    struct Sequence {
        // tokens at positions 0.. whose K/V the slot's sequence holds (and its
        // drafter, cached or queued); kept after stop() so that the next
        // request on the slot prefills only what differs from its prompt
        std::vector<llama_token> history;
        int32_t n_prefilled = 0;
        int32_t pos = 0;  // next position to decode
        llama_token anchor = -1;
        // Committed tokens whose K/V the sequence does not hold yet: a tree path that left the
        // first-child chain sat at cells out of position order, so its rows are decoded again, in
        // order, ahead of the slot's next rows (their features were taken from the tree's rows).
        std::vector<llama_token> pending;
        int32_t pending_pos0 = 0;
        int32_t prompt_rows = 0;  // the last prompt's length: history rows [0, this) were its prefill
    };
    // Where the slot's drafts come from, and how many it wants.
    struct Drafting {
        Drafter * drafter = nullptr;
        DrafterFeed feed;
        SlotSources sources;  // the drafter's lattice, the candidate sources, the merged tree (by index)
    };
    // This step's rows in the batch: the drafted block and where its rows sit.
    struct StepRows {
        DraftBlock block;
        std::vector<int32_t> branches;     // a tree's branch sequences (one per leaf)
        std::vector<int32_t> branch_leaf;  // per branch, its leaf node
        std::vector<int32_t> node_branch;  // per node, one branch sequence through it
        std::vector<int32_t> node_row;     // per node, its row after the anchor's (depth-first order)
        int32_t row0 = 0, n_rows = 0;      // first row in the batch (the anchor's), prompt rows
    };
    // The plan this step's block came from, as the stats record it (EngineStats::ran).
    struct PlanAsRun {
        std::string name;  // SlotPlan::name
        double expected = 1.0;
        double rate = 0.0, plain_rate = 0.0;  // as the cost model priced them for it (0: not as run)
    };

    // Read access: the planner and the stats see the slot through these only.
    State state() const { return state_; }
    const Request & request() const { return request_; }
    const Sequence & seq() const { return seq_; }
    const StepRows & rows() const { return rows_; }
    const PlanAsRun & plan() const { return plan_; }
    const SlotSources & sources() const { return drafting_.sources; }
    // The slot's drafter (not the slot's: the engine's caller owns it), or null in plain decoding.
    Drafter * drafter() const { return drafting_.drafter; }

    // Parts whose invariants their own classes keep; the engine hands them to the work it does:
    // the sources draft, offer and learn the commits (draft_sources.h)
    SlotSources & sources() { return drafting_.sources; }
    // the committed rows' features the target appends and the drafter injects
    DrafterFeed & feed() { return drafting_.feed; }
    // verifies and drafts advance its state (grammar, random draws)
    TargetSampler & sampler() { return *request_.sampler; }
    // the engine's stats count the request's figures into it (engine_stats.h)
    SlotStats & stats() { return request_.stats; }

    // Set up: the slot's drafter (one per slot), and the context drafts its next request takes.
    void set_drafter(Drafter * drafter) { drafting_.drafter = drafter; }
    void set_context_drafts(ContextDrafts mode, const std::string & key);

    // A request begins on the idle slot: its sequence holds `keep` rows of the prompt already, the
    // rest is prefilled next; its sources are told.
    void begin(const std::vector<llama_token> & prompt, std::unique_ptr<TargetSampler> sampler, int32_t max_tokens,
               int32_t keep);
    // The prompt is prefilled and `first` is its first token: the slot decodes from here.
    void start_decoding(llama_token first);
    // The request ends (its pending rows decoded already): the history keeps what the sequence
    // holds, for the next request's prefix; its sources are told.
    void end();
    // A decoding slot whose position reached n_ctx fills up; true when it just did.
    bool fill(int32_t n_ctx);
    // A verified step's commit: the anchor and the accepted drafts join the history, `next` is the
    // new anchor.
    void commit(const std::vector<llama_token> & accepted, llama_token next);

    // The sequence was cut to its first `keep` rows (a reused prefix): the history and the drafter
    // keep what is below; features queued for rows past it are dropped.
    void cut_to(int32_t keep, int32_t feature_width);
    // Nothing the sequence held is trusted (a borrowed context was cleared).
    void forget_history() { seq_.history.clear(); }

    // This step's plan (for the stats) and its block, emptied for the sources to fill.
    DraftBlock & plan_block(const std::string & plan, double expected);
    // What the merged tree's kept nodes expect (its estimates summed).
    void expect(double expected) { plan_.expected = expected; }
    // The step's decisions priced the plan at `rate` and plain decoding at `plain_rate` (0: not).
    void price(double rate, double plain_rate);

    // This step's rows in the batch: a prompt chunk of n rows from the batch's first ...
    void place_prompt_chunk(int32_t n);
    // ... or the anchor's row, drafts (a chain's, a tree's nodes) after it.
    void place_anchor(int32_t row0) { rows_.row0 = row0; }
    // A tree's branches: one sequence per leaf (the first-child chain's leaf takes own_seq, the
    // others first_seq, first_seq + 1, ...), and every node's row after the anchor, depth first.
    void lay_out_tree(int32_t own_seq, int32_t first_seq);
    // The tree's branch sequences were cut: the step holds none.
    void drop_branches();
    // The tree is verified and committed: the block is no tree the next rows build on.
    void tree_verified() { rows_.block.is_tree = false; }
    // The prompt chunk is decoded; true when the whole prompt is.
    bool prompt_chunk_done();

    // Accepted tree nodes past the first n_in_place sat at cells out of position order: their
    // tokens wait to be decoded again, in order, ahead of the slot's next rows.
    void defer_rows(const std::vector<llama_token> & accepted, int n_in_place);
    // The pending rows are decoded (ahead of this step's rows, or alone when a request ends).
    void pending_decoded() { seq_.pending.clear(); }

    // The logprobs of the tokens this step commits (when the request asked for them): none yet,
    // then one per token in order.
    bool wants_logprobs() const { return request_.sampler->params().n_logprobs >= 0; }
    void clear_logprobs() { request_.n_logprobs = 0; }
    void record_logprob(const float * logits, int32_t n_vocab, llama_token token);

  private:
    State state_ = State::Idle;
    Request request_;
    Sequence seq_;
    Drafting drafting_;
    StepRows rows_;
    PlanAsRun plan_;
    ContextDrafts context_mode_ = ContextDrafts::Request;  // for the next begin()
    std::string context_key_;
};

}  // namespace pdf2
