// The DFlash drafter as a draft source: one forward of the drafter proposes a block (DFlash2: a
// k-by-k lattice of candidates; DFlash1: logits), then the path selector picks the chain, or the
// best-first tree over the lattice (draft_tree.h) is the step's candidates.
#pragma once

#include "drafter/drafter.h"
#include "engine/draft_source.h"
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

class DFlashDraftSource final : public DraftSource {
  public:
    // tree_policy: the engine's automatic tree budget, which learns from every full lattice;
    // calibration: its selector estimates against what the target accepted (merged trees price by it)
    DFlashDraftSource(Drafter & drafter, DrafterFeed & feed, TreeBudgetPolicy & tree_policy,
                      PathCalibration & calibration, const llama_vocab * vocab, const DFlashSourceOptions & opts)
        : drafter_(drafter), feed_(feed), tree_policy_(tree_policy), calibration_(calibration), vocab_(vocab),
          opts_(opts) {}
    const char * name() const override { return "lattice"; }

    void begin(const SourceStart & start) override;
    void draft(const DraftRequest & req, DraftBlock & out) override;
    // its tree nodes teach the calibration which estimates the target accepted
    void accept(const Verified & v) override;
    // The block just drafted as candidates for a merged tree: a tree's nodes calibrated, a chain's
    // (DFlash1) each at the running acceptance estimate of its position (chain_acceptance).
    ScoredNodes scored(const DraftBlock & block, const std::vector<double> & chain_acceptance) const;

  private:
    void draft_tree(const Lattice & lattice, int tree_budget, DraftBlock & out);
    void select_chain(const DraftRequest & req, DraftBlock & out);
    void constrain(TargetSampler & sampler, DraftBlock & out) const;  // greedy drafts the grammar allows

    Drafter & drafter_;
    DrafterFeed & feed_;
    TreeBudgetPolicy & tree_policy_;
    PathCalibration & calibration_;
    const llama_vocab * vocab_;
    DFlashSourceOptions opts_;
};

}  // namespace pdf2
