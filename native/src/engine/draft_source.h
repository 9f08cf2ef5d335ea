// Where a step's candidate tokens come from. Every drafting method is one class behind this
// interface, with the lifecycle llama.cpp's common/speculative.cpp gives its methods (begin, draft,
// accept) and, since this engine prices its sources, an offer: what the source could get accepted
// this step, known before anything is drafted, priced by the cost model as any other source's.
// The sources: the DFlash drafter's lattice (dflash_draft_source.h, whose candidates come only with
// its propose: it offers its expected acceptance instead), the context's continuations
// (context_draft_source.h) and the last tokens repeated (repeat_draft_source.h); the merged tree
// (merged_draft_source.h) is a composite source over them. A new method is one new file and one
// line in draft_sources.cpp's registry. The slot's dispatcher (SlotSources, draft_sources.h) counts
// and times every call: a source only drafts, offers and learns.
#pragma once

#include "drafter/draft_tree.h"
#include "engine/merged_draft_tree.h"
#include "engine/target_sampling.h"

#include <llama.h>

#include <cstdint>
#include <string>
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
    // a merged tree (merged_draft_source.h): its candidate paths' depth, and which sources it merges
    // (bits by source index, as DraftBlock::origin); a tree's leaves at most (0: the source's own bound)
    int depth = 0;
    int max_leaves = 0;
    uint32_t merge = 0;
};

// What the planner asks an offer for: candidate paths at most max_depth deep; a source that proposes
// is told the block the step would draft (n_drafts, or a tree of tree_budget nodes when > 0).
struct OfferRequest {
    int max_depth = 0;
    int n_drafts = 0;
    int tree_budget = 0;
};

// What a source offers this step. A source whose candidates are known before drafting gives them,
// calibrated (nodes); one that learns them only by proposing gives its expected acceptance curves
// instead, and its nodes once it has drafted this step. The cost model prices either without
// knowing whose it is (cost_model.h).
struct Offer {
    const ScoredNodes * nodes = nullptr;  // candidates now (null: none, or only after its propose)
    // a proposing source: the conditional acceptance of its chain's block positions 1..max, and the
    // expected accepted drafts of its best tree of b nodes (b = 0..; empty: no tree seen yet)
    std::vector<double> chain_acceptance;
    std::vector<double> tree_accepted;
    bool proposes() const { return !chain_acceptance.empty(); }
    // expected accepted drafts of the block of the request (its chain of n_drafts, or its tree)
    double expected(const OfferRequest & req) const;
};

// The candidates a source returns, and what drafting them cost (the engine's phase timings).
struct DraftBlock {
    std::vector<llama_token> tokens;  // the chain's drafts, or the tree's nodes in expansion order
    std::vector<SparseDist> q;        // chain: the law each draft was drawn from (one-hot when picked)
    bool is_tree = false;             // tokens are tree's nodes
    DraftTree tree;
    // a merged tree (merged_draft_tree.h), per node: its sources (bits by source index) and, per
    // source index, their raw log-estimates; empty: every node is the drafter's
    std::vector<uint8_t> origin;
    std::vector<std::vector<double>> source_logp;
    int source = -1;             // the source index that drafted an unmerged block (SlotSources sets it)
    double seconds = 0.0;        // all of drafting
    double propose_s = 0.0;      // ... of which the drafter's forward
    double select_s = 0.0;       // ... and choosing the block from its proposal
    double graph_setup_s = 0.0;  // graph builds and allocations (outside propose_s)
    int64_t n_graph_builds = 0;

    void clear() {
        tokens.clear();
        q.clear();
        is_tree = false;
        source = -1;
        origin.clear();
        source_logp.clear();
        seconds = propose_s = select_s = graph_setup_s = 0.0;
        n_graph_builds = 0;
    }
    // the block is this merged (or context-only) tree
    void set_merged(MergedTree && m) {
        tree = std::move(m.tree);
        origin = std::move(m.origin);
        source_logp = std::move(m.source_logp);
        tokens.assign(tree.token.begin(), tree.token.end());
        q.clear();
        is_tree = !tokens.empty();
    }
    bool is_merged() const { return !origin.empty(); }
};

