#include "engine/repeat_draft_source.h"

#include <cmath>
#include <utility>

namespace pdf2 {

namespace {
constexpr double DECAY = 0.99;
}  // namespace

void RepeatDraftSource::begin(const SourceStart & start) {
    stream_.assign(start.prompt->begin(), start.prompt->end());
    offered_ = ScoredNodes{};
}

int RepeatDraftSource::period() const {
    const auto n = static_cast<int>(stream_.size());
    for (int p = 1; p <= kMaxPeriod && 2 * p <= n; ++p) {
        bool repeats = true;
        for (int i = 1; i <= p && repeats; ++i) {
            repeats = stream_[static_cast<size_t>(n - i)] == stream_[static_cast<size_t>(n - i - p)];
        }
        if (repeats) return p;
    }
    return 0;
}

Offer RepeatDraftSource::offer(const OfferRequest & req) {
    offered_ = ScoredNodes{};
    Offer o;
    const int p = period();
    if (p == 0) return o;
    const double rate = accepted_ / reached_;
    const auto n = static_cast<int>(stream_.size());
    for (int d = 0; d < req.max_depth; ++d) {
        offered_.parent.push_back(d - 1);
        offered_.token.push_back(stream_[static_cast<size_t>(n - p + d % p)]);
        offered_.cand.push_back(-1);
        offered_.raw_logp.push_back((d + 1) * std::log(rate));
        offered_.p.push_back(std::pow(rate, d + 1));
    }
    if (offered_.size() > 0) o.nodes = &offered_;
    return o;
}

void RepeatDraftSource::accept(const Verified & v) {
    // the offer's tokens against the committed ones: each reached token was taken or not
    for (size_t d = 0; d < v.n_committed && d < offered_.token.size(); ++d) {
        reached_ = DECAY * reached_ + 1.0;
        const bool taken = offered_.token[d] == v.committed[d];
        accepted_ = DECAY * accepted_ + (taken ? 1.0 : 0.0);
        if (!taken) break;
    }
    offered_ = ScoredNodes{};
    stream_.insert(stream_.end(), v.committed, v.committed + v.n_committed);
}

}  // namespace pdf2
