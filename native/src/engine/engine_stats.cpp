#include "engine/engine_stats.h"

#include <algorithm>

namespace pdf2 {

void StatsRecorder::start(SlotStats & st, int64_t n_prompt, int64_t n_reused, int step_width, int max_draft) {
    st = SlotStats{};
    st.n_prompt = n_prompt;
    st.n_reused = n_reused;
    st.drafted.assign(static_cast<size_t>(step_width), 0);
    st.accepted.assign(static_cast<size_t>(step_width), 0);
    st.n_max_used.assign(static_cast<size_t>(max_draft) + 1, 0);
    stats_.n_prompt_reused += n_reused;
}

void StatsRecorder::ran(SlotStats & st, const std::string & plan, double expected, int committed, double rate,
                        double plain_rate) {
    auto it = std::find_if(st.plans.begin(), st.plans.end(), [&](const PlanRun & r) { return r.plan == plan; });
    if (it == st.plans.end()) it = st.plans.insert(st.plans.end(), PlanRun{plan});
    it->steps += 1;
    it->expected += expected;
    it->committed += committed;
    if (rate > 0.0) {
        it->priced_steps += 1;
        it->rate += rate;
        it->plain_rate += plain_rate;
    }
}

void StatsRecorder::timed_decode(int rows, double seconds, bool fed) {
    const size_t i = static_cast<size_t>(std::max(rows, 1) - 1);
    auto add = [&](std::vector<int64_t> & n, std::vector<double> & s) {
        if (n.size() <= i) {
            n.resize(i + 1, 0);
            s.resize(i + 1, 0.0);
        }
        n[i] += 1;
        s[i] += seconds;
    };
    add(stats_.decodes_by_rows, stats_.decode_s_by_rows);
    if (fed) add(stats_.fed_decodes_by_rows, stats_.fed_decode_s_by_rows);
}

void StatsRecorder::committed(SlotStats & st, int n, bool verify) {
    stats_.n_generated += n;
    st.n_generated += n;
    st.n_steps += verify ? 1 : 0;
}

// Per block position (tree depth) 1..depth, whether the verify reached it and accepted its draft.
void StatsRecorder::drafted(SlotStats & st, int depth, int n_drafted, int k) {
    st.n_spec_steps += 1;
    for (int j = 0; j < depth && j <= k; ++j) {
        st.drafted[static_cast<size_t>(j)] += 1;  // the verify reached position j+1
        st.accepted[static_cast<size_t>(j)] += j < k ? 1 : 0;
    }
    stats_.n_drafts += 1;
    stats_.n_draft_tokens += n_drafted;
    stats_.n_accepted += k;
    for (int j = 0; j < k; ++j) stats_.accepted_per_pos[static_cast<size_t>(j)] += 1;
}

void StatsRecorder::block(SlotStats & st, int n, bool tree) {
    st.n_max_used[static_cast<size_t>(std::min<size_t>(static_cast<size_t>(n), st.n_max_used.size() - 1))] += 1;
    st.n_tree_steps += tree ? 1 : 0;
}

void StatsRecorder::merged_step(SlotStats & st, bool propose_skipped) {
    st.n_context_steps += 1;
    st.n_propose_skipped += propose_skipped ? 1 : 0;
    stats_.n_context_steps += 1;
    stats_.n_propose_skipped += propose_skipped ? 1 : 0;
}

}  // namespace pdf2
