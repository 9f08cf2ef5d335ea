// The engine's side of the cost model (cost_model.h): the costs it is given, and measuring them.
#include "engine/batch_engine.h"

#include "common/clock.h"
#include "common/errors.h"

#include <algorithm>
#include <limits>

namespace pdf2 {

void BatchEngine::set_costs(const std::vector<double> & verify_s, const std::vector<double> & draft_s,
                            double plain_s, double head_s, bool learn, const std::vector<double> & verify_full_s) {
    given_costs_ = GivenCosts{verify_s, draft_s, verify_full_s, plain_s, head_s, learn, true};
    apply_costs();
}

// The head the verifies run, and the tables priced with it: up to full_head_rows_ rows a decode,
// the full head's decodes (no product: the head is in them), past that the lazy head's decodes and
// products. Exact batches and a set lazy head group keep the lazy head (a group of head rows is a
// batch too: set_exact_batches).
void BatchEngine::apply_costs() {
    const GivenCosts & g = given_costs_;
    const bool lazy_possible = head_capture_ != nullptr && target_.lazy_head_error().empty();
    head_choice_ = choose_head(g.verify_s, g.verify_full_s, g.head_s);
    int full_rows = 0;
    if (lazy_possible && target_.forced_head_rows() == 0) {
        if (head_mode_ == HeadMode::Full) full_rows = std::numeric_limits<int>::max();
        if (head_mode_ == HeadMode::Auto) full_rows = head_choice_.full_rows;
    }
    full_head_rows_ = full_rows;
    if (!g.given) return;
    StepCosts costs;
    costs.verify_s = g.verify_s;
    costs.head_s = g.head_s;
    if (full_rows > 0 && head_choice_.measured) {
        const size_t n = std::min(costs.verify_s.size(), g.verify_full_s.size());
        for (size_t i = 1; i < n && static_cast<int>(i) < full_rows; ++i) costs.verify_s[i] = g.verify_full_s[i];
        costs.full_head_rows = full_rows;
    }
    costs.draft_s = g.draft_s;
    costs.plain_s = feed_drafters_ ? g.plain_s : 0.0;  // without a drafter every step is already so
    cost_model_.set_costs(costs, g.learn);
}

void BatchEngine::set_head_mode(HeadMode mode) {
    head_mode_ = mode;
    apply_costs();
}

void BatchEngine::set_lazy_head_group(int32_t rows) {
    target_.set_head_rows(rows);
    apply_costs();
}

namespace {
double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
std::vector<double> medians(const std::vector<std::vector<double>> & samples) {
    std::vector<double> out(samples.size(), 0.0);
    for (size_t i = 0; i < samples.size(); ++i) out[i] = samples[i].empty() ? 0.0 : median(samples[i]);
    return out;
}
}  // namespace

// A verify decode of b rows on the slot as measure_costs times it (above): the second of two in a
// row, as a verify runs it (with a lazy head, the decode plus the head of its first row); with a
// lazy head, one more row read times the head's product (into head_times), and cut_seen notes a
// decode that stopped before the head. The rows are removed again.
double BatchEngine::timed_verify(int slot, int b, bool lazy, bool & cut_seen, std::vector<double> & head_times) {
    const Slot & s = slot_at(slot);
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    double t = 0.0;
    for (int k = 0; k < 2; ++k) {
        batch_.n_tokens = 0;
        for (int j = 0; j < b; ++j) {
            add_row(s.seq().anchor, s.seq().pos + j, slot, true);
        }
        const auto t0 = Clock::now();
        decode_batch(false, lazy);
        (void) row_logits(0);
        t = seconds_since(t0);
        cut_seen = cut_seen || (lazy && target_.last_decode_lazy());
        if (k == 1 && lazy && target_.last_decode_lazy()) {
            const auto t1 = Clock::now();
            (void) row_logits(1);
            head_times.push_back(seconds_since(t1));
        }
        llama_memory_seq_rm(mem, slot, s.seq().pos, -1);
    }
    return t;
}

void BatchEngine::measure_costs(int slot, int reps, std::vector<double> & verify_s, std::vector<double> & draft_s,
                                double & plain_s, double & head_s, std::vector<double> & verify_full_s) {
    Slot & s = slot_at(slot);
    if (s.state() != State::Decode || (s.drafter() == nullptr && max_draft_ > 0)) {
        throw Error("measure_costs() needs a slot that has finished its prefill (and its drafter)");
    }
    reps = std::max(1, reps);
    const int max_b = max_verify_rows();
    if (s.seq().pos + max_b > opts_.n_ctx_slot) {
        throw Error("context too small to measure costs");
    }
    flush_rows(s);
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
    // the full head beside the lazy one where the lazy head can run (set_costs chooses between them)
    const bool time_full = head_capture_ != nullptr && (feed_drafters_ || opts_.context_nodes > 0);
    std::vector<std::vector<double>> ft(static_cast<size_t>(time_full ? max_b : 0));  // full - lazy, paired
    bool cut_seen = false;  // a lazy decode did stop before the head
    // One way of timing for every price: a size's decode is timed as the second of two in a row of
    // that size, the way consecutive steps of one shape run (llama.cpp reuses the graph of the
    // decode before), and priced at the median over the reps; the sizes take turns within each rep
    // so that machine noise spreads over them alike. (Timed cold, after a decode of another size,
    // the plain step cost 10.5 ms against 7-8.6 ms in use: SmolLM2, 2 threads.)
    auto timed_decode = [&](int b, bool lazy) { return timed_verify(slot, b, lazy, cut_seen, ht); };
    for (int r = 0; r < reps; ++r) {
        if (feed_drafters_) {  // the plain step: one row whose features the drafter goes without
            feed_rows_ = false;
            pt.push_back(timed_decode(1, false));
            feed_rows_ = true;
        }
        for (int b = 1; b <= max_b; ++b) {
            if (!time_full || b == 1) {
                vt[static_cast<size_t>(b - 1)].push_back(timed_decode(b, /*lazy =*/b > 1));
                continue;
            }
            // both heads back to back, in turns first: the machine's noise hits the pair alike, and
            // the full head is priced at the lazy table plus the pairs' median difference
            const bool lazy_first = r % 2 == 0;
            const double first = timed_decode(b, lazy_first);
            const double second = timed_decode(b, !lazy_first);
            vt[static_cast<size_t>(b - 1)].push_back(lazy_first ? first : second);
            ft[static_cast<size_t>(b - 1)].push_back(lazy_first ? second - first : first - second);
        }
        for (int n = 1; n <= max_draft_; ++n) {
            const auto t0 = Clock::now();
            s.drafter()->propose(s.seq().anchor, s.seq().pos, n + 1);
            (void) s.drafter()->select_path(SelectorMode::Greedy, 0.0f, 0, opts_.q_top_k);
            dt[static_cast<size_t>(n - 1)].push_back(seconds_since(t0));
        }
    }
    verify_s = medians(vt);
    draft_s = medians(dt);
    // the full head at the lazy table plus the pairs' median difference; none where no decode was cut
    verify_full_s = cut_seen ? medians(ft) : std::vector<double>{};
    for (size_t i = 0; i < verify_full_s.size(); ++i) {
        verify_full_s[i] = i == 0 ? verify_s[0] : std::max(1e-6, verify_s[i] + verify_full_s[i]);
    }
    plain_s = pt.empty() ? 0.0 : median(pt);
    head_s = ht.empty() ? 0.0 : median(ht);
    target_.set_feeding(true);
    stats_.restore(saved);
}

}  // namespace pdf2
