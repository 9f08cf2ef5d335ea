// Where a step's candidate tokens come from. The planner asks each decoding slot's source for one
// block; every drafting method is one struct behind this interface (llama.cpp's
// common/speculative.cpp has the same shape), so a new method is one new file. The sources: the
// DFlash drafter's proposal (dflash_draft_source.h) and the context's continuations
// (context_draft_source.h); the planner merges both into one tree (merged_draft_tree.h).
#pragma once

#include "drafter/draft_tree.h"
#include "engine/merged_draft_tree.h"
#include "engine/target_sampling.h"

#include <llama.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace pdf2 {

// What the planner asks for: a block after `anchor` (at position pos) of at most n drafts; a
// tree of at most tree_budget nodes instead of a chain when tree_budget > 0.
struct DraftRequest {
    llama_token anchor = -1;
    int32_t pos = 0;
    int n = 0;
    int tree_budget = 0;
    TargetSampler * sampler = nullptr;  // the request's chain: its law, grammar and generator
};

// The candidates a source returns, and what drafting them cost (the engine's phase timings).
struct DraftBlock {
    std::vector<llama_token> tokens;  // the chain's drafts, or the tree's nodes in expansion order
    std::vector<SparseDist> q;        // chain: the law each draft was drawn from (one-hot when picked)
    bool is_tree = false;             // tokens are tree's nodes
    DraftTree tree;
    // a tree with context nodes (merged_draft_tree.h), per node: its sources and their raw
    // estimates; empty: every node is the drafter's
    std::vector<uint8_t> origin;
    std::vector<double> lattice_logp, context_logp;
    double seconds = 0.0;        // all of drafting
    double propose_s = 0.0;      // ... of which the drafter's forward
    double select_s = 0.0;       // ... and choosing the block from its proposal
    double graph_setup_s = 0.0;  // graph builds and allocations (outside propose_s)
    int64_t n_graph_builds = 0;

    void clear() {
        tokens.clear();
        q.clear();
        is_tree = false;
        origin.clear();
        lattice_logp.clear();
        context_logp.clear();
        seconds = propose_s = select_s = graph_setup_s = 0.0;
        n_graph_builds = 0;
    }
    // the block is this merged (or context-only) tree
    void set_merged(MergedTree && m) {
        tree = std::move(m.tree);
        origin = std::move(m.origin);
        lattice_logp = std::move(m.lattice_logp);
        context_logp = std::move(m.context_logp);
        tokens.assign(tree.token.begin(), tree.token.end());
        q.clear();
        is_tree = !tokens.empty();
    }
    bool has_context_nodes() const { return !origin.empty(); }
};

class DraftSource {
  public:
    virtual ~DraftSource() = default;
    // The next block for req (n > 0); out was cleared.
    virtual void draft(const DraftRequest & req, DraftBlock & out) = 0;
};

}  // namespace pdf2
