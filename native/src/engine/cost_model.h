// The cost model of a step: the one formula that prices verifying rows and drafting blocks, and
// the acceptance prior of a block position never drafted. The draft length (draft_length.h), the
// batch's common length and the automatic tree budget (tree_budget.h) all price steps here, and
// pydflash2/draft_decision.py reads the priors through the C API (pdf2_draft_prior_*).
#pragma once

#include <vector>

namespace pdf2 {

// A block position never drafted counts as PRIOR_ACCEPTED accepted in PRIOR_REACHED: an unknown
// drafter is assumed to get one draft in two.
constexpr double PRIOR_REACHED = 2.0;
constexpr double PRIOR_ACCEPTED = 1.0;

// Measured costs: verify_s[B-1] = seconds of a target decode of B rows, draft_s[n-1] = seconds to
// propose a block of n drafts. Sizes past a table's end cost its last entry.
struct StepCosts {
    std::vector<double> verify_s;
    std::vector<double> draft_s;

    bool measured() const { return !verify_s.empty(); }
    // enough to price rows beyond the first (the batch's linear model needs two sizes)
    bool has_row_cost() const { return verify_s.size() >= 2; }

    // seconds to draft a block of n (0: nothing drafted)
    double draft_seconds(int n) const;
    // seconds of a step in which `n_slots` slots each verify `rows` rows after drafting n: the
    // measured table for one slot; for several, a linear model: the first row, then the marginal
    // row cost measured on one slot for every other row (on a CPU a batch's rows cost about the
    // same), plus each slot's (serial) drafting
    double step_seconds(int n_slots, int rows, int n) const;
};

}  // namespace pdf2
