// The last tokens again: where the committed text ends in a repeated run (a period p of at most
// kMaxPeriod tokens, seen twice in a row), the next tokens continue it. A model-free source of a
// few dozen lines, and the example of a draft source that plugs in by its own file and one line of
// draft_sources.cpp: the merged tree takes its offer beside the lattice's and the context's.
#pragma once

#include "engine/draft_source.h"
#include "engine/merged_draft_tree.h"

#include <vector>

namespace pdf2 {

class RepeatDraftSource final : public DraftSource {
  public:
    static constexpr int kMaxPeriod = 8;

    const char * name() const override { return "repeat"; }
    void begin(const SourceStart & start) override;
    // the run continued, one chain, each token at the learned acceptance of a repeat
    Offer offer(const OfferRequest & req) override;
    // the committed tokens join the stream; the last offer learns how far they followed it
    void accept(const Verified & v) override;

  private:
    int period() const;  // the shortest period of the stream's end, 0: none

    std::vector<llama_token> stream_;
    ScoredNodes offered_;
    double reached_ = 2.0, accepted_ = 1.0;  // decayed counts, from the prior of one in two
};

}  // namespace pdf2
