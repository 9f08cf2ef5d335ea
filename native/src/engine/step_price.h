// What a step costs and what it commits: the one formula that prices verifying rows and drafting
// blocks (StepCosts), the one rate (Price::rate, committed tokens per second), the one chooser
// (best_rate) that picks among priced options, and the acceptance prior of a block position never
// drafted. The cost model (cost_model.h) and the policies it owns choose with these;
// pydflash2/draft_decision.py reads the priors and the choices through the C API.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

namespace pdf2 {

// A block position never drafted counts as PRIOR_ACCEPTED accepted in PRIOR_REACHED: an unknown
// drafter is assumed to get one draft in two.
constexpr double PRIOR_REACHED = 2.0;
constexpr double PRIOR_ACCEPTED = 1.0;

// One option a step could take: the tokens it is expected to commit (per slot 1 + its expected
// accepted drafts, summed over the slots it covers) and what the step costs.
struct Price {
    double committed = 1.0;
    double seconds = 0.0;
    double rate() const { return committed / std::max(seconds, 1e-9); }  // committed tokens per second
};

// What the chooser picked: the option's index (-1: no options), its rate and its price.
struct Choice {
    int index = -1;
    double rate = 0.0;
    Price price;
};

// The one place that chooses: of options first..last (price(i) -> Price), the one with the best
// rate; ties keep the earliest (the cheaper option, listed first by every caller).
template <class PriceOf> Choice best_rate(int first, int last, PriceOf price) {
    Choice best;
    for (int i = first; i <= last; ++i) {
        const Price p = price(i);
        const double r = p.rate();
        if (best.index < 0 || r > best.rate) best = {i, r, p};
    }
    return best;
}

// What a plan is called (the stats' PlanRun names): "plain", "chain of 3", "tree of 16", the known
// candidates' tree alone ("candidates' tree") or merged with the proposer's block ("merged tree").
std::string plan_name(int drafts, int tree_budget, bool merged = false, bool propose = false);

// One option a choice weighed: the plan it names and its price (unpriced: 1 token, 0 seconds).
struct PricedOption {
    int drafts = 0;       // the chain's drafts (a tree: the block's depth)
    int tree_budget = 0;  // > 0: a tree of this many nodes
    bool merged = false;  // the known candidates' tree, with the proposer's block (propose) or alone
    bool propose = false;
    Price price;
    std::string name() const { return plan_name(drafts, tree_budget, merged, propose); }
};

// A choice the cost model made: every option it weighed, each priced, and the one it took. The
// planner acts on the chosen option; the stats report the step's decisions as they were made.
struct Decision {
    const char * what = "";  // "draft length", "tree or chain", "candidates or merged"
    int slot = -1;           // the slot it was made for (-1: every decoding slot)
    int n_slots = 1;         // the slots its prices cover (committed: summed over them)
    std::vector<PricedOption> options;
    int chosen = -1;         // index in options (-1: nothing weighed)
    bool priced = false;     // the options carry prices (else the default was taken)
    bool probe = false;      // chosen as a probe, not for its price
    const PricedOption * choice() const { return chosen < 0 ? nullptr : &options[static_cast<size_t>(chosen)]; }
};

// Options first..last (option(i) -> PricedOption, its price set) weighed: the chosen one is
// best_rate's (ties keep the earliest).
template <class OptionOf> Decision weigh(const char * what, int first, int last, OptionOf option) {
    Decision d;
    d.what = what;
    d.priced = true;
    for (int i = first; i <= last; ++i) d.options.push_back(option(i));
    d.chosen = best_rate(0, static_cast<int>(d.options.size()) - 1,
                         [&](int k) { return d.options[static_cast<size_t>(k)].price; }).index;
    return d;
}

// Host work a step does that the measured tables leave out (the step ledger's host parts:
// planning, selection, each row's verification, KV bookkeeping, feature copies), learned as steps
// run (CostModel::observe_host): a sliver of a CPU's decode, much of a fast device's step.
struct HostCosts {
    double plain_per_slot = 0.0;  // a plain step's, per slot
    double draft_base = 0.0;      // a step that verifies drafts: a base, and per verify row
    double draft_per_row = 0.0;
    double seconds(bool plain, int n_slots, int rows) const {
        return plain ? plain_per_slot * n_slots : draft_base + draft_per_row * n_slots * rows;
    }
};

// The device's work as the steps run, against the measured tables (CostModel::observe_step): a
// table measured once, in a loop of its own, misprices what a step sees in use (a plain step right
// after another reuses its graph and finds the weights in cache; one after the drafter's graphs
// does not): measured 10.5-11.4 ms for SmolLM2's plain step on 2 threads against 7-8.6 ms in use.
struct DeviceCorrection {
    double plain = 0.0;         // a one-slot plain step's device seconds (0: none seen yet)
    double verify_scale = 1.0;  // the verify steps' device seconds over what the table says
};

// Whether a verify decode of `batch_rows` rows (every slot's, pending rows included) runs the full
// head, the sizes up to full_head_rows having been chosen for it (apply_costs): the decode asks it
// of the batch it makes, the price of the batch it expects, so both decide alike at the cutoff.
inline bool takes_full_head(int batch_rows, int full_head_rows) { return batch_rows <= full_head_rows; }

// Measured costs: verify_s[B-1] = seconds of a target decode of B rows, draft_s[n-1] = seconds to
// propose a block of n drafts. Sizes past a table's end cost its last entry.
struct StepCosts {
    std::vector<double> verify_s;
    std::vector<double> draft_s;
    // The plain step the user would get without speculation: a one-row decode that skips the
    // drafter's features (0: not measured). Where a one-row verify costs measurably more (the H200's
    // 1.9x of issue 46 was measured while the taps were switched per step, each switch a scheduler
    // reserve: issue 57), the cost model prices plain decoding at it, and the engine then decodes
    // plain steps so (the drafter goes without those rows).
    double plain_s = 0.0;
    // A lazy head's product for one more row a verify reads (0: the head runs in the decode's graph).
    // The table's verifies read one row; a verify that commits k tokens reads k, so the head's
    // work grows with what is accepted, not with the rows verified: on the CPU stand-in (2 layers,
    // SmolLM2's vocabulary) a verify that committed 4.5 tokens took 3x its table entry.
    double head_s = 0.0;
    // Verifies of at most this many rows (all slots') run the full head instead: every row's head in
    // the decode's graph, which verify_s holds for those sizes, and no product for the rows read.
    int full_head_rows = 0;
    HostCosts host;  // added to every step's price
    DeviceCorrection seen;  // the tables corrected by the steps as they ran (where costs are learned)

