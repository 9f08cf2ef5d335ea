// The engine's counters, in one owner: the engine-wide BatchStats (the server turns them into
// metrics), each request's SlotStats, and the step ledger (step_ledger.h). The planner, the batch
// builder and the commits report what happened through these methods; nothing else writes the
// counters (the draft sources keep their own: draft_source.h).
#pragma once

#include "engine/step_ledger.h"
#include "engine/step_price.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace pdf2 {

// One plan the planner ran for a request's steps ("plain", "chain of 3", "tree of 16", "merged
// tree", "candidates' tree"): its steps, the tokens the cost model expected them to commit, and
// those they committed. The explanation a user reads is made of these (pydflash2/draft_decision.py).
struct PlanRun {
    std::string plan;
    int64_t steps = 0;
    double expected = 0.0;  // summed over its steps
    int64_t committed = 0;
    // its steps that ran it as the cost model chose and priced it (no cap or probe changed it), and
    // the rates it priced it and plain decoding at there (the slot's share, summed over those steps)
    int64_t priced_steps = 0;
    double rate = 0.0, plain_rate = 0.0;
};

// One request's counters on its slot (reset by start()).
struct SlotStats {
    int64_t n_prompt = 0;
    int64_t n_reused = 0;       // prompt rows the slot already held
    int64_t n_generated = 0;    // tokens committed, the first (from prefill) included
    int64_t n_steps = 0;        // target decodes after prefill that carried this slot's rows
    int64_t n_spec_steps = 0;   // ... of which verified a drafted block
    int64_t n_tree_steps = 0;   // ... as a tree
    std::vector<int64_t> drafted;     // per block position 1..max_draft: blocks that reached it
    std::vector<int64_t> accepted;    // ... and accepted its draft
    std::vector<int64_t> n_max_used;  // histogram of drafts per step over 0..max_draft
    // (drafted nodes by source: each source's own counters, draft_sources.h)
    int64_t n_context_steps = 0;    // steps that verified a merged or candidates-only tree
    int64_t n_propose_skipped = 0;  // ... of which without the drafter's propose (candidates alone)
    std::vector<PlanRun> plans;     // the plans its verify steps ran, in order of first use
    Decision decision;              // the cost model's last decision its plan came from
};

// Engine-wide counters since creation (the server turns them into metrics).
struct BatchStats {
    int64_t n_steps = 0;         // target decodes
    int64_t n_rows = 0;          // batch rows in them (filler rows included)
    int64_t n_filler_rows = 0;   // rows decoded only to keep a verify batch one ubatch (add_filler_rows)
    int64_t n_prompt = 0;        // prompt tokens prefilled
    int64_t n_prompt_reused = 0; // prompt tokens whose K/V a slot already held
    int64_t n_generated = 0;     // tokens committed (first tokens included)
    int64_t n_drafts = 0;        // drafted blocks verified
    int64_t n_draft_tokens = 0;  // drafted tokens verified
    int64_t n_accepted = 0;      // ... of which accepted
    std::vector<int64_t> accepted_per_pos;  // accepted at block position (tree depth) 1..step width
    int64_t n_context_steps = 0, n_propose_skipped = 0;  // as SlotStats
    int64_t n_unfed_steps = 0;  // plain decodes that skipped the drafter's features (StepCosts::starve_plain)
    // The verify and plain decodes by their rows (index rows - 1, filler rows included): how many, and
    // their seconds (decode and sync): the steps as they ran, against which the cost model's
    // measured table is checked (benchmarks/speculation_tax.py). fed: ... of which fed the drafter.
    std::vector<int64_t> decodes_by_rows, fed_decodes_by_rows;
    std::vector<double> decode_s_by_rows, fed_decode_s_by_rows;
    std::vector<Decision> decisions;  // the cost model's, at the last step that verified drafts or plain rows
    StepLedger ledger;  // where the steps' time went (step_ledger.h)
    int64_t n_graph_builds = 0;
};

class StatsRecorder {
  public:
    const BatchStats & engine() const { return stats_; }
    StepLedger & ledger() { return stats_.ledger; }
    void set_step_width(int width) { stats_.accepted_per_pos.assign(static_cast<size_t>(width), 0); }
    // measuring costs is no request's work: its counters are put back after
    BatchStats save() const { return stats_; }
    void restore(const BatchStats & saved) { stats_ = saved; }

    // a request starts on a slot (n_reused of its prompt rows held already)
    void start(SlotStats & st, int64_t n_prompt, int64_t n_reused, int step_width, int max_draft);
    void decoded(int rows) {  // a target decode
        stats_.n_steps += 1;
        stats_.n_rows += rows;
    }
    // a verify or plain decode of `rows` rows took `seconds`; fed: its rows went to the drafter
    void timed_decode(int rows, double seconds, bool fed);
    void filler_rows(int n) { stats_.n_filler_rows += n; }
    void unfed_step() { stats_.n_unfed_steps += 1; }
    void prefilled(int rows) { stats_.n_prompt += rows; }
    void graph_builds(int64_t n) { stats_.n_graph_builds += n; }
    // n tokens committed for the request; verify: by a verify step (not a prompt's first token)
    void committed(SlotStats & st, int n, bool verify);
    // a verified step of n_drafted rows (a chain's drafts, a tree's nodes), depth deep, k accepted;
    // the block's size in the draft-length histogram
    void drafted(SlotStats & st, int depth, int n_drafted, int k);
    void block(SlotStats & st, int n, bool tree);
    void merged_step(SlotStats & st, bool propose_skipped);  // a merged or candidates-only tree drafted
    // a verify step of the request ran `plan`, expected to commit `expected` tokens, and committed
    // these; rate > 0: the cost model priced it so (plain decoding at plain_rate)
    void ran(SlotStats & st, const std::string & plan, double expected, int committed, double rate, double plain_rate);
    // the cost model's decisions of a step (the engine's), and the one a request's plan came from
    void step_decided(std::vector<Decision> && decisions) { stats_.decisions = std::move(decisions); }
    void decided(SlotStats & st, const Decision & d) { st.decision = d; }

  private:
    BatchStats stats_;
};

}  // namespace pdf2
