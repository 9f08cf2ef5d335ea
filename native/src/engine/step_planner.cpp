// The planner: what each step verifies. Per decoding slot the draft length (its policy, the
// batch's common length under the cost model, the probes), the automatic tree budget, and the
// caps of context, max_tokens, batch share and pending rows; then it asks each slot's draft
// source for the block and groups the slots by their verify rows.
#include "engine/batch_engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace pdf2 {

std::string BatchEngine::SlotPlan::name() const { return plan_name(n_drafts, tree_budget, merged, propose); }

// One slot's draft length alone: its policy's (a fixed block), or the cost model's decision.
int BatchEngine::slot_draft_length(StepPlan & plan, const SlotView & v) {
    if (v.proposer < 0 || max_draft_ == 0) {
        return 0;
    }
    if (opts_.draft_length != DraftLength::Adaptive) return max_draft_;  // probes: plan_step()
    return plan.decide(v.index, cost_model_.draft_length(v.proposal)).drafts;
}

// A decision for every decoding slot that has a proposer (the batch's length, the tree budget).
const PricedOption & BatchEngine::StepPlan::decide_all(Decision d) {
    decisions.push_back(std::move(d));
    for (const size_t i : decoding) {
        if (slots[i].proposer >= 0) slots[i].decision = static_cast<int>(decisions.size()) - 1;
    }
    return *decisions.back().choice();
}

// A decision for one slot (its draft length alone, its candidates alone or merged).
const PricedOption & BatchEngine::StepPlan::decide(size_t slot, Decision d) {
    d.slot = static_cast<int>(slot);
    decisions.push_back(std::move(d));
    slots[slot].decision = static_cast<int>(decisions.size()) - 1;
    return *decisions.back().choice();
}

// The tokens a chain's or tree's plan is expected to commit: 1 + its proposer's expectation.
double BatchEngine::expected_committed(const SlotPlan & p, const SlotView & v) {
    if (p.proposer < 0 || p.n_drafts <= 0) return 1.0;
    OfferRequest req;
    req.n_drafts = p.n_drafts;
    req.tree_budget = p.tree_budget;
    return 1.0 + v.proposal.expected(req);
}

// Batch rows each of n decoding slots may take after its anchor (pending rows included).
int BatchEngine::row_share(int n_decoding) const {
    int share = n_decoding > 0 ? batch_cap_ / n_decoding - 1 : 0;
    if (exact_rows_ > 0) share = std::min(share, exact_rows_ - 1);
    return share;
}

// What the planner reads of each decoding slot: the slot, its proposing source's offer (its
// acceptance curves) and what its known candidates (the context's, any added source's) expect, at
// the depth and nodes the slot's room allows. The sources are asked here, slot by slot; the
// planner then only reads.
std::vector<BatchEngine::SlotView> BatchEngine::slot_views() {
    std::vector<SlotView> views;
    for (size_t i = 0; i < slots_.size(); ++i) {
        if (slots_[i].state() == State::Decode) views.push_back(SlotView{i, &slots_[i]});
    }
    const int share = row_share(static_cast<int>(views.size()));
    for (SlotView & v : views) {
        Slot & s = slots_[v.index];  // (its sources are asked for offers: not const)
        std::vector<Offer> offers = s.sources().offers(OfferRequest{});
        for (size_t j = 0; j < offers.size() && v.proposer < 0; ++j) {
            if (!offers[j].proposes()) continue;
            v.proposer = static_cast<int>(j);
            v.proposal = std::move(offers[j]);
        }
        if (opts_.context_nodes == 0) continue;
        const int room = opts_.n_ctx_slot - s.seq().pos - 1;
        int depth = std::min(kContextMaxDepth, room);
        const Slot::Request & r = s.request();
        if (r.max_tokens > 0) {
            depth = std::min<int>(depth, r.max_tokens - static_cast<int>(r.stats.n_generated) - 1);
        }
        int nodes = std::min(opts_.context_nodes, share - static_cast<int>(s.seq().pending.size()));
        if (borrowed_) nodes = std::min(nodes, room);  // a borrowed context holds no cells beyond its size
        if (opts_.tree_budget > 0 && !opts_.tree_auto) nodes = std::min(nodes, opts_.tree_budget);  // a fixed budget
        if (depth <= 0 || nodes <= 0) continue;
        const StepLedger::Scope offer_scope(stats_.ledger(), Part::Offers);
        v.known = s.sources().merged().expected_accepted(s.sources(), depth, nodes, kContextBranches);
        v.merge_depth = depth;
        v.merge_nodes = nodes;
    }
    return views;
}

