// Drafts from the context as a draft source (issue 35): what followed earlier occurrences of the
// stream's current suffix in the request's prompt and output (context_index.h), and, with the
// global cache, in past outputs of the same API key. Model-free: its candidates are known before
// the step is planned, so the planner prices them against the drafter's (and may skip the
// drafter's propose), and merges both into one tree (merged_draft_tree.h).
//
// A continuation node's estimate: per token, the acceptance a(m) learned for a suffix match of m
// tokens (m grows by one with every token the path goes deeper), times the share of the
// occurrences that continue with the node's token; a path's is the product. a(m) learns from every
// step's committed tokens, for every candidate along them, verified or not (MatchAcceptance).
#pragma once

#include "engine/context_index.h"
#include "engine/draft_source.h"
#include "engine/merged_draft_tree.h"

#include <string>
#include <vector>

namespace pdf2 {

// The largest context (or merged) tree a step verifies, and its deepest path: context paths cost
// nothing to draft, so they may go deeper than the drafter's block.
inline constexpr int kContextTreeNodes = 32;
inline constexpr int kContextMaxDepth = 32;

// How often a context continuation is right, by the length of the match it came from: per match
// length m (capped), decayed counts of candidates the committed text reached (weighted by their
// share of the occurrences) and of those it took, from the prior m / (m + 1).
class MatchAcceptance {
  public:
    static constexpr int MAX_MATCH = 48;
    MatchAcceptance();
    double rate(int m) const;  // the conditional acceptance of a continuation with share 1
    void observe(int m, double share, bool accepted);

  private:
    std::vector<double> reached_, accepted_;
};

enum class ContextDrafts {
    Off = 0,
    Request = 1,  // this request's prompt and output
    Global = 2,   // ... and the engine's cache of past outputs under the request's key
};

class ContextDraftSource final : public DraftSource {
  public:
    // acceptance: what continuations by match length get, learned over all slots, per regime;
    // caches: the past outputs per key (ContextDrafts::Global)
    ContextDraftSource(ByRegime<MatchAcceptance> & acceptance, ContextCaches & caches)
        : by_regime_(acceptance), global_(caches) {}
    const char * name() const override { return "context"; }

    // A new request: its prompt starts the stream; in global mode it also drafts from the past
    // outputs of its key, and adds its output to them. The cache is looked up at each use: another
    // request may evict the key meanwhile.
    void begin(const SourceStart & start) override;
    // tokens the verify committed: the last candidates teach MatchAcceptance what they would have
    // got, then the tokens join the stream
    void accept(const Verified & v) override;
    void finish() override;  // the request ended: its output joins the global cache
    bool active() const { return active_; }

    // The candidates after the stream's last token, at most req.max_depth deep, calibrated
    // (recomputed only when the stream or the depth changed); none when nothing matches.
    Offer offer(const OfferRequest & req) override;

  private:
    void gather(int max_depth);

    void observe(const llama_token * tokens, size_t n);

    const ScoredNodes & candidates(int max_depth);

    ByRegime<MatchAcceptance> & by_regime_;
    MatchAcceptance * acceptance_ = &by_regime_.greedy;  // the request's regime's
    ContextCaches & global_;
    ContextIndex index_;
    ContextCaches * caches_ = nullptr;  // &global_ in global mode
    std::string key_;
    size_t n_prompt_ = 0;
    bool active_ = false;
    // the last candidates and what they were made for
    ScoredNodes scored_;
    size_t scored_size_ = static_cast<size_t>(-1);
    int scored_depth_ = -1;
    ContextPaths paths_, global_paths_;
};

}  // namespace pdf2
