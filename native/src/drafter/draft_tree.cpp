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

// The candidates of the rows the tree expands, ranked by score (stable: equal scores keep index
// order, as the greedy selector's argmax takes the first), with their log-softmax at
// kDraftTreeTemperature; non-finite scores are left out. One flat pool for the whole tree: a
// vector or two per row and a stable_sort's buffer were most of building a 16-node tree (~2 us
// a row, SmolLM2's lattice).
class RankedRows {
  public:
    RankedRows(int k, int n_rows) : k_(k) {
        order_.reserve(static_cast<size_t>(k) * static_cast<size_t>(n_rows));
        logp_.reserve(static_cast<size_t>(k) * static_cast<size_t>(n_rows));
        size_.reserve(static_cast<size_t>(n_rows));
    }
    void add(const float * row) {
        const size_t base = order_.size();
        order_.resize(base + static_cast<size_t>(k_));
        logp_.resize(base + static_cast<size_t>(k_));
        int32_t * order = order_.data() + base;
        int n = 0;
        double mx = -std::numeric_limits<double>::infinity();
        for (int c = 0; c < k_; ++c) {
            if (!std::isfinite(row[c])) continue;
            mx = std::max(mx, static_cast<double>(row[c]));
            int j = n++;  // insertion sort: stable, and k is small
            for (; j > 0 && row[c] > row[order[j - 1]]; --j) order[j] = order[j - 1];
            order[j] = c;
        }
        double * logp = logp_.data() + base;
        double sum = 0.0;
        for (int j = 0; j < n; ++j) {
            logp[j] = (static_cast<double>(row[order[j]]) - mx) / kDraftTreeTemperature;
            sum += std::exp(logp[j]);
        }
        const double log_z = std::log(sum);
        for (int j = 0; j < n; ++j) logp[j] -= log_z;
        size_.push_back(n);
    }
    void add_empty() {
        order_.resize(order_.size() + static_cast<size_t>(k_));
        logp_.resize(logp_.size() + static_cast<size_t>(k_));
        size_.push_back(0);
    }
    int size(int32_t r) const { return size_[static_cast<size_t>(r)]; }
    int32_t order(int32_t r, int rank) const { return order_[at(r, rank)]; }
    double logp(int32_t r, int rank) const { return logp_[at(r, rank)]; }

  private:
    size_t at(int32_t r, int rank) const { return static_cast<size_t>(r) * static_cast<size_t>(k_) + static_cast<size_t>(rank); }
    int k_;
    std::vector<int32_t> order_;
    std::vector<double> logp_;
    std::vector<int> size_;
};

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
    RankedRows rows(lat.k, budget + 1);
    rows.add(lat.row(0, 0));
    for (auto * v : {&tree.parent, &tree.depth, &tree.cand, &tree.token}) v->reserve(static_cast<size_t>(budget));
    tree.logp.reserve(static_cast<size_t>(budget));
    std::vector<Frontier> frontier;
    frontier.reserve(2 * static_cast<size_t>(budget) + 1);  // each node pushes at most two
    std::priority_queue<Frontier> heap(std::less<Frontier>(), std::move(frontier));
    uint64_t seq = 0;
    const auto push = [&](int32_t parent, int32_t depth, int32_t rank, double parent_logp) {
        if (rank < rows.size(parent + 1)) {
            heap.push({parent_logp + rows.logp(parent + 1, rank), seq++, parent, depth, rank});
        }
    };
    push(-1, 1, 0, 0.0);
    while (tree.size() < budget && !heap.empty()) {
        const Frontier f = heap.top();
        heap.pop();
        const int32_t c = rows.order(f.parent + 1, f.rank);
        const int32_t node = tree.size();
        tree.parent.push_back(f.parent);
        tree.depth.push_back(f.depth);
        tree.cand.push_back(c);
        tree.token.push_back(lat.cand[static_cast<size_t>(f.depth - 1) * lat.k + static_cast<size_t>(c)]);
        tree.logp.push_back(f.logp);
        const double parent_logp = f.parent < 0 ? 0.0 : tree.logp[static_cast<size_t>(f.parent)];
        push(f.parent, f.depth, f.rank + 1, parent_logp);  // the next sibling
        // the node's own row: position `depth` given this candidate as predecessor
        if (f.depth < lat.n_pos) {
            rows.add(lat.row(f.depth, c));
        } else {
            rows.add_empty();
        }
        push(node, f.depth + 1, 0, f.logp);  // its best child
    }
    return tree;
}

}  // namespace pdf2
