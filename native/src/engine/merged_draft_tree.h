// One verified tree from several draft sources (issue 35): the DFlash2 lattice's best-first tree,
// the context's continuations (context_draft_source.h) and any other source's candidates, each
// node with its source's acceptance estimate (the lattice's calibrated, the context's learned per
// match length). Shared prefixes merge into one node (a node several sources propose keeps the
// largest estimate); the tree is then expanded best first over the union, so each source wins on
// the tokens it knows. Every estimate is capped by its parent's (a node is
// accepted only when its parent is), which keeps a best-first prefix of the union a tree.
#pragma once

#include "drafter/draft_tree.h"
#include "engine/step_price.h"

#include <llama.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace pdf2 {

// Which sources drafted a node: bit i for source index i (draft_sources.h numbers them in the
// order they were added); a node several propose has several bits.
inline constexpr int kMaxSources = 8;
// The leaves of a tree of known candidates (the context's, a merged tree without propose): each
// takes a sequence of the target context.
inline constexpr int kContextBranches = 8;

// One source's candidates: nodes parent before child, tokens distinct among siblings.
struct ScoredNodes {
    std::vector<int32_t> parent;  // -1 = under the anchor
    std::vector<llama_token> token;
    std::vector<int32_t> cand;    // the lattice candidate index, -1 for other sources
    std::vector<double> p;        // calibrated acceptance estimate of the node's whole path
    std::vector<double> raw_logp; // the source's own log-estimate (what its calibration learns from)
    int size() const { return static_cast<int>(token.size()); }
    void clear_and_reserve(size_t n) {  // (keeps the capacity a source refills every step)
        for (auto * v : {&parent, &token, &cand}) {
            v->clear();
            v->reserve(n);
        }
        for (auto * v : {&p, &raw_logp}) {
            v->clear();
            v->reserve(n);
        }
    }
};

// The merged tree's nodes, with the tree.
struct MergedTree {
    DraftTree tree;                   // logp = log of the merged (calibrated, capped) estimate
    std::vector<uint8_t> origin;      // per node: its sources' bits
    // per source index, per node: the source's raw log-estimate (-inf: not the source's)
    std::vector<std::vector<double>> source_logp;
};

// The best `budget` nodes of the union of lattice and context, expanded best first (ties: the
// node added to the union first: the lattice's before the context's, each in its source's
// order), with at most max_leaves leaves (each leaf takes a sequence of the target context): a
// node that would add a leaf beyond them is left out, and so is everything below it.
// sources[i] (null: none this step) are the nodes of source index i.
MergedTree merge_draft_trees(const std::vector<const ScoredNodes *> & sources, int budget, int max_leaves);
inline MergedTree merge_draft_trees(const ScoredNodes & lattice, const ScoredNodes & context, int budget,
                                    int max_leaves) {
    return merge_draft_trees({&lattice, &context}, budget, max_leaves);
}

// A DraftTree's nodes as a source's candidates, each estimate calibrated by `calibrated(logp)`.
template <class Calibrate> ScoredNodes scored_nodes(const DraftTree & t, Calibrate calibrated) {
    ScoredNodes out;  // (whole copies: a push_back per node grew five vectors through five sizes)
    out.parent = t.parent;
    out.token = t.token;
    out.cand = t.cand;
    out.raw_logp = t.logp;
    out.p.reserve(t.logp.size());
    for (const double logp : t.logp) out.p.push_back(calibrated(logp));
    return out;
}

// The number of the merged tree's first nodes that maximises expected committed tokens per
// second, price(b, 1 + sum of their estimates) for b = 0..tree.size() (nodes come best first, so
// the first b are the best tree of b nodes; 0: verify none).
template <class PriceOf> int best_prefix(const DraftTree & t, PriceOf price) {
    std::vector<double> committed(1, 1.0);  // b = 0: a plain step
    committed.reserve(t.logp.size() + 1);
    for (const double logp : t.logp) committed.push_back(committed.back() + std::exp(logp));
    return best_rate(0, t.size(), [&](int b) { return price(b, committed[static_cast<size_t>(b)]); }).index;
}

}  // namespace pdf2