    bool measured() const { return !verify_s.empty(); }
    // enough to price rows beyond the first (the batch's linear model needs two sizes)
    bool has_row_cost() const { return verify_s.size() >= 2; }

    // Plain steps skip the drafter's features where that is measurably cheaper (by 5%).
    bool starve_plain() const { return plain_s > 0.0 && !verify_s.empty() && verify_s.front() > 1.05 * plain_s; }
    // seconds to draft a block of n (0: nothing drafted)
    double draft_seconds(int n) const;
    // the measured table's seconds of a target decode in which `n_slots` slots each verify `rows`
    // rows: the table for one slot; for several, a linear model: the first row (a plain step's
    // where plain steps are so priced), then the marginal row cost measured on one slot for every
    // other row (on a CPU a batch's rows cost about the same)
    double table_verify_seconds(int n_slots, int rows, bool plain_step) const;
    // seconds of a step in which `n_slots` slots each verify `rows` rows after drafting n: the
    // table's decode as the steps saw it (`seen`), each slot's (serial) drafting, the host's work
    double step_seconds(int n_slots, int rows, int n) const;
    // the lazy head's seconds for `extra` rows read beyond the table's one per slot
    double head_seconds(double extra) const { return seen.verify_scale * head_s * std::max(0.0, extra); }
    // An option's price: `committed` tokens over all n_slots slots from a step verifying `rows`
    // rows each after drafting n; the head reads a row per committed token.
    Price price(double committed, int n_slots, int rows, int n) const {
        const bool full_head = takes_full_head(std::max(n_slots, 1) * rows, full_head_rows);
        return Price{committed, step_seconds(n_slots, rows, n) +
                                    (full_head ? 0.0 : head_seconds(committed - std::max(n_slots, 1)))};
    }
};

}  // namespace pdf2
