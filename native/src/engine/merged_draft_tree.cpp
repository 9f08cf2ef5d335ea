#include "engine/merged_draft_tree.h"

#include "common/errors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <string>
#include <utility>

namespace pdf2 {

namespace {

constexpr double NO_ESTIMATE = -std::numeric_limits<double>::infinity();

struct UnionNode {
    int32_t parent = -1;  // union index
    llama_token token = -1;
    int32_t depth = 1;
    int32_t cand = -1;
    uint8_t origin = 0;
    double p = 0.0;  // the larger of the sources' estimates, then capped by the parent's
    double lattice_logp = NO_ESTIMATE;
    double context_logp = NO_ESTIMATE;
};

// Adds one source's nodes to the union trie (parents are added before their children).
void add_source(const ScoredNodes & src, uint8_t origin, std::vector<UnionNode> & nodes,
                std::map<std::pair<int32_t, llama_token>, int32_t> & index) {
    std::vector<int32_t> at(static_cast<size_t>(src.size()), -1);
    for (int v = 0; v < src.size(); ++v) {
        const auto i = static_cast<size_t>(v);
        const int32_t parent = src.parent[i] < 0 ? -1 : at[static_cast<size_t>(src.parent[i])];
        if (src.parent[i] >= v || (src.parent[i] >= 0 && parent < 0)) {
            throw Error("merge_draft_trees: a node's parent must come before it");
        }
        const auto key = std::make_pair(parent, src.token[i]);
        auto it = index.find(key);
        if (it == index.end()) {
            UnionNode n;
            n.parent = parent;
            n.token = src.token[i];
            n.depth = parent < 0 ? 1 : nodes[static_cast<size_t>(parent)].depth + 1;
            it = index.emplace(key, static_cast<int32_t>(nodes.size())).first;
            nodes.push_back(n);
        }
        UnionNode & n = nodes[static_cast<size_t>(it->second)];
        n.origin |= origin;
        n.p = std::max(n.p, std::isfinite(src.p[i]) ? src.p[i] : 0.0);
        if (origin == kFromLattice) {
            n.cand = src.cand[i];
            n.lattice_logp = src.raw_logp[i];
        } else {
            n.context_logp = src.raw_logp[i];
        }
        at[i] = it->second;
    }
}

}  // namespace

MergedTree merge_draft_trees(const ScoredNodes & lattice, const ScoredNodes & context, int budget,
                             int max_leaves) {
    if (budget < 0 || max_leaves < 0) {
        throw Error("merge_draft_trees: the budget and the leaves must be >= 0, got " + std::to_string(budget) +
                    " and " + std::to_string(max_leaves));
    }
    std::vector<UnionNode> nodes;
    std::map<std::pair<int32_t, llama_token>, int32_t> index;
    add_source(lattice, kFromLattice, nodes, index);
    add_source(context, kFromContext, nodes, index);
    for (UnionNode & n : nodes) {  // parents come first: their caps are final
        n.p = std::min(1.0, n.p);
        if (n.parent >= 0) n.p = std::min(n.p, nodes[static_cast<size_t>(n.parent)].p);
    }
    // A child's estimate never exceeds its parent's and a parent comes first among equals, so the
    // first b nodes in this order are a tree: the best-first tree of b nodes.
    std::vector<int32_t> order(nodes.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return nodes[static_cast<size_t>(a)].p > nodes[static_cast<size_t>(b)].p;
    });
    MergedTree out;
    std::vector<int32_t> out_index(nodes.size(), -1);
    std::vector<int32_t> n_children(nodes.size(), 0);
    int leaves = 0;
    for (const int32_t u : order) {
        if (out.tree.size() >= budget) break;
        const UnionNode & n = nodes[static_cast<size_t>(u)];
        if (n.parent >= 0 && out_index[static_cast<size_t>(n.parent)] < 0) continue;  // its parent was left out
        // a child of a leaf replaces it as a leaf; any other node is a new one
        const bool new_leaf = n.parent < 0 || n_children[static_cast<size_t>(n.parent)] > 0;
        if (new_leaf && leaves >= max_leaves) continue;
        leaves += new_leaf ? 1 : 0;
        if (n.parent >= 0) n_children[static_cast<size_t>(n.parent)] += 1;
        out_index[static_cast<size_t>(u)] = out.tree.size();
        out.tree.parent.push_back(n.parent < 0 ? -1 : out_index[static_cast<size_t>(n.parent)]);
        out.tree.depth.push_back(n.depth);
        out.tree.token.push_back(n.token);
        out.tree.cand.push_back(n.cand);
        out.tree.logp.push_back(n.p > 0.0 ? std::log(n.p) : NO_ESTIMATE);
        out.origin.push_back(n.origin);
        out.lattice_logp.push_back(n.lattice_logp);
        out.context_logp.push_back(n.context_logp);
    }
    return out;
}

void truncate_merged(MergedTree & m, int n) {
    if (n >= m.tree.size()) return;
    const auto k = static_cast<size_t>(std::max(0, n));
    for (auto * v : {&m.tree.parent, &m.tree.depth, &m.tree.token, &m.tree.cand}) v->resize(k);
    m.tree.logp.resize(k);
    m.origin.resize(k);
    m.lattice_logp.resize(k);
    m.context_logp.resize(k);
}

}  // namespace pdf2
