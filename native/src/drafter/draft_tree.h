// A tree of candidate paths through a DFlash2 lattice, for tree verification
// (DDTree, Ringel & Romano 2026): instead of the greedy selector's one path, the B most
// probable nodes of the lattice's path tree, expanded best first.
//
// A node at depth d (block position d, 1..P) holds candidate c of position d-1
// and hangs under its parent (the root is the anchor). Its conditional
// probability is the selector's softmax at kDraftTreeTemperature over the k
// candidates of its position, in the row its parent's candidate selects
// (unary + pairwise scores, the numbers the greedy selector takes the argmax of);
// a path's probability is the product along it. Children never outrank their parent,
// so the B best nodes form a tree, found by popping a heap of frontier nodes:
// a popped node pushes its next-ranked sibling and its best child.
#pragma once

#include "drafter/path_selector.h"

#include <cstdint>
#include <vector>

namespace pdf2 {

// The selector's softmax is overconfident (of the candidates it gives about 0.88, the target's
// token is one 60% of the time): flattening it spends more of a budget on second choices, where the chain loses most
// blocks. 1.5 was the best of 1, 1.5, 2, 2.5, 3 at every budget on prompts_dev.txt's 64 prompts
// (replayed offline with the shipped drafter); on the chat eval prompts, a source it was not
// chosen on, it raises tau at 16 nodes from 1.91 to 1.97 (docs/python-api.md#tree-verification).
inline constexpr double kDraftTreeTemperature = 1.5;

struct DraftTree {
    // nodes in the order best-first expansion added them: a parent comes before its children
    std::vector<int32_t> parent;  // node index, -1 = the root (the anchor)
    std::vector<int32_t> depth;   // 1..n_pos
    std::vector<int32_t> token;   // the candidate's token id
    std::vector<int32_t> cand;    // its index among the position's k candidates
    std::vector<double> logp;     // log of the path's estimated probability
    int size() const { return static_cast<int>(parent.size()); }
};

// The best `budget` nodes (fewer when the lattice has fewer finite-score nodes).
// Ties in path probability go to the node pushed first (the better-ranked sibling,
// then the shallower node): at budget <= n_pos the first nodes are the greedy selector's
// path wherever it is also the most probable. Throws Error on a bad budget.
DraftTree build_draft_tree(const Lattice & lat, int budget);

}  // namespace pdf2