// Every decoding slot verifies the same number of rows: llama.cpp splits a multi-sequence batch
// into ubatches of equal rows per sequence, so equal rows keep it one ubatch (and our rows in
// batch order). The common draft length is the longest any slot's policy asks for.
BatchEngine::StepPlan BatchEngine::plan_step(const std::vector<SlotView> & views) {
    StepPlan plan;
    plan.slots.resize(slots_.size());
    std::vector<const Offer *> proposals;  // the decoding slots' proposing sources' offers
    for (const SlotView & v : views) {
        plan.decoding.push_back(v.index);
        plan.slots[v.index].proposer = v.proposer;
        if (v.proposer >= 0) proposals.push_back(&v.proposal);
    }
    const int n_decoding = static_cast<int>(plan.decoding.size());
    const bool adaptive = opts_.draft_length == DraftLength::Adaptive && max_draft_ > 0;
    if (adaptive && cost_model_.priced() && n_decoding > 1) {
        plan.common_length = plan.decide_all(cost_model_.batch_draft_length(proposals)).drafts;
    } else {
        for (const SlotView & v : views) plan.common_length = std::max(plan.common_length, slot_draft_length(plan, v));
    }
    // While nobody drafts, a probe now and then lets the acceptance estimate
    // recover. One schedule for the engine, counted in steps (a new request
    // does not restart it: with many short requests, per-request schedules
    // probed in most of them), and one slot probes at a time, in turn.
    if (adaptive && n_decoding > 0) {
        const int n = cost_model_.schedule_chain(plan.common_length);
        if (cost_model_.chain_probing()) {
            plan.probe_slot = static_cast<int>(plan.decoding[static_cast<size_t>(probe_turn_++) % plan.decoding.size()]);
            plan.probe_length = n;
        }
    }
    // tree_budget = auto: a tree for every decoding slot when the cost model prices it above the
    // chain's choice (or now and then as a probe), at the block's full depth; else the chain
    plan.tree_budget = opts_.tree_budget;
    if (opts_.tree_auto) {
        Decision d = cost_model_.tree_budget(proposals, plan.common_length, plan.probe_slot >= 0);
        plan.tree_budget = d.chosen < 0 ? 0 : plan.decide_all(std::move(d)).tree_budget;
    }
    if (opts_.tree_auto && plan.tree_budget > 0) {
        plan.common_length = max_draft_;
        plan.probe_slot = -1;
    }
    plan.row_share = row_share(n_decoding);
    for (const SlotView & v : views) {
        SlotPlan & p = plan.slots[v.index];
        const SlotPlan chosen = p;
        p = plan_slot(plan, v);
        p.proposer = chosen.proposer;
        p.decision = chosen.decision;
        p.expected = expected_committed(p, v);
    }
    plan_context(plan, views);
    return plan;
}

// Known candidates (the context's, any added source's): a slot whose sources offer some verifies
// their tree alone (no propose) when the cost model prices that at least as fast as the proposer's
// plan with them merged in; else the merged tree.
void BatchEngine::plan_context(StepPlan & plan, const std::vector<SlotView> & views) {
    for (const SlotView & v : views) {
        SlotPlan & p = plan.slots[v.index];
        const std::vector<double> & e = v.known;
        if (e.size() <= 1) continue;  // nothing known: the proposer's plan
        p.merged = true;
        p.merge_depth = v.merge_depth;
        p.merge_nodes = v.merge_nodes;
        if (p.proposer < 0 || p.n_drafts <= 0) continue;  // the candidates alone
        if (opts_.tree_budget > 0 && !opts_.tree_auto) {
            p.propose = true;  // a fixed tree: the budget is shared, every step
            continue;
        }
        OfferRequest block;
        block.n_drafts = p.n_drafts;
        block.tree_budget = p.tree_budget;
        const int rows = 1 + (p.tree_budget > 0 ? p.tree_budget : p.n_drafts);
        p.propose = plan.decide(v.index, cost_model_.candidates_alone(e, v.proposal.expected(block), rows, p.n_drafts)).propose;
    }
}

// The number of a context or merged tree's best nodes to verify: the cost model's best prefix, a
// fixed budget's size, or (no measured costs) all.
int BatchEngine::context_prefix(const DraftBlock & b) const {
    if (opts_.tree_budget > 0 && !opts_.tree_auto) return std::min(b.tree.size(), opts_.tree_budget);
    return cost_model_.tree_prefix(b.tree);
}

// The caps of one slot: the verify rows [anchor, d1..dn] must fit its context, the request's
// max_tokens and its share of the batch, after its pending rows.
BatchEngine::SlotPlan BatchEngine::plan_slot(const StepPlan & plan, const SlotView & v) const {
    const Slot & s = *v.slot;
    const size_t i = v.index;
    SlotPlan out;
    // a probing slot drafts its probe (in a group of its own when the others do not draft)
    const int wanted = static_cast<int>(i) == plan.probe_slot ? std::max(plan.probe_length, plan.common_length)
                                                              : plan.common_length;
    const int room = opts_.n_ctx_slot - s.seq().pos - 1;
    int n = plan.slots[i].proposer < 0 ? 0 : std::min({wanted, room, plan.row_share});
    const Slot::Request & r = s.request();
    if (r.max_tokens > 0) {
        // no rows past the request's last token (a slot near its end may verify in a group of its own)
        n = std::max(0, std::min<int>(n, r.max_tokens - static_cast<int>(r.stats.n_generated) - 1));
    }
    const int n_pending = static_cast<int>(s.seq().pending.size());
    out.n_drafts = std::max(0, std::min(n, plan.row_share - n_pending));
    if (plan.tree_budget > 0 && out.n_drafts > 0) {
        // its rows share the batch like a chain's; a borrowed context holds no cells beyond its size
        out.tree_budget = std::min(plan.tree_budget, plan.row_share - n_pending);
        if (borrowed_) out.tree_budget = std::min(out.tree_budget, room);
    }
    return out;
}

