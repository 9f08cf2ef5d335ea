#include "engine/cost_model.h"

#include "common/json_writer.h"
#include "engine/draft_length.h"
#include "engine/merged_draft_tree.h"

#include <algorithm>

namespace pdf2 {

CostModel::CostModel(int max_draft, int tree_max_budget)
    : max_draft_(std::max(0, max_draft)), tree_max_budget_(std::max(0, tree_max_budget)) {}

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

namespace {
PricedOption chain_option(int n, const Price & price) {
    PricedOption o;
    o.drafts = n;
    o.price = price;
    return o;
}
}  // namespace

Decision CostModel::draft_length(const Offer & offer) const {
    const auto max_draft = static_cast<int>(offer.chain_acceptance.size());
    if (max_draft == 0 || !costs_.measured()) {
        Decision d;  // nothing to price: the whole block (none without a proposer)
        d.what = "draft length";
        d.options.push_back(chain_option(max_draft, Price{}));
        d.chosen = 0;
        return d;
    }
    return weigh("draft length", 0, max_draft,
                 [&](int n) { return chain_option(n, draft_price(offer.chain_acceptance, costs_, n)); });
}

// Each slot's offer prices a block as if it were decoded alone, where a drafted row costs a
// fraction of the first (weights are read once). In a batch of many slots on a CPU every row
// costs about the same, so the common length maximises the batch's rate under the linear model
// (StepCosts::step_seconds).
Decision CostModel::batch_draft_length(const std::vector<const Offer *> & offers) const {
    const int n_slots = static_cast<int>(offers.size());
    Decision d = weigh("draft length", 0, max_draft_, [&](int n) {
        double tokens = 0.0;
        for (const Offer * o : offers) tokens += expected_tokens(o->chain_acceptance, n);
        return chain_option(n, costs_.price(tokens, n_slots, n + 1, n));
    });
    d.n_slots = n_slots;
    return d;
}

int CostModel::schedule_chain(int n) {
    constexpr int PROBE_DRAFT = 3;
    chain_probing_ = false;
    if (max_draft_ == 0 || !costs_.measured()) return n;
    if (chain_probes_.step(n > 0)) {
        chain_probing_ = true;  // probe; if plain decoding still wins afterwards, wait twice as long next time
        return std::min(PROBE_DRAFT, max_draft_);
    }
    return n;
}

Decision CostModel::tree_budget(const std::vector<const Offer *> & offers, int n_chain, bool chain_probe) {
    if (tree_max_budget_ == 0 || offers.empty() || !priced()) {
        return Decision{};
    }
    constexpr int PROBE_BUDGET = 4;  // before any tree was seen
    const int n_slots = static_cast<int>(offers.size());
    double chain_tokens = 0.0;
    std::vector<double> curve;  // the trees' expected accepted drafts by budget (empty: none seen)
    for (const Offer * o : offers) {
        chain_tokens += expected_tokens(o->chain_acceptance, n_chain);
        if (curve.empty()) curve = o->tree_accepted;
    }
    const bool has_trees = !curve.empty();
    if (!has_trees) curve.assign(static_cast<size_t>(tree_max_budget_) + 1, 0.0);
    const auto tree_committed = [&](int b) { return 1.0 + curve[static_cast<size_t>(std::min<int>(b, static_cast<int>(curve.size()) - 1))]; };
    // option 0 the chain, option b the tree of b nodes at the block's full depth; the chain first:
    // a tie keeps it
    Decision d = weigh("tree or chain", 0, tree_max_budget_, [&](int b) {
        if (b == 0) return chain_option(n_chain, costs_.price(chain_tokens, n_slots, n_chain + 1, n_chain));
        PricedOption tree = chain_option(max_draft_, costs_.price(n_slots * tree_committed(b), n_slots, b + 1, max_draft_));
        tree.tree_budget = b;
        return tree;
    });
    d.n_slots = n_slots;
    const int best_budget = best_rate(1, tree_max_budget_, [&](int b) { return d.options[static_cast<size_t>(b)].price; }).index;
    const bool chosen = has_trees && d.chosen > 0;  // (unseen trees are priced at none accepted)
    // a chosen tree restarts the probe schedule; no tree probe while the chain probes (one at a time)
    const bool probe = (chosen || !chain_probe) && tree_probes_.step(chosen);
    d.chosen = chosen                         ? best_budget
               : !probe                       ? 0
               : has_trees && best_budget > 0 ? best_budget
                                              : std::min(PROBE_BUDGET, tree_max_budget_);
    d.probe = probe && !chosen;
    n_tree_probes_ += probe ? 1 : 0;
    n_tree_steps_ += d.chosen > 0 ? 1 : 0;
    tree_decision_ = d;
    tree_curve_ = has_trees ? curve : std::vector<double>{};
    chain_acceptance_ = offers.front()->chain_acceptance;
    return d;
}

// The known candidates are calibrated before any drafting; the merged tree's gain over either
// side is not (the proposing source's half comes with the propose), so it is priced at the better
// side's expectation, a lower bound.
Decision CostModel::candidates_alone(const std::vector<double> & e, double proposed, int rows, int n) const {
    PricedOption alone, merged;
    alone.merged = merged.merged = merged.propose = true;
    alone.propose = false;
    merged.drafts = n;
    merged.tree_budget = rows - 1;
    if (!priced()) {
        Decision d;
        d.what = "candidates or merged";
        alone.tree_budget = static_cast<int>(e.size()) - 1;
        d.options = {alone, merged};
        d.chosen = e.back() >= proposed ? 0 : 1;
        return d;
    }
    const auto known_price = [&](int b) { return costs_.price(1.0 + e[static_cast<size_t>(b)], 1, b + 1, 0); };
    const int known_rows = best_rate(0, static_cast<int>(e.size()) - 1, known_price).index + 1;
    const double known_expected = e[static_cast<size_t>(known_rows - 1)];
    alone.tree_budget = known_rows - 1;
    alone.price = known_price(known_rows - 1);
    merged.tree_budget = std::max(known_rows, rows) - 1;
    merged.price = costs_.price(1.0 + std::max(known_expected, proposed), 1, std::max(known_rows, rows), n);
    // the candidates alone first: a tie keeps them (no propose)
    return weigh("candidates or merged", 0, 1, [&](int i) { return i == 0 ? alone : merged; });
}

int CostModel::tree_prefix(const DraftTree & t) const {
    if (!priced()) return t.size();
    return best_prefix(t, [&](int n, double committed) { return costs_.price(committed, 1, n + 1, 0); });
}

// tree_budget = auto: the steps that verified a tree (probes included), the trees' expected
// accepted drafts per budget b = 1..max and the chain's acceptance the last step weighed, and the
// tree against the chain as it weighed them
void CostModel::write_json(JsonWriter & w) const {
    w.key("tree_auto").begin_object();
    w.field("max_budget", tree_max_budget_);
    w.field("tree_steps", n_tree_steps_);
    w.field("probes", n_tree_probes_);
    w.key("expected_accepted").begin_array();
    for (int b = 1; b <= tree_max_budget_; ++b) {
        w.value(static_cast<size_t>(b) < tree_curve_.size() ? tree_curve_[static_cast<size_t>(b)] : 0.0);
    }
    w.end_array();
    w.key("chain_acceptance").begin_array();
    for (const double a : chain_acceptance_) w.value(a);
    w.end_array();
    // as the last step weighed them (its prices cover its slots: expected tokens per slot)
    const Decision & d = tree_decision_;
    if (d.chosen >= 0) {
        const int best = best_rate(1, tree_max_budget_, [&](int b) { return d.options[static_cast<size_t>(b)].price; }).index;
        const PricedOption & tree = d.options[static_cast<size_t>(best)];
        const PricedOption & chain = d.options.front();
        w.field("best_budget", best);
        w.field("tree_expected_tokens", tree.price.committed / d.n_slots);
        w.field("tree_rate", tree.price.rate());
        w.field("chain_n", chain.drafts);
        w.field("chain_expected_tokens", chain.price.committed / d.n_slots);
        w.field("chain_rate", chain.price.rate());
        // plain decoding's price for one slot now, for reference (the draft length weighed it)
        w.field("plain_rate", costs_.price(1.0, 1, 1, 0).rate());
        w.field("choice", d.chosen > 0 && !d.probe ? "tree" : chain.drafts > 0 ? "chain" : "plain");
    }
    w.end_object();
}

}  // namespace pdf2
