#include "engine/tree_budget.h"

#include <algorithm>
#include <cmath>

namespace pdf2 {

namespace {
constexpr double DECAY = 0.97;      // as the draft length's: acceptance drifts with the text
}  // namespace

TreeBudgetPolicy::TreeBudgetPolicy(int max_budget)
    : max_budget_(std::max(0, max_budget)),
      node_mass_(static_cast<size_t>(max_budget_) * N_BANDS, 0.0) {}

void TreeBudgetPolicy::observe_tree(const DraftTree & t) {
    if (max_budget_ == 0) return;
    // a running mean that starts at the first tree (not at the zeros before it)
    const double keep = n_trees_ == 0 ? 0.0 : DECAY;
    for (double & m : node_mass_) m *= keep;
    const int n = std::min(t.size(), max_budget_);
    for (int i = 0; i < n; ++i) {
        const double lp = t.logp[static_cast<size_t>(i)];
        node_mass_[static_cast<size_t>(i) * N_BANDS + static_cast<size_t>(PathCalibration::band_of(lp))] += (1.0 - keep) * std::exp(lp);
    }
    n_trees_ += 1;
}

void TreeBudgetPolicy::observe_verify(const DraftTree & t, const std::vector<int32_t> & path) {
    std::vector<char> accepted(static_cast<size_t>(t.size()), 0);
    for (const int32_t v : path) accepted[static_cast<size_t>(v)] = 1;
    calibration_.observe(t.logp, accepted);
}

double TreeBudgetPolicy::expected_accepted(int b) const {
    const std::vector<double> e = expected_curve();
    return e[static_cast<size_t>(std::clamp(b, 0, max_budget_))];
}

std::vector<double> TreeBudgetPolicy::expected_curve() const {
    std::vector<double> e(static_cast<size_t>(max_budget_) + 1, 0.0);
    for (int i = 0; i < max_budget_; ++i) {
        double node = 0.0;
        for (int band = 0; band < N_BANDS; ++band) {
            node += node_mass_[static_cast<size_t>(i) * N_BANDS + static_cast<size_t>(band)] * calibration_.factor(band);
        }
        e[static_cast<size_t>(i) + 1] = e[static_cast<size_t>(i)] + std::min(node, 1.0);  // a node is accepted at most once
    }
    return e;
}

}  // namespace pdf2
