// C entry point of the tree builder: validates the lattice it is handed, then builds.
#include "drafter/draft_tree.h"
#include "common/errors.h"

#include "pydflash2.h"

#include <algorithm>
#include <string>

extern "C" int pdf2_draft_tree(const int32_t * candidates, const float * scores, int32_t n_pos, int32_t k,
                               int32_t budget, int32_t * n_nodes, int32_t * parent, int32_t * depth, int32_t * token,
                               int32_t * cand, double * logp) {
    return pdf2::guarded<int>(-1, [&] {
        if (n_pos < 0 || n_pos > 256 || k < 1 || k > 1024) {
            throw pdf2::Error("draft_tree: need 0 <= n_pos <= 256 and 1 <= k <= 1024, got n_pos " +
                              std::to_string(n_pos) + ", k " + std::to_string(k));
        }
        if (budget < 0 || budget > 4096) {
            throw pdf2::Error("draft_tree: the budget must be in 0..4096, got " + std::to_string(budget));
        }
        if (n_nodes == nullptr || (n_pos > 0 && (candidates == nullptr || scores == nullptr))) {
            throw pdf2::Error("draft_tree: candidates, scores and n_nodes must not be NULL");
        }
        pdf2::Lattice lat;
        lat.n_pos = n_pos;
        lat.k = k;
        const size_t n_cand = static_cast<size_t>(n_pos) * static_cast<size_t>(k);
        lat.cand.assign(candidates, candidates + n_cand);
        lat.scores.assign(scores, scores + n_cand * static_cast<size_t>(k));
        const pdf2::DraftTree t = pdf2::build_draft_tree(lat, budget);
        *n_nodes = t.size();
        if (parent) std::copy(t.parent.begin(), t.parent.end(), parent);
        if (depth) std::copy(t.depth.begin(), t.depth.end(), depth);
        if (token) std::copy(t.token.begin(), t.token.end(), token);
        if (cand) std::copy(t.cand.begin(), t.cand.end(), cand);
        if (logp) std::copy(t.logp.begin(), t.logp.end(), logp);
        return 0;
    });
}

extern "C" double pdf2_draft_tree_temperature(void) { return pdf2::kDraftTreeTemperature; }
