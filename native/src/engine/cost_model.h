// The cost model: the one owner of what a step costs (the measured StepCosts) and of what each
// option is expected to commit (each slot's and the engine's draft-length policy, the automatic
// tree budget's policy, the lattice's calibration), and the one place that chooses among priced
// options: the draft length, the batch's common length, the tree budget, context drafts alone or
// merged, a merged tree's prefix, and whether a plain step feeds the drafter. The planner asks it
// and applies the answers; the commits tell it what verification accepted.
#pragma once

#include "drafter/draft_tree.h"
#include "engine/draft_length.h"
#include "engine/path_calibration.h"
#include "engine/step_price.h"
#include "engine/tree_budget.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pdf2 {

class JsonWriter;

class CostModel {
  public:
    CostModel() = default;
    // max_draft: the drafter's block (0: none); tree_max_budget > 0: tree_budget = auto up to it
    CostModel(int n_slots, int max_draft, int tree_max_budget);

    // The measured costs (every price below is made with them). learn: they were measured on this
    // machine, and the steps as they run correct them (observe_device); else they stay as given.
    void set_costs(const StepCosts & costs, bool learn);
    const StepCosts & costs() const { return costs_; }
    // enough measured to price rows beyond the first (else the planner takes the options' defaults)
    bool priced() const { return costs_.has_row_cost(); }
    // a plain step skips the drafter's features where that is measurably cheaper
    bool unfed_plain() const { return costs_.starve_plain(); }

    // A new request on `slot` starts from the acceptance seen over all requests, not from the
    // optimistic prior (short requests would end before it settled).
    void start_request(int slot);
    const DraftLengthPolicy & policy(int slot) const { return slot_policies_[static_cast<size_t>(slot)]; }
    int max_tree_budget() const { return tree_.max_budget(); }
    // what the lattice's draft source learns its trees and calibration into (it drafts them)
    TreeBudgetPolicy & tree_policy() { return tree_; }
    PathCalibration & lattice_calibration() { return lattice_calibration_; }

    // What verification accepted: a chain of n drafts with the first k accepted ...
    void observe_chain(int slot, int n_drafted, int n_accepted);
    // ... or a lattice tree (not a merged one): `path` its accepted nodes, of which the first
    // n_in_place are its first-child chain of `chain` nodes (what the chain would have verified).
    void observe_lattice_tree(int slot, const DraftTree & t, const std::vector<int32_t> & path, int chain,
                              int n_in_place);

    // A step's host seconds (the ledger's host parts) that verified `rows` rows and prefilled
    // nothing; plain: it verified no drafts. The prices' host work follows them (decayed).
    void observe_host(bool plain, int rows, double seconds);
    // A step that was one target decode of `n_slots` slots verifying `rows` rows each, its lazy
    // head's products beyond one a slot (`extra_heads`), and its device seconds (the ledger's
    // decode, sync and lazy head); plain: no drafts. Where costs are learned, a one-slot plain
    // step's price becomes what plain steps took, and every other decode's the table (and head)
    // scaled by what the verify steps took against it (decayed).
    void observe_device(bool plain, int n_slots, int rows, int extra_heads, double seconds);

    // The choices.
    int draft_length(int slot) const { return policy(slot).best(costs_); }  // one slot's, alone
    // the drafts every decoding slot verifies: the best batch rate under the linear model of rows
    int batch_draft_length(const std::vector<size_t> & slots) const;
    // the probe schedule of chains: n, or a probe while plain decoding has lasted
    int schedule_chain(int n) { return shared_.schedule(n, costs_); }
    bool chain_probing() const { return shared_.probing(); }
    // tree_budget = auto: this step's budget for the decoding slots (0: the chain's n_chain drafts)
    int tree_budget(const std::vector<size_t> & slots, int n_chain, bool chain_probe);
    // what the lattice is expected to get accepted in a step of n_drafts drafts (a tree of tree_budget nodes)
    double lattice_expected(int slot, int tree_budget, int n_drafts) const;
    // Context drafts: e[b] = the candidate sources' expected accepted drafts in their best tree of b
    // nodes (b = 0..). True: their tree alone (no propose) commits at least the merged tree's rate.
    bool context_alone(const std::vector<double> & e, double lattice_expected, int lattice_rows, int n_drafts) const;
    // a merged tree's first nodes to verify (the best prefix; all when unpriced)
    int tree_prefix(const DraftTree & t) const;

    // The model's state and the choice one slot would make now (stats' "tree_auto").
    void write_json(JsonWriter & w) const;

  private:
    // decayed least squares of host seconds against rows
    struct HostFit {
        double w = 0.0, x = 0.0, y = 0.0, xx = 0.0, xy = 0.0;
        void add(double rows, double seconds);
        double per_row() const { return xx > 0.0 ? xy / xx : 0.0; }  // through the origin
        void line(double & base, double & per_row) const;             // both >= 0
    };

    // decayed sums of what steps took and what the table said they would
    struct SeenSum {
        double w = 0.0, seen = 0.0, table = 0.0;
        void add(double seen_s, double table_s);
    };

    StepCosts costs_;
    bool learn_device_ = false;
    HostFit plain_host_, draft_host_;
    SeenSum plain_seen_, verify_seen_;
    int max_draft_ = 0;
    std::vector<DraftLengthPolicy> slot_policies_;
    DraftLengthPolicy shared_{0};  // over all requests
    TreeBudgetPolicy tree_{0};     // tree_budget = auto: one for the engine, as shared_
    PathCalibration lattice_calibration_;  // the lattice's estimates against what verification accepted
    int64_t n_tree_steps_ = 0, n_tree_probes_ = 0;
};

}  // namespace pdf2
