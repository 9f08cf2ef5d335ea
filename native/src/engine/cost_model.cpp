#include "engine/cost_model.h"

#include "common/json_writer.h"
#include "engine/merged_draft_tree.h"

#include <algorithm>

namespace pdf2 {

CostModel::CostModel(int n_slots, int max_draft, int tree_max_budget)
    : max_draft_(max_draft),
      slot_policies_(static_cast<size_t>(std::max(0, n_slots)), DraftLengthPolicy(max_draft)),
      shared_(max_draft),
      tree_(tree_max_budget) {}

namespace {
constexpr double DECAY = 0.97;  // host work drifts with the text (context matches, tree shapes), device work with the context
}

void CostModel::set_costs(const StepCosts & costs, bool learn) {
    const HostCosts host = costs_.host;  // learned here, not measured with the tables
    costs_ = costs;
    costs_.host = host;
    costs_.seen = DeviceCorrection{};  // the device's corrections are relative to the old tables
    plain_seen_ = verify_seen_ = SeenSum{};
    learn_device_ = learn;
}

void CostModel::SeenSum::add(double seen_s, double table_s) {
    w = DECAY * w + 1.0;
    seen = DECAY * seen + seen_s;
    table = DECAY * table + table_s;
}

void CostModel::observe_device(bool plain, int n_slots, int rows, int extra_heads, double seconds) {
    if (!learn_device_ || !costs_.measured() || n_slots <= 0 || rows <= 0 || !(seconds > 0.0)) return;
    constexpr double MIN_STEPS = 3.0;  // one slow step (a page fault, a preempted thread) must not decide
    if (plain && n_slots == 1) {
        plain_seen_.add(seconds, 0.0);
        if (plain_seen_.w >= MIN_STEPS) costs_.seen.plain = plain_seen_.seen / plain_seen_.w;
        return;
    }
    verify_seen_.add(seconds, costs_.table_verify_seconds(n_slots, rows, plain) + costs_.head_s * std::max(0, extra_heads));
    if (verify_seen_.w >= MIN_STEPS && verify_seen_.table > 0.0) {
        costs_.seen.verify_scale = std::clamp(verify_seen_.seen / verify_seen_.table, 0.01, 100.0);
    }
}

void CostModel::HostFit::add(double rows, double seconds) {
    w = DECAY * w + 1.0;
    x = DECAY * x + rows;
    y = DECAY * y + seconds;
    xx = DECAY * xx + rows * rows;
    xy = DECAY * xy + rows * seconds;
}

// base + per_row * rows; where the rows barely vary (one configuration), proportional to them
void CostModel::HostFit::line(double & base, double & slope) const {
    base = 0.0;
    slope = per_row();
    if (w <= 0.0) return;
    const double mx = x / w, my = y / w;
    const double var = xx / w - mx * mx;
    if (var < 0.25) return;
    const double b = (xy / w - mx * my) / var;
    if (b < 0.0) {
        base = my;
        slope = 0.0;
    } else if (my - b * mx >= 0.0) {
        base = my - b * mx;
        slope = b;
    }
}

void CostModel::observe_host(bool plain, int rows, double seconds) {
    if (rows <= 0 || !(seconds >= 0.0)) return;
    HostFit & fit = plain ? plain_host_ : draft_host_;
    fit.add(static_cast<double>(rows), seconds);
    if (plain) {
        costs_.host.plain_per_slot = fit.per_row();
    } else {
        fit.line(costs_.host.draft_base, costs_.host.draft_per_row);
    }
}

void CostModel::start_request(int slot) { slot_policies_[static_cast<size_t>(slot)] = shared_; }

void CostModel::observe_chain(int slot, int n_drafted, int n_accepted) {
    slot_policies_[static_cast<size_t>(slot)].observe(n_drafted, n_accepted);
    shared_.observe(n_drafted, n_accepted);
}

void CostModel::observe_lattice_tree(int slot, const DraftTree & t, const std::vector<int32_t> & path, int chain,
                                     int n_in_place) {
    if (tree_.max_budget() > 0) {
        // the chain's estimate learns what the chain would have done (the tree's first-child chain)
        observe_chain(slot, chain, n_in_place);
        tree_.observe_verify(t, path);
    } else {
        const int depth = t.size() > 0 ? *std::max_element(t.depth.begin(), t.depth.end()) : 0;
        observe_chain(slot, depth, static_cast<int>(path.size()));
    }
}

// Each slot's policy prices a block as if it were decoded alone, where a drafted row costs a
// fraction of the first (weights are read once). In a batch of many slots on a CPU every row
// costs about the same, so the common length maximises the batch's rate under the linear model
// (StepCosts::step_seconds).
int CostModel::batch_draft_length(const std::vector<size_t> & slots) const {
    const int n_slots = static_cast<int>(slots.size());
    return best_rate(0, max_draft_, [&](int n) {
        double tokens = 0.0;
        for (const size_t i : slots) tokens += slot_policies_[i].expected_tokens(n);
        return costs_.price(tokens, n_slots, n + 1, n);
    }).index;
}

int CostModel::tree_budget(const std::vector<size_t> & slots, int n_chain, bool chain_probe) {
    if (tree_.max_budget() == 0 || slots.empty() || !priced()) {
        return 0;
    }
    const int n_slots = static_cast<int>(slots.size());
    double chain_tokens = 0.0;
    for (const size_t i : slots) chain_tokens += slot_policies_[i].expected_tokens(n_chain);
    const Price chain = costs_.price(chain_tokens, n_slots, n_chain + 1, n_chain);
    // per slot: (1 + expected accepted) over its share of the step
    const Choice tree =
        tree_.best([&](int nodes, double committed) {
            return Price{committed, costs_.step_seconds(n_slots, nodes + 1, max_draft_) / n_slots +
                                        costs_.head_seconds(committed - 1.0)};
        });
    const int best_budget = tree.index;
    // the chain first: a tie keeps it
    const bool chosen = tree_.has_trees() && best_budget > 0 &&
                        best_rate(0, 1, [&](int i) { return i == 0 ? chain : tree.price; }).index == 1;
    // a chosen tree restarts the probe schedule; no tree probe while the chain probes (one at a time)
    const bool probe = (chosen || !chain_probe) && tree_.schedule(chosen);
    const int budget = chosen            ? best_budget
                       : !probe          ? 0
                       : tree_.has_trees() && best_budget > 0 ? best_budget
                                                             : tree_.probe_budget();
    n_tree_probes_ += probe ? 1 : 0;
    n_tree_steps_ += budget > 0 ? 1 : 0;
    return budget;
}

double CostModel::lattice_expected(int slot, int tree_budget, int n_drafts) const {
    return tree_budget > 0 && tree_.has_trees() ? tree_.expected_accepted(tree_budget)
                                                : policy(slot).expected_tokens(n_drafts) - 1.0;
}

// The context's candidates are known before any drafting, calibrated; the merged tree's gain over
// either source is not (its lattice half comes with the propose), so it is priced at the better
// source's expectation, a lower bound.
bool CostModel::context_alone(const std::vector<double> & e, double lattice_expected, int lattice_rows,
                              int n_drafts) const {
    if (!priced()) return e.back() >= lattice_expected;
    const auto context_price = [&](int b) { return costs_.price(1.0 + e[static_cast<size_t>(b)], 1, b + 1, 0); };
    const int context_rows = best_rate(0, static_cast<int>(e.size()) - 1, context_price).index + 1;
    const double context_expected = e[static_cast<size_t>(context_rows - 1)];
    const Price merged = costs_.price(1.0 + std::max(context_expected, lattice_expected), 1,
                                      std::max(context_rows, lattice_rows), n_drafts);
    // the context alone first: a tie keeps it (no propose)
    return best_rate(0, 1, [&](int i) { return i == 0 ? context_price(context_rows - 1) : merged; }).index == 0;
}

int CostModel::tree_prefix(const DraftTree & t) const {
    if (!priced()) return t.size();
    return best_prefix(t, [&](int n, double committed) { return costs_.price(committed, 1, n + 1, 0); });
}

// tree_budget = auto: the steps that verified a tree (probes included), and the model's expected
// accepted drafts per budget b = 1..max (what the next choice weighs)
void CostModel::write_json(JsonWriter & w) const {
    w.key("tree_auto").begin_object();
    w.field("max_budget", tree_.max_budget());
    w.field("tree_steps", n_tree_steps_);
    w.field("probes", n_tree_probes_);
    w.key("expected_accepted").begin_array();
    for (int b = 1; b <= tree_.max_budget(); ++b) w.value(tree_.expected_accepted(b));
    w.end_array();
    w.key("chain_acceptance").begin_array();
    for (const double a : shared_.acceptance()) w.value(a);
    w.end_array();
    if (priced()) {
        // the choice one slot would make now: the best tree, against the chain's best n (0 = plain)
        const Choice tree =
            tree_.best([&](int nodes, double committed) { return costs_.price(committed, 1, nodes + 1, max_draft_); });
        const int n = shared_.best(costs_);
        const Price chain = draft_price(shared_.acceptance(), costs_, n);
        w.field("best_budget", tree.index);
        w.field("tree_expected_tokens", tree.price.committed);
        w.field("tree_rate", tree.rate);
        w.field("chain_n", n);
        w.field("chain_expected_tokens", chain.committed);
        w.field("chain_rate", chain.rate());
        w.field("plain_rate", draft_price(shared_.acceptance(), costs_, 0).rate());
        // the chain first: a tie keeps it
        const bool tree_wins = best_rate(0, 1, [&](int i) { return i == 0 ? chain : tree.price; }).index == 1;
        w.field("choice", tree_wins ? "tree" : n > 0 ? "chain" : "plain");
    }
    w.end_object();
}

}  // namespace pdf2
