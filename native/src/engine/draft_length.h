// Adaptive draft length: pick the number of drafted tokens n (0 = plain
// decoding) that maximises expected committed tokens per second, from the
// measured target verify cost t(B), the drafter cost d(n), and a running
// per-position acceptance estimate.
#pragma once

#include "engine/step_price.h"

#include <vector>

namespace pdf2 {

// Committed tokens per step with n drafts (1 + expected accepted), given the conditional
// acceptance of each block position.
double expected_tokens(const std::vector<double> & acceptance, int n);
// One slot's step with n drafts, priced: expected_tokens against a verify of n+1 rows + drafting n.
Price draft_price(const std::vector<double> & acceptance, const StepCosts & costs, int n);

class DraftLengthPolicy {
  public:
    explicit DraftLengthPolicy(int max_draft);

    // One verified block: n drafts offered, the first n_accepted accepted.
    void observe(int n_drafted, int n_accepted);

    int max_draft() const { return max_draft_; }

    // Conditional acceptance estimate of each position (1-based index i-1).
    std::vector<double> acceptance() const;
    double expected_tokens(int n) const;  // committed per step with n drafts (1 + accepted)

  private:
    int max_draft_;
    std::vector<double> reached_;   // decayed count of blocks that reached position i
    std::vector<double> accepted_;  // ... in which position i was accepted
};

}  // namespace pdf2
