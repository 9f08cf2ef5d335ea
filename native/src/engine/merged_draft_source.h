// The merged tree as a composite source: it takes the offers of the slot's candidate sources (the
// context's continuations, the repeated run, any source registered in draft_sources.cpp) and,
// when asked to, the lattice the drafter proposes, and drafts one best-first tree over their union
// (merged_draft_tree.h). Its price is the offers' merged expectation, known before any drafting.
#pragma once

#include "engine/dflash_draft_source.h"
#include "engine/draft_source.h"
#include "engine/merged_draft_tree.h"

#include <vector>

namespace pdf2 {

class MergedDraftSource final : public DraftSource {
  public:
    const char * name() const override { return "merged"; }
    // sources by index (0: the lattice, null without a drafter; then the candidate sources); not owned
    void set_sources(DFlashDraftSource * lattice, std::vector<DraftSource *> candidates);

    // Expected accepted drafts of the best b nodes of the candidates' merged offers (b = 0..),
    // paths at most max_depth deep, at most max_leaves leaves; {0}: no source offers anything.
    std::vector<double> expected_accepted(int max_depth, int max_nodes, int max_leaves);
    // req.n > 0: the drafter's block of req.n drafts (its tree of req.tree_budget nodes when it has
    // a lattice) merged with the candidates; req.n == 0: the candidates alone. At most
    // req.tree_budget nodes and req.max_leaves leaves, candidate paths at most req.depth deep.
    void draft(const DraftRequest & req, DraftBlock & out) override;

  private:
    std::vector<const ScoredNodes *> offers(int max_depth);  // by source index

    DFlashDraftSource * lattice_ = nullptr;
    std::vector<DraftSource *> candidates_;
};

// Keeps a merged block's first n nodes (a best-first prefix: still a tree).
void truncate_block(DraftBlock & block, int n);

}  // namespace pdf2
