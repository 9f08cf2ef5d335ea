#include "engine/context_draft_source.h"

#include <cmath>
#include <map>
#include <utility>

namespace pdf2 {

namespace {

constexpr double DECAY = 0.995;     // acceptance drifts with the text, slower than per step
constexpr double PRIOR_WEIGHT = 2.0; // the prior counts as two candidates reached

// Before anything was seen: a one-token match is weak evidence, a long one strong.
double match_prior(int m) { return static_cast<double>(m) / static_cast<double>(m + 1); }

int match_bucket(int m) { return std::clamp(m, 1, MatchAcceptance::MAX_MATCH); }

// b's nodes added to a (same match length: the occurrences of both count), shared paths merged.
void add_paths(ContextPaths & a, const ContextPaths & b) {
    std::map<std::pair<int32_t, llama_token>, int32_t> index;
    for (int v = 0; v < a.size(); ++v) index[{a.parent[static_cast<size_t>(v)], a.token[static_cast<size_t>(v)]}] = v;
    std::vector<int32_t> at(static_cast<size_t>(b.size()), -1);
    for (int v = 0; v < b.size(); ++v) {
        const auto i = static_cast<size_t>(v);
        const int32_t parent = b.parent[i] < 0 ? -1 : at[static_cast<size_t>(b.parent[i])];
        const auto key = std::make_pair(parent, b.token[i]);
        auto it = index.find(key);
        if (it == index.end()) {
            it = index.emplace(key, a.size()).first;
            a.parent.push_back(parent);
            a.depth.push_back(b.depth[i]);
            a.token.push_back(b.token[i]);
            a.count.push_back(0);
        }
        a.count[static_cast<size_t>(it->second)] += b.count[i];
        at[i] = it->second;
    }
    a.n_occurrences += b.n_occurrences;
}

}  // namespace

MatchAcceptance::MatchAcceptance() : reached_(MAX_MATCH + 1, 0.0), accepted_(MAX_MATCH + 1, 0.0) {}

double MatchAcceptance::rate(int m) const {
    const auto b = static_cast<size_t>(match_bucket(m));
    return (accepted_[b] + PRIOR_WEIGHT * match_prior(match_bucket(m))) / (reached_[b] + PRIOR_WEIGHT);
}

void MatchAcceptance::observe(int m, double share, bool accepted) {
    const auto b = static_cast<size_t>(match_bucket(m));
    reached_[b] = DECAY * reached_[b] + share;
    accepted_[b] = DECAY * accepted_[b] + (accepted ? 1.0 : 0.0);
}

void ContextDraftSource::begin(const SourceStart & start) {
    if (static_cast<ContextDrafts>(start.context_mode) == ContextDrafts::Off) {
        finish();
        return;
    }
    acceptance_ = &by_regime_.of(start.sampled);
    index_.clear();
    index_.append(start.prompt->data(), start.prompt->size());
    n_prompt_ = start.prompt->size();
    caches_ = static_cast<ContextDrafts>(start.context_mode) == ContextDrafts::Global ? &global_ : nullptr;
    key_ = start.key != nullptr ? *start.key : std::string();
    active_ = true;
    scored_size_ = static_cast<size_t>(-1);
}

void ContextDraftSource::accept(const Verified & v) {
    if (!active_) return;
    observe(v.committed, v.n_committed);
    index_.append(v.committed, v.n_committed);
}

// The committed tokens are the target's own choices, so every candidate along them tells what its
// verify would have got, whether the step verified it or not: the children of each node the
// committed text reached, down to where it left the candidates.
void ContextDraftSource::observe(const llama_token * tokens, size_t n) {
    if (scored_size_ != index_.size() || paths_.size() == 0) return;  // no candidates for this position
    int32_t at = -1;  // the node the committed text reached (-1: the root)
    for (size_t d = 0; d < n; ++d) {
        int32_t next = -1;
        const int32_t parent_count = at < 0 ? paths_.n_occurrences : paths_.count[static_cast<size_t>(at)];
        for (int v = 0; v < paths_.size(); ++v) {
            const auto i = static_cast<size_t>(v);
            if (paths_.parent[i] != at) continue;
            const bool taken = paths_.token[i] == tokens[d];
            acceptance_->observe(paths_.match_length + paths_.depth[i] - 1,
                                static_cast<double>(paths_.count[i]) / std::max(1, parent_count), taken);
            if (taken) next = v;
        }
        if (next < 0) return;
        at = next;
    }
}

void ContextDraftSource::finish() {
    if (active_ && caches_ != nullptr && index_.size() > n_prompt_) {
        caches_->for_key(key_).add(index_.tokens().data() + n_prompt_, index_.size() - n_prompt_);
    }
    active_ = false;
    caches_ = nullptr;
}

void ContextDraftSource::gather(int max_depth) {
    index_.propose(max_depth, paths_);
    const ContextCache * global = caches_ != nullptr ? caches_->find(key_) : nullptr;
    if (global != nullptr) {
        global->propose(index_.tokens().data(), index_.size(), max_depth, global_paths_);
        // the longer match knows more; an equal one adds its occurrences
        if (global_paths_.match_length > paths_.match_length) {
            std::swap(paths_, global_paths_);
        } else if (global_paths_.match_length == paths_.match_length && paths_.match_length > 0) {
            add_paths(paths_, global_paths_);
        }
    }
    scored_.clear_and_reserve(static_cast<size_t>(paths_.size()));
    for (int v = 0; v < paths_.size(); ++v) {
        const auto i = static_cast<size_t>(v);
        const int32_t parent = paths_.parent[i];
        const double parent_logp = parent < 0 ? 0.0 : scored_.raw_logp[static_cast<size_t>(parent)];
        const int32_t parent_count = parent < 0 ? paths_.n_occurrences : paths_.count[static_cast<size_t>(parent)];
        const double share = static_cast<double>(paths_.count[i]) / static_cast<double>(std::max(1, parent_count));
        const double logp = parent_logp + std::log(acceptance_->rate(paths_.match_length + paths_.depth[i] - 1) * share);
        scored_.parent.push_back(parent);
        scored_.token.push_back(paths_.token[i]);
        scored_.cand.push_back(-1);
        scored_.raw_logp.push_back(logp);
        scored_.p.push_back(std::min(1.0, std::exp(logp)));
    }
}

const ScoredNodes & ContextDraftSource::candidates(int max_depth) {
    if (index_.size() != scored_size_ || max_depth != scored_depth_) {
        gather(max_depth);
        scored_size_ = index_.size();
        scored_depth_ = max_depth;
    }
    return scored_;
}

Offer ContextDraftSource::offer(const OfferRequest & req) {
    Offer o;
    if (!active_ || req.max_depth <= 0) return o;
    const ScoredNodes & c = candidates(req.max_depth);
    if (c.size() > 0) o.nodes = &c;
    return o;
}

}  // namespace pdf2
