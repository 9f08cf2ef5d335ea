// Automatic tree budget (tree_budget = auto): how many drafted nodes a step verifies as a
// best-first tree over the DFlash2 lattice, priced like the draft length (draft_length.h).
//
// A best-first tree of b nodes is the first b nodes of the tree of max_budget nodes (nodes are
// recorded as the expansion pops them), so one tree per drafted step tells what every smaller
// budget would have verified. A node is accepted when the target's own choices follow its whole
// path; the selector's path probability estimates that, and verifies calibrate the estimate: per
// band of path probability, accepted nodes over the probability they were given.
#pragma once

#include "drafter/draft_tree.h"
#include "engine/path_calibration.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace pdf2 {

class TreeBudgetPolicy {
  public:
    explicit TreeBudgetPolicy(int max_budget = 0);
    int max_budget() const { return max_budget_; }

    // A drafted tree of up to max_budget nodes over a lattice of the full block (its prefixes are
    // the smaller budgets' trees).
    void observe_tree(const DraftTree & t);
    // A verified tree: `path` = its accepted nodes, root first.
    void observe_verify(const DraftTree & t, const std::vector<int32_t> & path);
    bool has_trees() const { return n_trees_ > 0; }

    // Expected accepted drafts of a tree of b nodes (0..max_budget); 0 before any tree was seen.
    double expected_accepted(int b) const;
    // ... for every b = 0..max_budget
    std::vector<double> expected_curve() const;

    const PathCalibration & calibration() const { return calibration_; }
    static constexpr int N_BANDS = PathCalibration::N_BANDS;

  private:
    int max_budget_ = 0;
    int64_t n_trees_ = 0;
    std::vector<double> node_mass_;  // [i * N_BANDS + band]: running mean of node i's probability, by band
    PathCalibration calibration_;    // the lattice's selector estimates against accepted nodes
};

}  // namespace pdf2
