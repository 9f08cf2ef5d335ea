// The commits of verified rows: a chain's or a tree's accepted drafts and the next token join the
// slot's sequence, the rejected rows' KV cells are cut (a tree's branches in one walk where the slot
// is alone in the cache), the drafter is queued the committed rows' features, the sources are told
// what was committed, and the logprobs the request asked for are recorded.
#include "engine/batch_engine.h"

#include "engine/verify.h"

#include <algorithm>

namespace pdf2 {

// The committed tokens of a verified step: out[0..k) the accepted drafts, out[k] the next anchor.
void BatchEngine::commit_tokens(int idx, Slot & s, const std::vector<llama_token> & accepted, llama_token next,
                                const std::vector<char> * node_accepted, std::vector<int32_t> & counts,
                                std::vector<llama_token> & tokens) {
    const int k = static_cast<int>(accepted.size());
    s.commit(accepted, next);
    llama_token * out = tokens.data() + static_cast<size_t>(idx) * (static_cast<size_t>(step_width_) + 1);
    std::copy(accepted.begin(), accepted.end(), out);
    out[k] = next;
    {
        const StepLedger::Scope sources(stats_.ledger(), Part::Sources);
        s.sources().accept(Verified{out, static_cast<size_t>(k) + 1, &s.rows().block, node_accepted});
    }
    counts[static_cast<size_t>(idx)] = k + 1;
    stats_.committed(s.stats(), k + 1, true);
    // the plan it ran (a block that came out empty verified nothing: plain)
    const Slot::PlanAsRun & plan = s.plan();
    const bool drafted = !s.rows().block.tokens.empty();
    const bool as_planned = drafted || plan.name == "plain";
    stats_.ran(s.stats(), drafted ? plan.name : "plain", drafted ? plan.expected : 1.0, k + 1,
               as_planned ? plan.rate : 0.0, plan.plain_rate);
}

void BatchEngine::commit_chain(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens) {
    const std::vector<llama_token> & drafts = s.rows().block.tokens;
    const int n = static_cast<int>(drafts.size());
    const LogitRows row = [this, &s](int j) { return row_logits(s.rows().row0 + j); };
    const VerifyResult v = [&] {
        const StepLedger::Scope verify(stats_.ledger(), Part::Verify);
        return verify_chain(drafts, s.rows().block.q, row, s.sampler());
    }();
    const int k = v.n_accepted;
    if (n > 0) {
        const StepLedger::Scope kv(stats_.ledger(), Part::Kv);
        llama_memory_seq_rm(llama_get_memory(ctx_.ctx), idx, s.seq().pos + k + 1, -1);  // rejected drafts
    }
    if (s.wants_logprobs()) {
        s.clear_logprobs();
        for (int j = 0; j <= k; ++j) {  // rows the verify read: the head ran for them already
            s.record_logprob(row(j), target_.n_vocab(), j < k ? drafts[static_cast<size_t>(j)] : v.next);
        }
    }
    queue_rows(s, s.rows().row0, k + 1, s.seq().pos);  // anchor + accepted drafts are committed
    stats_.block(s.stats(), n, false);
    if (n > 0) stats_.drafted(s.stats(), n, n, k);
    commit_tokens(idx, s, std::vector<llama_token>(drafts.begin(), drafts.begin() + k), v.next, nullptr, counts,
                  tokens);
}

// One slot alone in the cache: every cell past the kept path is its tree's, so one walk over the
// cells takes them out of every sequence (a walk per branch was most of a tree step's KV work, 2-4 us
// a walk at 2048 cells). Within the kept path's positions, a branch that left the path at depth j
// holds rejected nodes from pos + 1 + j: it loses those (and keeps the path's cells it shares, a
// prefix of the slot, like the accepted branch).
void BatchEngine::cut_tree_at_once(const Slot & s, const std::vector<int32_t> & path, int n_in_place) {
    const Slot::StepRows & r = s.rows();
    const DraftTree & t = r.block.tree;
    const int32_t pos = s.seq().pos;
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    llama_memory_seq_rm(mem, -1, pos + 1 + n_in_place, -1);
    if (n_in_place == 0) return;
    std::vector<int32_t> kept_depth(static_cast<size_t>(t.size()), 0);
    for (int j = 0; j < n_in_place; ++j) kept_depth[static_cast<size_t>(path[static_cast<size_t>(j)])] = j + 1;
    for (size_t i = 0; i < r.branches.size(); ++i) {
        const int32_t leaf = r.branch_leaf[i];
        int32_t shared = 0;  // the depth of its deepest node on the kept path (the first found going up)
        for (int32_t v = leaf; v >= 0 && shared == 0; v = t.parent[static_cast<size_t>(v)]) {
            shared = kept_depth[static_cast<size_t>(v)];
        }
        // (the slot's own sequence, the first-child chain's, holds the whole in-place path: never cut here)
        if (shared < n_in_place && t.depth[static_cast<size_t>(leaf)] > shared) {
            llama_memory_seq_rm(mem, r.branches[i], pos + 1 + shared, pos + 1 + n_in_place);
        }
    }
}

// A verified tree (verify_tree): the accepted path's cells join the slot's sequence and the
// branches are cut off.
void BatchEngine::commit_tree(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens) {
    const Slot::StepRows & r = s.rows();
    const DraftTree & t = r.block.tree;
    const std::vector<int32_t> & node_row = r.node_row;
    const int n = t.size();
    const bool want_logprobs = s.wants_logprobs();
    if (want_logprobs) s.clear_logprobs();
    const LogitRows logits_at = [&](int node) {
        return row_logits(r.row0 + (node < 0 ? 0 : node_row[static_cast<size_t>(node)]));
    };
    const VerifyResult v = [&] {
        const StepLedger::Scope verify(stats_.ledger(), Part::Verify);
        return verify_tree(t, logits_at, s.sampler(), [&](const float * logits, llama_token x) {
            if (want_logprobs) s.record_logprob(logits, target_.n_vocab(), x);
        });
    }();
    const std::vector<int32_t> & path = v.path;
    const int k = v.n_accepted;
    // The path's first n_in_place nodes are the first-child chain, at the cells of their positions:
    // they join the slot's sequence where they are. The rest sat at later cells; kept there, later
    // rows would fill the freed cells below them and break the position order of the cache, so
    // they are decoded again ahead of the next step's rows (exact: the same inputs in the same order).
    int n_in_place = 0;
    while (n_in_place < k && node_row[static_cast<size_t>(path[static_cast<size_t>(n_in_place)])] == n_in_place + 1) {
        ++n_in_place;
    }
    // The path's in-place nodes are the first-child chain's, whose leaf's branch is the slot's own
    // sequence (add_tree_rows): they are the slot's already, no copy.
    {
        // The tree's rows leave the branches, which keep the context for the next tree (sync_branch).
        // Every branch keeps the anchor (committed, in all of them).
        const StepLedger::Scope kv(stats_.ledger(), Part::Kv);
        if (cut_trees_at_once_) {
            cut_tree_at_once(s, path, n_in_place);
        } else {
            // the branch through the last accepted node keeps the in-place path too: when the whole
            // path was in place, it ends where the slot ends and needs no copy next step
            const int32_t branch = k > 0 ? r.node_branch[static_cast<size_t>(path.back())] : idx;
            llama_memory_t mem = llama_get_memory(ctx_.ctx);
            for (const int32_t b : r.branches) {
                llama_memory_seq_rm(mem, b, s.seq().pos + 1 + (b == branch || b == idx ? n_in_place : 0), -1);
            }
        }
        s.drop_branches();
    }
    std::vector<int32_t> committed_rows{r.row0};  // the anchor, then the accepted nodes' rows (not adjacent)
    std::vector<llama_token> accepted(static_cast<size_t>(k));
    for (int j = 0; j < k; ++j) {
        const int node = path[static_cast<size_t>(j)];
        committed_rows.push_back(r.row0 + node_row[static_cast<size_t>(node)]);
        accepted[static_cast<size_t>(j)] = t.token[static_cast<size_t>(node)];
    }
    s.defer_rows(accepted, n_in_place);
    queue_rows(s, committed_rows, s.seq().pos);
    const int depth = *std::max_element(t.depth.begin(), t.depth.end());
    stats_.block(s.stats(), std::min(depth, max_draft_), true);
    stats_.drafted(s.stats(), depth, n, k);
    std::vector<char> node_accepted(static_cast<size_t>(n), 0);
    for (const int32_t node : path) node_accepted[static_cast<size_t>(node)] = 1;
    commit_tokens(idx, s, accepted, v.next, &node_accepted, counts, tokens);
    s.tree_verified();
}

void BatchEngine::commit_prefill(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens) {
    queue_rows(s, s.rows().row0, s.rows().n_rows, s.seq().n_prefilled);
    stats_.prefilled(s.rows().n_rows);
    if (!s.prompt_chunk_done()) {
        return;
    }
    const float * logits = row_logits(s.rows().row0 + s.rows().n_rows - 1);
    const llama_token first = [&] {
        const StepLedger::Scope verify(stats_.ledger(), Part::Verify);
        return first_token(logits, s.sampler());
    }();
    if (s.wants_logprobs()) {
        s.clear_logprobs();
        s.record_logprob(logits, target_.n_vocab(), first);
    }
    s.start_decoding(first);
    tokens[static_cast<size_t>(idx) * (static_cast<size_t>(step_width_) + 1)] = first;
    const StepLedger::Scope sources(stats_.ledger(), Part::Sources);
    s.sources().accept(Verified{&first, 1, nullptr, nullptr});  // a prompt's first token: no block
    counts[static_cast<size_t>(idx)] = 1;
    stats_.committed(s.stats(), 1, false);
}

const std::vector<TokenLogprob> & BatchEngine::logprobs(int slot, int32_t & n_committed) {
    const Slot & s = slot_at(slot);
    n_committed = s.request().n_logprobs;
    return s.request().logprobs;
}

}  // namespace pdf2
