#include "engine/draft_source.h"

#include "engine/draft_length.h"

namespace pdf2 {

double Offer::expected(const OfferRequest & req) const {
    if (req.tree_budget > 0 && !tree_accepted.empty()) {
        const auto b = static_cast<size_t>(req.tree_budget);
        return tree_accepted[b < tree_accepted.size() ? b : tree_accepted.size() - 1];
    }
    return expected_tokens(chain_acceptance, req.n_drafts) - 1.0;
}

void DraftSource::draft(const DraftRequest & req, DraftBlock & out) {
    OfferRequest o;
    o.max_depth = req.n;
    std::vector<const ScoredNodes *> nodes(static_cast<size_t>(index_) + 1, nullptr);
    nodes.back() = offer(o).nodes;
    out.set_merged(merge_draft_trees(nodes, req.tree_budget, req.max_leaves > 0 ? req.max_leaves : kContextBranches));
}

std::vector<int32_t> DraftSource::own_nodes(const DraftBlock & b) const {
    std::vector<int32_t> out;
    if (!b.is_tree) return out;
    out.reserve(static_cast<size_t>(b.tree.size()));
    for (int node = 0; node < b.tree.size(); ++node) {
        const bool own = b.is_merged() ? (b.origin[static_cast<size_t>(node)] & origin_bit()) != 0 : b.source == index_;
        if (own) out.push_back(node);
    }
    return out;
}

double DraftSource::node_logp(const DraftBlock & b, int32_t node) const {
    const auto i = static_cast<size_t>(node);
    return b.is_merged() ? b.source_logp[static_cast<size_t>(index_)][i] : b.tree.logp[i];
}

}  // namespace pdf2
