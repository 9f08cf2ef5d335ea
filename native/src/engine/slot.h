// A slot of the engine: one request at a time on one llama.cpp sequence. The slot owns its
// lifecycle (a request begins, its prompt is prefilled, it decodes until it ends or fills its
// context) and the bookkeeping of what it commits (history, position, anchor); the engine owns the
// decodes, the KV cells and the stats, and the planner reads slots as they are (const).
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
    State state = State::Idle;
    Request request;
    Sequence seq;
    Drafting drafting;
    StepRows rows;
    std::string plan;         // this step's plan (SlotPlan::name), for the stats
    double plan_expected = 1.0;
    double plan_rate = 0.0, plain_rate = 0.0;  // as the cost model priced them for it (0: not as run)
    ContextDrafts context_mode = ContextDrafts::Request;  // for the next begin()
    std::string context_key;

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
};

}  // namespace pdf2
