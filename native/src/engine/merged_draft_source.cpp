#include "engine/merged_draft_source.h"

#include "common/clock.h"
#include "engine/draft_sources.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace pdf2 {

std::vector<double> MergedDraftSource::expected_accepted(SlotSources & sources, int max_depth, int max_nodes,
                                                         int max_leaves) {
    std::vector<double> out(1, 0.0);
    OfferRequest oreq;
    oreq.max_depth = max_depth;
    std::vector<const ScoredNodes *> known;
    for (const Offer & o : sources.offers(oreq)) known.push_back(o.proposes() ? nullptr : o.nodes);  // (a proposer's come with its propose)
    if (std::all_of(known.begin(), known.end(), [](const ScoredNodes * s) { return s == nullptr; })) return out;
    const MergedTree m = merge_draft_trees(known, max_nodes, max_leaves);
    for (const double lp : m.tree.logp) out.push_back(out.back() + std::exp(lp));
    return out;
}

void MergedDraftSource::draft(SlotSources & sources, const DraftRequest & req, DraftBlock & out) {
    const auto t0 = Clock::now();
    OfferRequest oreq;
    oreq.max_depth = req.depth;
    std::vector<Offer> offers = sources.offers(oreq);
    // the proposing sources draft first (their nodes come with the propose), at the drafter's depth
    double propose_s = 0.0, graph_setup_s = 0.0, select_s = 0.0;
    int64_t n_graph_builds = 0;
    bool proposed = false;
    for (int i = 0; i < sources.size(); ++i) {
        if (!offers[static_cast<size_t>(i)].proposes()) continue;
        offers[static_cast<size_t>(i)].nodes = nullptr;
        if (req.n <= 0) continue;
        DraftRequest own = req;
        own.depth = 0;
        own.merge = 1u << i;
        DraftBlock block;
        sources.draft(i, own, block);
        proposed = true;
        propose_s += block.propose_s;
        graph_setup_s += block.graph_setup_s;
        select_s += block.select_s;
        n_graph_builds += block.n_graph_builds;
        offers[static_cast<size_t>(i)] = sources.offer(i, oreq);
    }
    const auto t_merge = Clock::now();
    std::vector<const ScoredNodes *> nodes;
    for (const Offer & o : offers) nodes.push_back(o.nodes);
    const auto known = [](const ScoredNodes * n) { return n != nullptr; };
    if (!proposed && std::count_if(nodes.begin(), nodes.end(), known) == 1) {
        // one source's candidates alone: its own draft() (DraftSource's contract: its offer's tree,
        // the same nodes the merge below would make of them)
        DraftRequest own = req;
        own.n = req.depth;
        own.depth = 0;
        out.clear();
        sources.draft(static_cast<int>(std::find_if(nodes.begin(), nodes.end(), known) - nodes.begin()), own, out);
        out.seconds = seconds_since(t0);
        return;
    }
    MergedTree m = merge_draft_trees(nodes, req.tree_budget, req.max_leaves);
    // the drafters' timings stay; merging is selection
    out.clear();
    out.set_merged(std::move(m));
    out.propose_s = propose_s;
    out.graph_setup_s = graph_setup_s;
    out.n_graph_builds = n_graph_builds;
    out.select_s = select_s + seconds_since(t_merge);
    out.seconds = seconds_since(t0);
}

void truncate_block(DraftBlock & block, int n) {
    if (n >= block.tree.size()) return;
    const auto k = static_cast<size_t>(std::max(0, n));
    for (auto * v : {&block.tree.parent, &block.tree.depth, &block.tree.token, &block.tree.cand}) v->resize(k);
    block.tree.logp.resize(k);
    block.origin.resize(k);
    for (std::vector<double> & logp : block.source_logp) logp.resize(k);
    block.tokens.resize(k);
    block.is_tree = k > 0;
}

}  // namespace pdf2
