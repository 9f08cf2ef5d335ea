#include "engine/step_price.h"

#include <algorithm>

namespace pdf2 {

std::string plan_name(int drafts, int tree_budget, bool merged, bool propose) {
    if (merged) return propose ? "merged tree" : "candidates' tree";
    if (drafts <= 0) return "plain";
    if (tree_budget > 0) return "tree of " + std::to_string(tree_budget);
    return "chain of " + std::to_string(drafts);
}

double StepCosts::draft_seconds(int n) const {
    if (n <= 0 || draft_s.empty()) {
        return 0.0;
    }
    return draft_s[std::min(static_cast<size_t>(n - 1), draft_s.size() - 1)];
}

double StepCosts::table_verify_seconds(int n_slots, int rows, bool plain_step) const {
    const std::vector<double> & v = verify_s;
    const double first = plain_step && starve_plain() ? plain_s : v.front();
    rows = std::max(rows, 1);
    if (n_slots <= 1) {
        return rows == 1 ? first : v[std::min(static_cast<size_t>(rows - 1), v.size() - 1)];
    }
    const double row = std::max(0.0, (v.back() - v.front()) / static_cast<double>(v.size() - 1));
    return first + (n_slots * rows - 1.0) * row;
}

double StepCosts::step_seconds(int n_slots, int rows, int n) const {
    n_slots = std::max(n_slots, 1);
    const bool plain_step = rows <= 1 && n == 0;
    const double host_s = host.seconds(plain_step, n_slots, std::max(rows, 1));
    // A plain step's first row as plain steps ran (the table's until one is seen: the verify
    // steps' scale holds what plain steps do not do, the lazy head of every row a verify reads);
    // every other row the table as the verify steps saw it.
    const double first = plain_step ? (seen.plain > 0.0 ? seen.plain : table_verify_seconds(1, 1, true)) : 0.0;
    const double device = plain_step ? first + seen.verify_scale * (table_verify_seconds(n_slots, 1, true) -
                                                                     table_verify_seconds(1, 1, true))
                                     : seen.verify_scale * table_verify_seconds(n_slots, rows, false);
    return host_s + device + n_slots * draft_seconds(n);
}

}  // namespace pdf2
