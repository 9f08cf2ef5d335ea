// The engine's side of the cost model (cost_model.h): the costs it is given, and measuring them.
#include "engine/batch_engine.h"

#include "common/clock.h"
#include "common/errors.h"

#include <algorithm>

namespace pdf2 {

void BatchEngine::set_costs(const std::vector<double> & verify_s, const std::vector<double> & draft_s,
                            double plain_s, double head_s, bool learn) {
    StepCosts costs;
    costs.verify_s = verify_s;
    costs.draft_s = draft_s;
    costs.plain_s = feed_drafters_ ? plain_s : 0.0;  // without a drafter every step is already so
    costs.head_s = head_s;
    cost_model_.set_costs(costs, learn);
}

void BatchEngine::measure_costs(int slot, int reps, std::vector<double> & verify_s, std::vector<double> & draft_s,
                                double & plain_s, double & head_s) {
    Slot & s = slot_at(slot);
    if (s.state != State::Decode || (s.drafting.drafter == nullptr && max_draft_ > 0)) {
        throw Error("measure_costs() needs a slot that has finished its prefill (and its drafter)");
    }
    reps = std::max(1, reps);
    const int max_b = max_verify_rows();
    if (s.seq.pos + max_b > opts_.n_ctx_slot) {
        throw Error("context too small to measure costs");
    }
    flush_rows(s);
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    const BatchStats saved = stats_.save();  // measuring is no request's work
    // the head one row at a time: head_s is one more row's product, and where the steps then run
    // it in groups (TargetRunner::head_rows) they cost less than priced, never more
    struct HeadRowsBack {
        TargetRunner & target;
        int32_t rows;
        ~HeadRowsBack() { target.set_head_rows(rows); }  // (in range: it was set before)
    } head_rows_back{target_, target_.forced_head_rows()};
    target_.set_head_rows(1);
    std::vector<std::vector<double>> vt(static_cast<size_t>(max_b)), dt(static_cast<size_t>(max_draft_));
    std::vector<double> pt, ht;
    // One way of timing for every price: a size's decode is timed as the second of two in a row of
    // that size, the way consecutive steps of one shape run (llama.cpp reuses the graph of the
    // decode before), and priced at the median over the reps; the sizes take turns within each rep
    // so that machine noise spreads over them alike. (Timed cold, after a decode of another size,
    // the plain step cost 10.5 ms against 7-8.6 ms in use: SmolLM2, 2 threads.)
    auto timed_decode = [&](int b, bool lazy) {
        double t = 0.0;
        for (int k = 0; k < 2; ++k) {
            batch_.n_tokens = 0;
            for (int j = 0; j < b; ++j) {
                add_row(s.seq.anchor, s.seq.pos + j, slot, true);
            }
            // as a verify runs it: with a lazy head, the decode plus the head of its first row
            const auto t0 = Clock::now();
            decode_batch(false, lazy);
            (void) row_logits(0);
            t = seconds_since(t0);
            if (k == 1 && lazy && target_.last_decode_lazy()) {  // one more row read: the head's product
                const auto t1 = Clock::now();
                (void) row_logits(1);
                ht.push_back(seconds_since(t1));
            }
            llama_memory_seq_rm(mem, slot, s.seq.pos, -1);
        }
        return t;
    };
    for (int r = 0; r < reps; ++r) {
        if (feed_drafters_) {  // the plain step: one row whose features the drafter goes without
            feed_rows_ = false;
            pt.push_back(timed_decode(1, false));
            feed_rows_ = true;
        }
        for (int b = 1; b <= max_b; ++b) {
            vt[static_cast<size_t>(b - 1)].push_back(timed_decode(b, /*lazy =*/b > 1));
        }
        for (int n = 1; n <= max_draft_; ++n) {
            const auto t0 = Clock::now();
            s.drafting.drafter->propose(s.seq.anchor, s.seq.pos, n + 1);
            (void) s.drafting.drafter->select_path(SelectorMode::Greedy, 0.0f, 0, opts_.q_top_k);
            dt[static_cast<size_t>(n - 1)].push_back(seconds_since(t0));
        }
    }
    auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
    };
    verify_s.assign(vt.size(), 0.0);
    draft_s.assign(dt.size(), 0.0);
    for (size_t i = 0; i < vt.size(); ++i) verify_s[i] = median(vt[i]);
    for (size_t i = 0; i < dt.size(); ++i) draft_s[i] = median(dt[i]);
    plain_s = pt.empty() ? 0.0 : median(pt);
    head_s = ht.empty() ? 0.0 : median(ht);
    target_.set_feeding(true);
    stats_.restore(saved);
}

}  // namespace pdf2
