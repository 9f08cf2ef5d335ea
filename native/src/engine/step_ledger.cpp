#include "engine/step_ledger.h"

#include <numeric>

namespace pdf2 {

const char * part_name(Part p) {
    static const char * const names[kParts] = {"plan",   "offers", "propose",  "graph_setup", "select", "build",
                                               "decode", "sync",   "head",     "verify",      "kv",     "features",
                                               "inject", "sources", "prefill", "other"};
    return names[static_cast<size_t>(p)];
}

bool is_host(Part p) {
    switch (p) {
        case Part::Decode:
        case Part::Sync:
        case Part::Head:
        case Part::Prefill:
        case Part::Propose:
        case Part::Inject:
            return false;
        default:
            return true;
    }
}

StepLedger::Scope::Scope(StepLedger & ledger, Part part)
    : ledger_(ledger),
      part_(ledger.prefill_open_ > 0 ? Part::Prefill : part),
      opens_prefill_(part == Part::Prefill),
      t0_(Clock::now()) {
    ledger_.inner_.push_back(0.0);
    if (opens_prefill_) ++ledger_.prefill_open_;
}

StepLedger::Scope::~Scope() {
    const double elapsed = std::chrono::duration<double>(Clock::now() - t0_).count();
    const double inner = ledger_.inner_.back();
    ledger_.inner_.pop_back();
    ledger_.seconds_[static_cast<size_t>(part_)] += elapsed - inner;
    if (!ledger_.inner_.empty()) ledger_.inner_.back() += elapsed;
    if (opens_prefill_) --ledger_.prefill_open_;
}

void StepLedger::add(Part part, double seconds) {
    seconds_[static_cast<size_t>(prefill_open_ > 0 ? Part::Prefill : part)] += seconds;
    if (!inner_.empty()) inner_.back() += seconds;
}

double StepLedger::total() const { return std::accumulate(seconds_.begin(), seconds_.end(), 0.0); }

double StepLedger::host() const {
    double t = 0.0;
    for (size_t i = 0; i < kParts; ++i) t += is_host(static_cast<Part>(i)) ? seconds_[i] : 0.0;
    return t;
}

}  // namespace pdf2
