#include "engine/merged_draft_source.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

namespace pdf2 {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

void MergedDraftSource::set_sources(DFlashDraftSource * lattice, std::vector<DraftSource *> candidates) {
    lattice_ = lattice;
    candidates_ = std::move(candidates);
}

std::vector<const ScoredNodes *> MergedDraftSource::offers(int max_depth) {
    std::vector<const ScoredNodes *> out(1, nullptr);  // index 0: the lattice's, once drafted
    for (DraftSource * c : candidates_) {
        out.resize(std::max(out.size(), static_cast<size_t>(c->index()) + 1), nullptr);
        out[static_cast<size_t>(c->index())] = c->offer(max_depth);
    }
    return out;
}

std::vector<double> MergedDraftSource::expected_accepted(int max_depth, int max_nodes, int max_leaves) {
    std::vector<double> out(1, 0.0);
    const std::vector<const ScoredNodes *> o = offers(max_depth);
    if (std::all_of(o.begin(), o.end(), [](const ScoredNodes * s) { return s == nullptr; })) return out;
    const MergedTree m = merge_draft_trees(o, max_nodes, max_leaves);
    for (const double lp : m.tree.logp) out.push_back(out.back() + std::exp(lp));
    return out;
}

void MergedDraftSource::draft(const DraftRequest & req, DraftBlock & out) {
    const auto t0 = Clock::now();
    ScoredNodes lattice;
    if (req.n > 0 && lattice_ != nullptr) {
        DraftRequest lattice_req = req;
        lattice_req.depth = 0;
        lattice_->draft(lattice_req, out);
        lattice = lattice_->scored(out, req.chain_acceptance != nullptr ? *req.chain_acceptance : std::vector<double>{});
    }
    const auto t_merge = Clock::now();
    std::vector<const ScoredNodes *> o = offers(req.depth);
    o[0] = req.n > 0 ? &lattice : nullptr;
    MergedTree m = merge_draft_trees(o, req.tree_budget, req.max_leaves);
    // the drafter's timings stay; merging is selection
    const double propose_s = out.propose_s, graph_setup_s = out.graph_setup_s, select_s = out.select_s;
    const int64_t n_graph_builds = out.n_graph_builds;
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
