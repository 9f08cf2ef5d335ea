// The cost model: the one owner of what a step costs (the measured StepCosts) and the one place
// that chooses among priced options: the draft length, the batch's common length, the tree budget,
// the known candidates alone or merged with a proposing source's block, a merged tree's prefix,
// and whether a plain step feeds the drafter. It prices what the sources offer (draft_source.h:
// a proposing source's acceptance curves, the known candidates' merged expectation) without
// knowing whose offers they are; the planner asks it and applies the answers, and the sources learn
// what verification accepted (their accept()).
#pragma once

#include "drafter/draft_tree.h"
#include "engine/draft_source.h"
#include "engine/probe_schedule.h"
#include "engine/step_price.h"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pdf2 {

class JsonWriter;

class CostModel {
  public:
    CostModel() = default;
    // max_draft: the drafter's block (0: none); tree_max_budget > 0: tree_budget = auto up to it
    CostModel(int max_draft, int tree_max_budget);

    // The measured costs (every price below is made with them). learn: they were measured on this
    // machine, and the steps as they run correct them (observe_device); else they stay as given.
    void set_costs(const StepCosts & costs, bool learn);
    const StepCosts & costs() const { return costs_; }
    // enough measured to price rows beyond the first (else the planner takes the options' defaults)
    bool priced() const { return costs_.has_row_cost(); }
    // a plain step skips the drafter's features where that is measurably cheaper
    bool unfed_plain() const { return costs_.starve_plain(); }
    int max_tree_budget() const { return tree_max_budget_; }

    // A step's host seconds (the ledger's host parts) that verified `rows` rows and prefilled
    // nothing; plain: it verified no drafts. The prices' host work follows them (decayed).
    void observe_host(bool plain, int rows, double seconds);
    // A step that was one target decode of `n_slots` slots verifying `rows` rows each, its lazy
    // head's products beyond one a slot (`extra_heads`), and its device seconds (the ledger's
    // decode, sync and lazy head); plain: no drafts. Where costs are learned, a one-slot plain
    // step's price becomes what plain steps took, and every other decode's the table (and head)
    // scaled by what the verify steps took against it (decayed).
    void observe_device(bool plain, int n_slots, int rows, int extra_heads, double seconds);

    // The choices, over the offers of proposing sources (their chain acceptance and tree curves).
    // Each returns every option it weighed, priced, and the one it chose (step_price.h's Decision):
    // the planner acts on the chosen option and the stats report the decision as it was made.
    // One slot's draft length, alone: plain or a chain of 1..the block (unmeasured: the whole block)
    Decision draft_length(const Offer & offer) const;
    // the drafts every decoding slot verifies: the best batch rate under the linear model of rows
    Decision batch_draft_length(const std::vector<const Offer *> & offers) const;
    // the probe schedule of chains: n, or a probe while plain decoding has lasted
    int schedule_chain(int n);
    bool chain_probing() const { return chain_probing_; }
    // tree_budget = auto: the chain of n_chain drafts (option 0) against trees of b = 1..max nodes
    // (option b) for the decoding slots; a tree is chosen for its price or as a probe
    Decision tree_budget(const std::vector<const Offer *> & offers, int n_chain, bool chain_probe);
    // Known candidates: e[b] = their expected accepted drafts in their best tree of b nodes (b =
    // 0..); `proposed` what the proposing sources expect of the block they would draft (n drafts,
    // `rows` verify rows with the anchor). Option 0: the candidates' tree alone (no propose), chosen
    // when it commits at least the merged tree's rate (option 1).
    Decision candidates_alone(const std::vector<double> & e, double proposed, int rows, int n) const;
    // a merged tree's first nodes to verify (the best prefix; all when unpriced)
    int tree_prefix(const DraftTree & t) const;

    // The model's state and the tree against the chain as the last step weighed it (stats' "tree_auto").
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
    int tree_max_budget_ = 0;
    ProbeSchedule chain_probes_, tree_probes_;  // one for the engine each, counted in steps
    bool chain_probing_ = false;
    Decision tree_decision_;  // the last step's tree against the chain
    std::vector<double> tree_curve_, chain_acceptance_;  // what the last weighing read (stats)
    int64_t n_tree_steps_ = 0, n_tree_probes_ = 0;
};

}  // namespace pdf2
