#include "engine/draft_length.h"

#include <algorithm>

namespace pdf2 {

namespace {
constexpr double DECAY = 0.97;           // older blocks fade: acceptance drifts with the text
}  // namespace

DraftLengthPolicy::DraftLengthPolicy(int max_draft)
    : max_draft_(std::max(0, max_draft)),
      reached_(static_cast<size_t>(std::max(0, max_draft)), PRIOR_REACHED),
      accepted_(static_cast<size_t>(std::max(0, max_draft)), PRIOR_ACCEPTED) {}

void DraftLengthPolicy::observe(int n_drafted, int n_accepted) {
    n_drafted = std::min(n_drafted, max_draft_);
    for (int i = 0; i < max_draft_; ++i) {
        reached_[static_cast<size_t>(i)] *= DECAY;
        accepted_[static_cast<size_t>(i)] *= DECAY;
    }
    // positions 1..n_accepted were reached and accepted; position n_accepted+1 was reached and rejected
    for (int i = 0; i < n_drafted && i <= n_accepted; ++i) {
        reached_[static_cast<size_t>(i)] += 1.0;
        if (i < n_accepted) {
            accepted_[static_cast<size_t>(i)] += 1.0;
        }
    }
}

std::vector<double> DraftLengthPolicy::acceptance() const {
    std::vector<double> a(static_cast<size_t>(max_draft_));
    for (size_t i = 0; i < a.size(); ++i) {
        a[i] = accepted_[i] / reached_[i];
    }
    return a;
}

double expected_tokens(const std::vector<double> & acceptance, int n) {
    double expected = 1.0;
    double reach = 1.0;
    for (int i = 0; i < n && i < static_cast<int>(acceptance.size()); ++i) {
        reach *= acceptance[static_cast<size_t>(i)];
        expected += reach;
    }
    return expected;
}

Price draft_price(const std::vector<double> & acceptance, const StepCosts & costs, int n) {
    return costs.price(expected_tokens(acceptance, n), 1, n + 1, n);
}

double DraftLengthPolicy::expected_tokens(int n) const { return pdf2::expected_tokens(acceptance(), n); }

}  // namespace pdf2
