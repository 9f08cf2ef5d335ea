#include "engine/draft_source.h"

namespace pdf2 {

std::vector<int32_t> DraftSource::own_nodes(const DraftBlock & b) const {
    std::vector<int32_t> out;
    if (!b.is_tree) return out;
    out.reserve(static_cast<size_t>(b.tree.size()));
    for (int node = 0; node < b.tree.size(); ++node) {
        // an unmerged tree is the lattice's (index 0)
        const bool own = b.is_merged() ? (b.origin[static_cast<size_t>(node)] & origin_bit()) != 0 : index_ == 0;
        if (own) out.push_back(node);
    }
    return out;
}

double DraftSource::node_logp(const DraftBlock & b, int32_t node) const {
    const auto i = static_cast<size_t>(node);
    return b.is_merged() ? b.source_logp[static_cast<size_t>(index_)][i] : b.tree.logp[i];
}

void DraftSource::accept(const Verified & v) {
    if (v.block == nullptr || v.block->tokens.empty()) return;
    const DraftBlock & b = *v.block;
    if (!b.is_tree) {  // a chain: the drafter's, its first n_committed - 1 drafts accepted
        if (index_ != 0) return;
        const auto k = static_cast<int64_t>(v.n_committed) - 1;
        stats_.add(static_cast<int64_t>(b.tokens.size()), k);
        for (int64_t d = 1; d <= k; ++d) stats_.count_depth(static_cast<int>(d));
        return;
    }
    const std::vector<int32_t> nodes = own_nodes(b);
    int64_t accepted = 0;
    for (const int32_t node : nodes) {
        if (!(*v.node_accepted)[static_cast<size_t>(node)]) continue;
        accepted += 1;
        stats_.count_depth(b.tree.depth[static_cast<size_t>(node)]);
    }
    stats_.add(static_cast<int64_t>(nodes.size()), accepted);
}

}  // namespace pdf2
