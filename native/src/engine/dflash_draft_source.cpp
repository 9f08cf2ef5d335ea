#include "engine/dflash_draft_source.h"

#include "common/clock.h"

#include <algorithm>
#include <cmath>

namespace pdf2 {

void DFlashDraftSource::draft(const DraftRequest & req, DraftBlock & out) {
    const auto t0 = Clock::now();
    const double setup0 = drafter_.graph_setup_seconds();
    const uint64_t builds0 = drafter_.n_graph_builds();
    // the rows committed since the last block are injected by the same graph that proposes
    drafter_.inject_and_propose(feed_.features.data(), static_cast<size_t>(opts_.feature_width),
                                feed_.positions.data(), static_cast<int>(feed_.positions.size()), req.anchor, req.pos,
                                req.n + 1);
    feed_.clear();
    out.graph_setup_s = drafter_.graph_setup_seconds() - setup0;
    out.n_graph_builds = static_cast<int64_t>(drafter_.n_graph_builds() - builds0);
    const auto t_select = Clock::now();
    out.propose_s = std::chrono::duration<double>(t_select - t0).count() - out.graph_setup_s;
    const Lattice & lattice = drafter_.last().lattice;
    TreeBudgetPolicy & trees = kit_->trees;
    if (req.tree_budget > 0 && lattice.n_pos > 0) {
        draft_tree(lattice, req.tree_budget, out);  // the target's verify follows its own choice down it
    } else {
        if (trees.max_budget() > 0 && lattice.n_pos == opts_.max_draft) {
            trees.observe_tree(build_draft_tree(lattice, trees.max_budget()));
        }
        select_chain(req, out);
    }
    if (req.merge != 0) score(out);
    out.select_s = seconds_since(t_select);
    out.seconds = seconds_since(t0);
}

void DFlashDraftSource::begin(const SourceStart & start) {
    kit_ = &kits_.of(start.sampled);
    chain_ = kit_->shared;
    has_drafted_ = false;
}

Offer DFlashDraftSource::offer(const OfferRequest & req) {
    (void)req;
    Offer o;
    o.chain_acceptance = chain_.acceptance();
    if (kit_->trees.has_trees()) o.tree_accepted = kit_->trees.expected_curve();
    if (has_drafted_) o.nodes = &drafted_;
    return o;
}

void DFlashDraftSource::accept(const Verified & v) {
    has_drafted_ = false;
    if (v.block == nullptr || v.block->tokens.empty()) return;
    const DraftBlock & b = *v.block;
    if (!b.is_tree) {  // a chain is its own (merged blocks are trees)
        if (b.source == index()) observe_chain(static_cast<int>(b.tokens.size()), static_cast<int>(v.n_committed) - 1);
        return;
    }
    if (!b.is_merged() && b.source == index()) observe_tree(b, *v.node_accepted);
    // every tree's nodes of its (a merged tree's too) teach the calibration
    const std::vector<int32_t> nodes = own_nodes(b);
    std::vector<double> logp;
    std::vector<char> hit;
    logp.reserve(nodes.size());
    hit.reserve(nodes.size());
    for (const int32_t node : nodes) {
        logp.push_back(node_logp(b, node));
        hit.push_back((*v.node_accepted)[static_cast<size_t>(node)]);
    }
    if (!logp.empty()) kit_->calibration.observe(logp, hit);
}

void DFlashDraftSource::observe_chain(int n_drafted, int n_accepted) {
    chain_.observe(n_drafted, n_accepted);
    kit_->shared.observe(n_drafted, n_accepted);
}

// A verified tree of its own: the accepted path teaches the tree budget; the chain's estimate
// learns what the chain would have done: the tree's first-child chain (the greedy selector's
// path), of which the path kept its first n_in_place nodes.
void DFlashDraftSource::observe_tree(const DraftBlock & b, const std::vector<char> & node_accepted) {
    const DraftTree & t = b.tree;
    const int n = t.size();
    std::vector<int32_t> path;  // accepted nodes, root first (one a depth)
    for (int node = 0; node < n; ++node) {
        if (node_accepted[static_cast<size_t>(node)]) path.push_back(node);
    }
    std::sort(path.begin(), path.end(), [&](int32_t x, int32_t y) {
        return t.depth[static_cast<size_t>(x)] < t.depth[static_cast<size_t>(y)];
    });
    if (kit_->trees.max_budget() == 0) {
        observe_chain(*std::max_element(t.depth.begin(), t.depth.end()), static_cast<int>(path.size()));
        return;
    }
    std::vector<int32_t> first_child(static_cast<size_t>(n), -1);
    for (int v = n - 1; v >= 0; --v) {  // children come after their parent: the lowest index wins
        const int32_t p = t.parent[static_cast<size_t>(v)];
        if (p >= 0) first_child[static_cast<size_t>(p)] = v;
    }
    int chain = 0, n_in_place = 0;
    for (int32_t v = n > 0 ? 0 : -1; v >= 0; v = first_child[static_cast<size_t>(v)]) {
        if (n_in_place == chain && n_in_place < static_cast<int>(path.size()) && path[static_cast<size_t>(n_in_place)] == v) {
            ++n_in_place;
        }
        ++chain;
    }
    observe_chain(chain, n_in_place);
    kit_->trees.observe_verify(t, path);
}

void DFlashDraftSource::score(const DraftBlock & block) {
    has_drafted_ = true;
    const PathCalibration & calibration = kit_->calibration;
    if (block.is_tree) {
        drafted_ = scored_nodes(block.tree, [&](double logp) { return calibration.calibrated(logp); });
        return;
    }
    const std::vector<double> acceptance = chain_.acceptance();
    drafted_.clear_and_reserve(block.tokens.size());
    double logp = 0.0;
    for (size_t j = 0; j < block.tokens.size(); ++j) {
        logp += std::log(std::max(1e-9, j < acceptance.size() ? acceptance[j] : 0.5));
        drafted_.parent.push_back(static_cast<int32_t>(j) - 1);
        drafted_.token.push_back(block.tokens[j]);
        drafted_.cand.push_back(-1);
        drafted_.raw_logp.push_back(logp);
        drafted_.p.push_back(std::exp(logp));
    }
}

void DFlashDraftSource::draft_tree(const Lattice & lattice, int tree_budget, DraftBlock & out) {
    DraftTree & tree = out.tree;
    TreeBudgetPolicy & trees = kit_->trees;
    tree = build_draft_tree(lattice, std::max(tree_budget, trees.max_budget()));
    if (trees.max_budget() > 0 && lattice.n_pos == opts_.max_draft) {
        trees.observe_tree(tree);  // what every budget would verify (a smaller one: a prefix)
    }
    if (tree.size() > tree_budget) {
        for (auto * v : {&tree.parent, &tree.depth, &tree.token, &tree.cand}) v->resize(tree_budget);
        tree.logp.resize(static_cast<size_t>(tree_budget));
    }
    out.tokens.assign(tree.token.begin(), tree.token.end());
    out.is_tree = !out.tokens.empty();
}

void DFlashDraftSource::select_chain(const DraftRequest & req, DraftBlock & out) {
    TargetSampler & sampler = *req.sampler;
    const bool greedy = sampler.params().greedy();
    SelectorMode mode = opts_.selector.value_or(greedy ? SelectorMode::Greedy : SelectorMode::Sample);
    if (greedy && mode == SelectorMode::Sample) {
        mode = SelectorMode::Greedy;  // a greedy target accepts only its argmax: sampled drafts would be wasted
    }
    const float temperature = mode == SelectorMode::Sample ? sampler.params().temperature : 0.0f;
    const DraftPath path = drafter_.select_path(mode, temperature, sampler.rng()(), opts_.q_top_k);
    out.tokens.assign(path.tokens.begin(), path.tokens.end());
    if (mode == SelectorMode::Greedy && greedy) {
        constrain(sampler, out);
    }
    out.q.resize(out.tokens.size());
    for (size_t j = 0; j < out.tokens.size(); ++j) {
        for (int c = 0; c < path.k; ++c) {
            const size_t at = j * static_cast<size_t>(path.k) + static_cast<size_t>(c);
            if (path.q[at] > 0.0f) {
                out.q[j].ids.push_back(path.q_ids[at]);
                out.q[j].probs.push_back(path.q[at]);
            }
        }
    }
}

// With a grammar, the greedy selector over a DFlash2 lattice takes at each position the best
// candidate the grammar allows after the drafts before it (a copy of the slot's grammar
// follows the path), so that constrained output keeps its acceptance; the block ends where
// no candidate is allowed. The target's verification decides as always: this only changes
// which drafts it sees.
void DFlashDraftSource::constrain(TargetSampler & sampler, DraftBlock & out) const {
    const Lattice & lat = drafter_.last().lattice;
    SamplerPtr grammar = sampler.grammar_copy();
    if (!grammar || lat.n_pos <= 0) {
        return;
    }
    const int n = std::min<int>(lat.n_pos, static_cast<int>(out.tokens.size()));
    const int32_t n_vocab = llama_vocab_n_tokens(vocab_);
    std::vector<int> order(static_cast<size_t>(lat.k));
    int prev = 0;  // position 0: every predecessor row is the anchor's
    out.tokens.clear();
    for (int i = 0; i < n; ++i) {
        const float * row = lat.row(i, prev);
        for (int c = 0; c < lat.k; ++c) order[static_cast<size_t>(c)] = c;
        std::stable_sort(order.begin(), order.end(), [row](int a, int b) { return row[a] > row[b]; });
        int pick = -1;
        for (const int c : order) {
            const llama_token t = lat.cand[static_cast<size_t>(i) * lat.k + static_cast<size_t>(c)];
            if (t >= 0 && t < n_vocab && grammar_allows(grammar.get(), t)) {
                pick = c;
                break;
            }
        }
        if (pick < 0) {
            break;
        }
        const llama_token t = lat.cand[static_cast<size_t>(i) * lat.k + static_cast<size_t>(pick)];
        if (llama_vocab_is_eog(vocab_, t)) {
            out.tokens.push_back(t);  // nothing follows an end of generation
            break;
        }
        llama_sampler_accept(grammar.get(), t);
        out.tokens.push_back(t);
        prev = pick;
    }
}

}  // namespace pdf2
