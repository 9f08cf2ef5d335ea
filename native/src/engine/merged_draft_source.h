// The merged tree as a composite source over a slot's sources (draft_sources.h): it takes their
// offers through the dispatcher and drafts one best-first tree over their union
// (merged_draft_tree.h). A source whose candidates are known now gives them; one that proposes
// (the DFlash lattice) drafts first when asked to, and then offers its block's nodes. Its price is
// the known offers' merged expectation, known before any drafting. It knows no source by name.
#pragma once

#include "engine/draft_source.h"
#include "engine/merged_draft_tree.h"

#include <vector>

namespace pdf2 {

class SlotSources;

class MergedDraftSource {
  public:
    // Expected accepted drafts of the best b nodes of the offers known now (b = 0..), paths at most
    // max_depth deep, at most max_leaves leaves; {0}: no source offers anything.
    std::vector<double> expected_accepted(SlotSources & sources, int max_depth, int max_nodes, int max_leaves);
    // req.n > 0: the proposing sources draft their block of req.n drafts (a tree of req.tree_budget
    // nodes when they have a lattice) first, merged with the known offers; req.n == 0: the known
    // offers alone (one source's alone: its own draft(), the same tree). At most req.tree_budget
    // nodes and req.max_leaves leaves, paths at most req.depth deep.
    void draft(SlotSources & sources, const DraftRequest & req, DraftBlock & out);
};

// Keeps a merged block's first n nodes (a best-first prefix: still a tree).
void truncate_block(DraftBlock & block, int n);

}  // namespace pdf2