// A request starting on a slot: its prompt, and what context drafts may read.
struct SourceStart {
    const std::vector<llama_token> * prompt = nullptr;
    int context_mode = 0;            // ContextDrafts (context_draft_source.h): 0 = off
    const std::string * key = nullptr;  // the global cache's key (the request's API key)
    bool sampled = false;            // the request samples (temperature > 0): see ByRegime
};

// What a source learns about acceptance, kept apart for greedy and sampled requests: a draft that
// greedy decoding copies verbatim is drawn far less often at temperature 1 (issue 57: the context's
// nodes on the agentic prompts, 80-90% accepted at T=0 against 26% at T=1), and one server
// interleaves both; pooled, each regime's steps were priced with the other's acceptance.
template <class T> struct ByRegime {
    T greedy, sampled;
    T & of(bool is_sampled) { return is_sampled ? sampled : greedy; }
};

// What one step's verification decided, told to every source of the slot, drafted by it or not.
struct Verified {
    const llama_token * committed = nullptr;  // the accepted drafts, then the target's next token
    size_t n_committed = 0;
    const DraftBlock * block = nullptr;  // the block verified (null: a prompt's first token)
    const std::vector<char> * node_accepted = nullptr;  // a tree: per node, on the accepted path
};

// A source's own counters: nodes (chain drafts) it drafted into verified blocks, and how many the
// target accepted (a node two sources proposed counts for both). The request's since begin(), and
// the engine's since the source was made.
struct SourceCounts {
    int64_t nodes = 0, accepted = 0;
    int64_t steps = 0;  // verified blocks that held its nodes
};
struct SourceStats {
    SourceCounts request, total;
    // every call the dispatcher made to the source (begin, offer, draft, accept, finish), and its seconds
    int64_t calls = 0;
    double seconds = 0.0;
    std::vector<int64_t> accepted_per_depth;  // total: accepted nodes at tree depth (block position) 1..
    void count_depth(int depth) {
        if (depth < 1) return;
        if (accepted_per_depth.size() < static_cast<size_t>(depth)) accepted_per_depth.resize(static_cast<size_t>(depth), 0);
        accepted_per_depth[static_cast<size_t>(depth - 1)] += 1;
    }
    void start_request() { request = SourceCounts{}; }
    void called(double secs) {
        calls += 1;
        seconds += secs;
    }
    void add(int64_t nodes, int64_t accepted) {
        for (SourceCounts * c : {&request, &total}) {
            c->nodes += nodes;
            c->accepted += accepted;
            c->steps += nodes > 0 ? 1 : 0;
        }
    }
};

class DraftSource {
  public:
    virtual ~DraftSource() = default;
    virtual const char * name() const = 0;

    // A request starts on the slot / has ended.
    virtual void begin(const SourceStart & start) { (void)start; }
    virtual void finish() {}
    // What it could get accepted after the stream's last token (Offer).
    virtual Offer offer(const OfferRequest & req) = 0;
    // The next block for req (n > 0); out was cleared. The default is for a source whose candidates
    // are known: its offer's best req.tree_budget nodes, at most req.n deep, at most req.max_leaves
    // leaves (0: kContextBranches), the tree the merged one (merged_draft_source.h) makes of its
    // offer alone; a proposing source, or one that also drafts chains, overrides it.
    virtual void draft(const DraftRequest & req, DraftBlock & out);
    // What verification committed, told to every source of the slot: one that learns from it
    // overrides this (the dispatcher counts the source's nodes itself).
    virtual void accept(const Verified & v) { (void)v; }

    // The bit of its nodes in a merged block's origin, its index in source_logp (SlotSources sets it).
    void set_index(int index) { index_ = index; }
    int index() const { return index_; }
    uint8_t origin_bit() const { return static_cast<uint8_t>(1u << index_); }

  protected:
    std::vector<int32_t> own_nodes(const DraftBlock & b) const;  // its nodes in a tree block
    double node_logp(const DraftBlock & b, int32_t node) const;  // its raw log-estimate of one of them

  private:
    int index_ = 0;
};

}  // namespace pdf2