BatchEngine::Groups BatchEngine::draft_blocks(const StepPlan & plan) {
    Groups groups;  // a slot near its context end drafts less: a group of its own
    for (const size_t i : plan.decoding) {
        const Slot & s = slots_[i];
        {
            const StepLedger::Scope planning(stats_.ledger(), Part::Plan);
            price_plan(plan, i);
        }
        draft(i, plan.slots[i]);
        // a grammar may end the block early
        groups[static_cast<int>(s.seq().pending.size() + s.rows().block.tokens.size()) + 1].push_back(
            static_cast<int>(i));
    }
    return groups;
}

// The slot's share of what the step's decisions priced its plan at (0 where a cap or a probe
// changed it) and plain decoding at; its request's stats keep the decision its plan came from.
void BatchEngine::price_plan(const StepPlan & plan, size_t i) {
    Slot & s = slots_[i];
    const SlotPlan & p = plan.slots[i];
    s.price(0.0, 0.0);
    if (p.decision < 0) return;
    const Decision & d = plan.decisions[static_cast<size_t>(p.decision)];
    stats_.decided(s.stats(), d);
    if (!d.priced) return;
    double rate = 0.0, plain_rate = 0.0;
    if (d.choice()->name() == p.name()) rate = d.choice()->price.rate() / d.n_slots;
    for (const Decision & any : plan.decisions) {
        if (!any.priced || (any.slot >= 0 && any.slot != static_cast<int>(i))) continue;
        for (const PricedOption & o : any.options) {
            if (!o.merged && o.drafts == 0) plain_rate = o.price.rate() / any.n_slots;
        }
    }
    s.price(rate, plain_rate);
}

// What a slot's source is asked for: n drafts (a tree of tree_budget nodes when > 0) after its anchor.
DraftRequest BatchEngine::draft_request(Slot & s, int n, int tree_budget) const {
    DraftRequest req;
    req.anchor = s.seq().anchor;
    req.pos = s.seq().pos;
    req.n = n;
    req.tree_budget = tree_budget;
    req.sampler = &s.sampler();
    return req;
}

void BatchEngine::draft(size_t i, const SlotPlan & p) {
    Slot & s = slots_[i];
    DraftBlock & block = s.plan_block(p.name(), p.expected);
    if (p.merged) {
        draft_merged(s, p, block);
        return;
    }
    if (p.n_drafts <= 0) {
        return;
    }
    const StepLedger::Scope select(stats_.ledger(), Part::Select);  // the source's own timers split it
    s.sources().draft(p.proposer, draft_request(s, p.n_drafts, p.tree_budget), block);
    record_draft_times(block);
}

// A drafted block's timers in the ledger (graph setup, propose); the rest of drafting is selection.
void BatchEngine::record_draft_times(const DraftBlock & block) {
    stats_.ledger().add(Part::GraphSetup, block.graph_setup_s);
    stats_.ledger().add(Part::Propose, block.propose_s);
    stats_.graph_builds(block.n_graph_builds);
}

// A merged tree (merged_draft_source.h): the known candidates alone (no propose), or with the
// proposer's block (its tree at the merged tree's node budget, or a DFlash1 chain); the cost model
// keeps its best prefix, and expects what the kept nodes' estimates add up to.
void BatchEngine::draft_merged(Slot & s, const SlotPlan & p, DraftBlock & block) {
    DraftRequest req = draft_request(s, p.propose ? std::max(1, std::min(max_draft_, p.merge_depth)) : 0, p.merge_nodes);
    req.depth = p.merge_depth;
    req.max_leaves = p.propose ? tree_branches_ : kContextBranches;
    const StepLedger::Scope select(stats_.ledger(), Part::Select);  // the source's own timers split it
    s.sources().merged().draft(s.sources(), req, block);
    truncate_block(block, context_prefix(block));
    record_draft_times(block);
    double expected = 1.0;
    for (const double logp : block.tree.logp) expected += std::exp(logp);
    s.expect(expected);
    if (!block.tokens.empty()) {
        stats_.merged_step(s.stats(), /*propose_skipped =*/!p.propose && p.proposer >= 0);
    }
}

}  // namespace pdf2
