#include "drafter/draft_tree.h"

#include "common/errors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>
#include <string>

namespace pdf2 {

namespace {

// A row's candidates ranked by score (stable: equal scores keep index order, as the greedy
// selector's argmax takes the first), with their log-softmax at kDraftTreeTemperature; non-finite
// scores are left out.
struct RankedRow {
    std::vector<int32_t> order;
    std::vector<double> logp;  // by rank
};

RankedRow rank_row(const float * row, int k) {
    RankedRow r;
    double mx = -std::numeric_limits<double>::infinity();
    for (int c = 0; c < k; ++c) {
        if (std::isfinite(row[c])) {
            r.order.push_back(c);
            mx = std::max(mx, static_cast<double>(row[c]));
        }
    }
    std::stable_sort(r.order.begin(), r.order.end(), [row](int32_t a, int32_t b) { return row[a] > row[b]; });
    const auto scaled = [&](int32_t c) { return (static_cast<double>(row[c]) - mx) / kDraftTreeTemperature; };
    double sum = 0.0;
    for (const int32_t c : r.order) sum += std::exp(scaled(c));
    const double log_z = std::log(sum);
    for (const int32_t c : r.order) r.logp.push_back(scaled(c) - log_z);
    return r;
}

struct Frontier {
    double logp;
    uint64_t seq;     // push order: the tie-break
    int32_t parent;   // node index, -1 = root
    int32_t depth;    // of the node this entry would add
    int32_t rank;     // its rank within the parent's row
    bool operator<(const Frontier & o) const {  // priority_queue pops the largest
        if (logp != o.logp) return logp < o.logp;
        return seq > o.seq;
    }
};

}  // namespace

DraftTree build_draft_tree(const Lattice & lat, int budget) {
    if (budget < 0) {
        throw Error("tree budget must be >= 0, got " + std::to_string(budget));
    }
    DraftTree tree;
    if (budget == 0 || lat.n_pos <= 0 || lat.k <= 0) {
        return tree;
    }
    // the ranked row under each node (index parent+1; the root's is position 0's row 0)
    std::vector<RankedRow> rows;
    rows.push_back(rank_row(lat.row(0, 0), lat.k));
    std::priority_queue<Frontier> heap;
    uint64_t seq = 0;
    const auto push = [&](int32_t parent, int32_t depth, int32_t rank, double parent_logp) {
        const RankedRow & r = rows[static_cast<size_t>(parent + 1)];
        if (static_cast<size_t>(rank) < r.order.size()) {
            heap.push({parent_logp + r.logp[static_cast<size_t>(rank)], seq++, parent, depth, rank});
        }
    };
    push(-1, 1, 0, 0.0);
    while (tree.size() < budget && !heap.empty()) {
        const Frontier f = heap.top();
        heap.pop();
        const RankedRow & r = rows[static_cast<size_t>(f.parent + 1)];
        const int32_t c = r.order[static_cast<size_t>(f.rank)];
        const int32_t node = tree.size();
        tree.parent.push_back(f.parent);
        tree.depth.push_back(f.depth);
        tree.cand.push_back(c);
        tree.token.push_back(lat.cand[static_cast<size_t>(f.depth - 1) * lat.k + static_cast<size_t>(c)]);
        tree.logp.push_back(f.logp);
        const double parent_logp = f.parent < 0 ? 0.0 : tree.logp[static_cast<size_t>(f.parent)];
        push(f.parent, f.depth, f.rank + 1, parent_logp);  // the next sibling
        // the node's own row: position `depth` given this candidate as predecessor
        rows.push_back(f.depth < lat.n_pos ? rank_row(lat.row(f.depth, c), lat.k) : RankedRow{});
        push(node, f.depth + 1, 0, f.logp);  // its best child
    }
    return tree;
}

}  // namespace pdf2
