// A toy draft source, and the example of one that plugs in by this one file and one line of
// draft_sources.cpp's registry: the prompt again. Where the stream's last token occurs in the
// prompt, what followed it there comes next: a branch an occurrence (the latest first, at most
// kMaxBranches), each token at the acceptance it has learned (one in two before anything was seen),
// an older occurrence's branch at half the next one's. Its offer is those branches, known before
// drafting, so the cost model prices them and the merged tree takes them as it takes every
// source's; asked for a chain (tree_budget 0), it drafts the latest occurrence's continuation, and
// for tree nodes the best of its branches. Registered as "prompt-echo", added on request only.
//
// Worked example: prompt [5 6 7 5 8], stream ending in 5: branches [8] (the latest occurrence's
// continuation, cut at the prompt's end) and [6 7 5 8]; a chain of 3 drafts is [8].
#include "engine/draft_source.h"
#include "engine/merged_draft_tree.h"

#include <cmath>
#include <memory>

namespace pdf2 {

struct SourceKit;

namespace {

constexpr double DECAY = 0.99;
constexpr int kMaxBranches = 4;

class PromptEchoDraftSource final : public DraftSource {
  public:
    const char * name() const override { return "prompt-echo"; }

    void begin(const SourceStart & start) override {
        prompt_.assign(start.prompt->begin(), start.prompt->end());
        last_ = prompt_.empty() ? -1 : prompt_.back();
        offered_ = ScoredNodes{};
    }

    Offer offer(const OfferRequest & req) override {
        gather(req.max_depth, kMaxBranches);
        Offer o;
        if (offered_.size() > 0) o.nodes = &offered_;
        return o;
    }

    void draft(const DraftRequest & req, DraftBlock & out) override {
        if (req.tree_budget > 0) {
            DraftSource::draft(req, out);  // its offer's tree, as any source with known candidates
            return;
        }
        gather(req.n, 1);
        for (const llama_token t : offered_.token) {
            out.tokens.push_back(t);
            out.q.push_back(SparseDist{{t}, {1.0f}});  // picked, not drawn
        }
    }

    // Each branch offered learns how far the committed tokens followed it.
    void accept(const Verified & v) override {
        for (int root = 0; root < offered_.size(); ++root) {
            if (offered_.parent[static_cast<size_t>(root)] >= 0) continue;
            for (int node = root, d = 0; d < static_cast<int>(v.n_committed); ++node, ++d) {
                reached_ = DECAY * reached_ + 1.0;
                const bool taken = offered_.token[static_cast<size_t>(node)] == v.committed[d];
                accepted_ = DECAY * accepted_ + (taken ? 1.0 : 0.0);
                const bool goes_on = node + 1 < offered_.size() && offered_.parent[static_cast<size_t>(node) + 1] == node;
                if (!taken || !goes_on) break;
            }
        }
        if (v.n_committed > 0) last_ = v.committed[v.n_committed - 1];
        offered_ = ScoredNodes{};
    }

  private:
    // the branches after the stream's last token, at most max_depth deep
    void gather(int max_depth, int max_branches) {
        offered_ = ScoredNodes{};
        if (last_ < 0 || max_depth <= 0) return;
        const double log_rate = std::log(accepted_ / reached_);
        double log_share = 0.0;
        int branches = 0;
        for (int i = static_cast<int>(prompt_.size()) - 2; i >= 0 && branches < max_branches; --i) {
            if (prompt_[static_cast<size_t>(i)] != last_) continue;
            int32_t parent = -1;
            for (int d = 0; d < max_depth && i + 1 + d < static_cast<int>(prompt_.size()); ++d) {
                const double logp = log_share + (d + 1) * log_rate;
                offered_.parent.push_back(parent);
                offered_.token.push_back(prompt_[static_cast<size_t>(i + 1 + d)]);
                offered_.cand.push_back(-1);
                offered_.raw_logp.push_back(logp);
                offered_.p.push_back(std::exp(logp));
                parent = offered_.size() - 1;
            }
            branches += 1;
            log_share += std::log(0.5);
        }
    }

    std::vector<llama_token> prompt_;
    llama_token last_ = -1;  // the stream's last token
    ScoredNodes offered_;
    double reached_ = 2.0, accepted_ = 1.0;  // decayed counts, from the prior of one in two
};

}  // namespace

std::unique_ptr<DraftSource> make_prompt_echo(SourceKit &) { return std::make_unique<PromptEchoDraftSource>(); }

}  // namespace pdf2
