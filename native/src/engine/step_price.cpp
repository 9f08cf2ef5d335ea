#include "engine/step_price.h"

#include <algorithm>

namespace pdf2 {

double StepCosts::draft_seconds(int n) const {
    if (n <= 0 || draft_s.empty()) {
        return 0.0;
    }
    return draft_s[std::min(static_cast<size_t>(n - 1), draft_s.size() - 1)];
}

double StepCosts::step_seconds(int n_slots, int rows, int n) const {
    const std::vector<double> & v = verify_s;
    const double draft = draft_seconds(n);
    const bool plain_step = rows <= 1 && n == 0;
    const bool plain = plain_step && starve_plain();  // what a plain step costs then
    const double host_s = host.seconds(plain_step, std::max(n_slots, 1), std::max(rows, 1));
    if (n_slots <= 1) {
        return host_s + (plain ? plain_s : v[std::min(static_cast<size_t>(std::max(rows, 1) - 1), v.size() - 1)] + draft);
    }
    const double row = std::max(0.0, (v.back() - v.front()) / static_cast<double>(v.size() - 1));
    return host_s + (plain ? plain_s : v.front()) + (n_slots * rows - 1.0) * row + n_slots * draft;
}

}  // namespace pdf2
