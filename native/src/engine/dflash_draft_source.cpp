#include "engine/dflash_draft_source.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace pdf2 {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace

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
    if (req.tree_budget > 0 && lattice.n_pos > 0) {
        draft_tree(lattice, req.tree_budget, out);  // the target's verify follows its own choice down it
    } else {
        if (tree_policy_.max_budget() > 0 && lattice.n_pos == opts_.max_draft) {
            tree_policy_.observe_tree(build_draft_tree(lattice, tree_policy_.max_budget()));
        }
        select_chain(req, out);
    }
    out.select_s = seconds_since(t_select);
    out.seconds = seconds_since(t0);
}

void DFlashDraftSource::begin(const SourceStart & start) {
    (void)start;
    reset_request_stats();
}

void DFlashDraftSource::accept(const Verified & v) {
    DraftSource::accept(v);
    if (v.block == nullptr || !v.block->is_tree) return;
    const std::vector<int32_t> nodes = own_nodes(*v.block);
    std::vector<double> logp;
    std::vector<char> hit;
    logp.reserve(nodes.size());
    hit.reserve(nodes.size());
    for (const int32_t node : nodes) {
        logp.push_back(node_logp(*v.block, node));
        hit.push_back((*v.node_accepted)[static_cast<size_t>(node)]);
    }
    if (!logp.empty()) calibration_.observe(logp, hit);
}

ScoredNodes DFlashDraftSource::scored(const DraftBlock & block, const std::vector<double> & chain_acceptance) const {
    if (block.is_tree) return scored_nodes(block.tree, [&](double logp) { return calibration_.calibrated(logp); });
    ScoredNodes out;
    double logp = 0.0;
    for (size_t j = 0; j < block.tokens.size(); ++j) {
        logp += std::log(std::max(1e-9, j < chain_acceptance.size() ? chain_acceptance[j] : 0.5));
        out.parent.push_back(static_cast<int32_t>(j) - 1);
        out.token.push_back(block.tokens[j]);
        out.cand.push_back(-1);
        out.raw_logp.push_back(logp);
        out.p.push_back(std::exp(logp));
    }
    return out;
}

void DFlashDraftSource::draft_tree(const Lattice & lattice, int tree_budget, DraftBlock & out) {
    DraftTree & tree = out.tree;
    tree = build_draft_tree(lattice, std::max(tree_budget, tree_policy_.max_budget()));
    if (tree_policy_.max_budget() > 0 && lattice.n_pos == opts_.max_draft) {
        tree_policy_.observe_tree(tree);  // what every budget would verify (a smaller one: a prefix)
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
