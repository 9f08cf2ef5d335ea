// C entry points of the merged tree (tests compare it with a float64 reference) and of the
// context drafts' limits (the Python side sizes target contexts by them).
#include "engine/context_draft_source.h"
#include "engine/merged_draft_tree.h"
#include "common/errors.h"

#include "pydflash2.h"

#include <algorithm>
#include <string>

namespace {

pdf2::ScoredNodes scored(const int32_t * parent, const int32_t * token, const double * p, const double * raw_logp,
                         int32_t n, const char * what) {
    if (n < 0 || n > 4096) {
        throw pdf2::Error(std::string("merge_draft_trees: ") + what + " needs 0..4096 nodes, got " + std::to_string(n));
    }
    if (n > 0 && (parent == nullptr || token == nullptr || p == nullptr || raw_logp == nullptr)) {
        throw pdf2::Error(std::string("merge_draft_trees: ") + what + "'s arrays must not be NULL");
    }
    pdf2::ScoredNodes s;
    for (int32_t v = 0; v < n; ++v) {
        if (parent[v] < -1 || parent[v] >= v) {
            throw pdf2::Error(std::string("merge_draft_trees: ") + what + " node " + std::to_string(v) +
                              " has parent " + std::to_string(parent[v]) + " (a parent comes before its children)");
        }
        if (!(p[v] >= 0.0 && p[v] <= 1.0)) {
            throw pdf2::Error(std::string("merge_draft_trees: ") + what + " estimates must be in [0, 1]");
        }
        s.parent.push_back(parent[v]);
        s.token.push_back(token[v]);
        s.cand.push_back(what[0] == 'l' ? v : -1);
        s.p.push_back(p[v]);
        s.raw_logp.push_back(raw_logp[v]);
    }
    return s;
}

}  // namespace

extern "C" int pdf2_merge_draft_trees(const int32_t * lat_parent, const int32_t * lat_token, const double * lat_p,
                                      const double * lat_logp, int32_t n_lat, const int32_t * ctx_parent,
                                      const int32_t * ctx_token, const double * ctx_p, const double * ctx_logp,
                                      int32_t n_ctx, int32_t budget, int32_t max_leaves, int32_t * n_nodes,
                                      int32_t * parent, int32_t * depth, int32_t * token, uint8_t * origin,
                                      double * logp) {
    return pdf2::guarded<int>(-1, [&] {
        if (budget < 0 || budget > 4096 || max_leaves < 0 || n_nodes == nullptr) {
            throw pdf2::Error("merge_draft_trees: need 0 <= budget <= 4096, max_leaves >= 0 and n_nodes");
        }
        const pdf2::MergedTree m = pdf2::merge_draft_trees(scored(lat_parent, lat_token, lat_p, lat_logp, n_lat, "lattice"),
                                                           scored(ctx_parent, ctx_token, ctx_p, ctx_logp, n_ctx, "context"),
                                                           budget, max_leaves);
        *n_nodes = m.tree.size();
        if (parent) std::copy(m.tree.parent.begin(), m.tree.parent.end(), parent);
        if (depth) std::copy(m.tree.depth.begin(), m.tree.depth.end(), depth);
        if (token) std::copy(m.tree.token.begin(), m.tree.token.end(), token);
        if (origin) std::copy(m.origin.begin(), m.origin.end(), origin);
        if (logp) std::copy(m.tree.logp.begin(), m.tree.logp.end(), logp);
        return 0;
    });
}

extern "C" void pdf2_context_draft_limits(int32_t * max_nodes, int32_t * max_branches, int32_t * max_depth) {
    if (max_nodes) *max_nodes = pdf2::kContextTreeNodes;
    if (max_branches) *max_branches = pdf2::kContextBranches;
    if (max_depth) *max_depth = pdf2::kContextMaxDepth;
}
