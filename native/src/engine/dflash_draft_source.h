// The DFlash drafter as a draft source: one forward of the drafter proposes a block (DFlash2: a
// k-by-k lattice of candidates; DFlash1: logits), then the path selector picks the chain, or the
// best-first tree over the lattice (draft_tree.h) is the step's candidates. Its candidates come
// only with the propose, so it offers what it expects instead: its chain's acceptance per block
// position (this slot's, learned from the chains and trees verified) and its trees' expected
// acceptance by budget (the engine's); once drafted, it offers the block's nodes, calibrated.
#pragma once

#include "drafter/drafter.h"
#include "engine/draft_length.h"
#include "engine/draft_source.h"
#include "engine/path_calibration.h"
#include "engine/tree_budget.h"

#include <optional>
#include <vector>

namespace pdf2 {

// Target features committed but not yet injected into the drafter's cache: the next proposal's
// graph injects them first (Drafter::inject_and_propose).
struct DrafterFeed {
    std::vector<float> features;  // [rows][width]
    std::vector<int32_t> positions;

    void clear() {
        features.clear();
        positions.clear();
    }
};

struct DFlashSourceOptions {
    std::optional<SelectorMode> selector;// none: sample when the target samples, else greedy
    int q_top_k = 16;              // DFlash1: support of the draft distribution when sampling
    int feature_width = 0;
    int max_draft = 0;             // the engine's block: only full blocks teach the tree budget
};

// What the lattice learns across the engine's slots (per regime: draft_source.h's ByRegime).
struct LatticeKit {
    explicit LatticeKit(int max_draft = 0, int tree_max_budget = 0) : shared(max_draft), trees(tree_max_budget) {}
    DraftLengthPolicy shared;     // its chains' acceptance over all requests (a new request starts from it)
    TreeBudgetPolicy trees;       // tree_budget = auto: what every budget verifies, from every full lattice
    PathCalibration calibration;  // its tree estimates against what verification accepted (merged trees)
};

class DFlashDraftSource final : public DraftSource {
  public:
    DFlashDraftSource(Drafter & drafter, DrafterFeed & feed, ByRegime<LatticeKit> & kits, const llama_vocab * vocab,
                      const DFlashSourceOptions & opts)
        : drafter_(drafter), feed_(feed), kits_(kits), vocab_(vocab), opts_(opts), chain_(opts.max_draft) {}
    const char * name() const override { return "lattice"; }

    // a new request starts from the acceptance seen over all requests, not from the optimistic
    // prior (short requests would end before it settled)
    void begin(const SourceStart & start) override;
    Offer offer(const OfferRequest & req) override;
    // req.merge: the block is also kept as candidates for the merged tree (its next offer's nodes)
    void draft(const DraftRequest & req, DraftBlock & out) override;
    // Its chains and trees teach its acceptance estimates what the target accepted: a chain of n
    // drafts with k accepted, a tree its accepted path (and the chain it holds: what the chain
    // would have done), every tree's nodes the calibration.
    void accept(const Verified & v) override;

  private:
    void draft_tree(const Lattice & lattice, int tree_budget, DraftBlock & out);
    void select_chain(const DraftRequest & req, DraftBlock & out);
    void constrain(TargetSampler & sampler, DraftBlock & out) const;  // greedy drafts the grammar allows
    // the block as candidates: a tree's nodes calibrated, a chain's (DFlash1) each at its position's
    // running acceptance
    void score(const DraftBlock & block);
    void observe_chain(int n_drafted, int n_accepted);
    void observe_tree(const DraftBlock & b, const std::vector<char> & node_accepted);

    Drafter & drafter_;
    DrafterFeed & feed_;
    ByRegime<LatticeKit> & kits_;
    LatticeKit * kit_ = &kits_.greedy;  // the request's regime's
    const llama_vocab * vocab_;
    DFlashSourceOptions opts_;
    DraftLengthPolicy chain_;  // this slot's chain acceptance per block position
    ScoredNodes drafted_;      // this step's block as candidates (after a draft for a merged tree)
    bool has_drafted_ = false;
};

}  // namespace pdf2
