#include "engine/merged_draft_tree.h"

#include "common/errors.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

namespace pdf2 {

namespace {

constexpr double NO_ESTIMATE = -std::numeric_limits<double>::infinity();

struct UnionNode {
    int32_t parent = -1;  // union index
    llama_token token = -1;
    int32_t depth = 1;
    int32_t cand = -1;
    int32_t first_child = -1;   // union index: the trie's children, a list (a handful per node)
    int32_t next_sibling = -1;
    uint8_t origin = 0;
    double p = 0.0;  // the largest of the sources' estimates, then capped by the parent's
    std::array<double, kMaxSources> source_logp;  // per source index
};

// The union trie: a node's child of a token found by walking its children (a map cost a
// step about as much as the rest of the merge: allocations per node).
struct UnionTrie {
    std::vector<UnionNode> nodes;
    int32_t first_root = -1;

    int32_t child(int32_t parent, llama_token token) const {
        for (int32_t c = parent < 0 ? first_root : nodes[static_cast<size_t>(parent)].first_child; c >= 0;
             c = nodes[static_cast<size_t>(c)].next_sibling) {
            if (nodes[static_cast<size_t>(c)].token == token) return c;
        }
        return -1;
    }

    int32_t add(int32_t parent, llama_token token) {
        UnionNode n;
        n.parent = parent;
        n.token = token;
        n.depth = parent < 0 ? 1 : nodes[static_cast<size_t>(parent)].depth + 1;
        n.source_logp.fill(NO_ESTIMATE);
        int32_t & head = parent < 0 ? first_root : nodes[static_cast<size_t>(parent)].first_child;
        n.next_sibling = head;
        head = static_cast<int32_t>(nodes.size());
        nodes.push_back(n);
        return head;
    }
};

// Adds one source's nodes to the union trie (parents are added before their children).
void add_source(const ScoredNodes & src, int source, UnionTrie & trie, std::vector<int32_t> & at) {
    at.assign(static_cast<size_t>(src.size()), -1);
    for (int v = 0; v < src.size(); ++v) {
        const auto i = static_cast<size_t>(v);
        const int32_t parent = src.parent[i] < 0 ? -1 : at[static_cast<size_t>(src.parent[i])];
        if (src.parent[i] >= v || (src.parent[i] >= 0 && parent < 0)) {
            throw Error("merge_draft_trees: a node's parent must come before it");
        }
        int32_t u = trie.child(parent, src.token[i]);
        if (u < 0) u = trie.add(parent, src.token[i]);
        UnionNode & n = trie.nodes[static_cast<size_t>(u)];
        n.origin |= static_cast<uint8_t>(1u << source);
        n.p = std::max(n.p, std::isfinite(src.p[i]) ? src.p[i] : 0.0);
        if (src.cand[i] >= 0) n.cand = src.cand[i];  // the lattice's candidate index
        n.source_logp[static_cast<size_t>(source)] = src.raw_logp[i];
        at[i] = u;
    }
}

}  // namespace

MergedTree merge_draft_trees(const std::vector<const ScoredNodes *> & sources, int budget, int max_leaves) {
    if (budget < 0 || max_leaves < 0) {
        throw Error("merge_draft_trees: the budget and the leaves must be >= 0, got " + std::to_string(budget) +
                    " and " + std::to_string(max_leaves));
    }
    const int n_sources = static_cast<int>(sources.size());
    if (n_sources > kMaxSources) throw Error("merge_draft_trees: at most 8 sources");
    UnionTrie trie;
    std::vector<int32_t> at;
    size_t total = 0;
    for (const ScoredNodes * src : sources) total += src != nullptr ? static_cast<size_t>(src->size()) : 0;
    trie.nodes.reserve(total);
    for (int k = 0; k < n_sources; ++k) {
        if (sources[static_cast<size_t>(k)] != nullptr) add_source(*sources[static_cast<size_t>(k)], k, trie, at);
    }
    std::vector<UnionNode> & nodes = trie.nodes;
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
    out.source_logp.resize(static_cast<size_t>(n_sources));
    const size_t cap = std::min(nodes.size(), static_cast<size_t>(budget));
    for (auto * v : {&out.tree.parent, &out.tree.depth, &out.tree.token, &out.tree.cand}) v->reserve(cap);
    out.tree.logp.reserve(cap);
    out.origin.reserve(cap);
    for (std::vector<double> & logp : out.source_logp) logp.reserve(cap);
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
        for (int k = 0; k < n_sources; ++k) {
            out.source_logp[static_cast<size_t>(k)].push_back(n.source_logp[static_cast<size_t>(k)]);
        }
    }
    return out;
}

}  // namespace pdf2
