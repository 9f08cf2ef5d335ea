// The batch builder: a step's rows (chains, trees with their branch sequences, pending rows,
// filler rows), the decodes, and the logits of their rows.
#include "engine/batch_engine.h"

#include "common/errors.h"

#include <chrono>
#include <exception>

namespace pdf2 {

void BatchEngine::add_row(llama_token token, int32_t pos, int seq, bool logits) {
    const int32_t i = batch_.n_tokens;
    batch_.token[i] = token;
    batch_.pos[i] = pos;
    batch_.n_seq_id[i] = 1;
    batch_.seq_id[i][0] = seq;
    batch_.logits[i] = logits ? 1 : 0;
    batch_.n_tokens = i + 1;
}

void BatchEngine::add_row(llama_token token, int32_t pos, const std::vector<int32_t> & seqs, bool logits) {
    const int32_t i = batch_.n_tokens;
    batch_.token[i] = token;
    batch_.pos[i] = pos;
    batch_.n_seq_id[i] = static_cast<int32_t>(seqs.size());
    std::copy(seqs.begin(), seqs.end(), batch_.seq_id[i]);
    batch_.logits[i] = logits ? 1 : 0;
    batch_.n_tokens = i + 1;
}

// The tree decoded the way llama.cpp decodes trees (examples/speculative): one sequence per
// leaf, holding a copy of the slot's context (metadata in a unified cache), and every node a
// row in the sequences of the leaves below it. A row then attends to the context and to its
// ancestors only (llama.cpp masks cells by sequence and position), and one decode computes all.
// The leaf of the first-child chain (the selector's path, the likeliest) takes the slot's own
// sequence, which holds the context already: it needs no copy before the decode, and the path's
// cells the commit keeps in place are the slot's without one (each seq_cp walks every cell).
void BatchEngine::add_tree_rows(int idx, Slot & s) {
    s.lay_out_tree(idx, n_slots() + idx * tree_branches_);
    const Slot::StepRows & r = s.rows();
    const DraftTree & t = r.block.tree;
    const int n = t.size();
    {
        const StepLedger::Scope kv(stats_.ledger(), Part::Kv);
        for (const int32_t b : r.branches) {
            if (b != idx) sync_branch(idx, b);
        }
    }
    add_pending_rows(s, r.branches);  // committed: in the slot and every branch
    s.place_anchor(batch_.n_tokens);
    add_row(s.seq().anchor, s.seq().pos, r.branches, true);
    // the nodes in their rows' order (Slot::lay_out_tree: depth first, best child first), so that
    // flash attention sums each row's keys in position order, as a chain's, gaps skipped
    // (benchmarks/tree_attention.py: bit-identical rows)
    std::vector<int32_t> row_node(static_cast<size_t>(n), 0);
    for (int v = 0; v < n; ++v) row_node[static_cast<size_t>(r.node_row[static_cast<size_t>(v)] - 1)] = v;
    const std::vector<int32_t> no_seqs;  // (filled in below)
    for (const int32_t v : row_node) {
        add_row(t.token[static_cast<size_t>(v)], s.seq().pos + t.depth[static_cast<size_t>(v)], no_seqs, true);
    }
    // every node's row in the sequences of the leaves below it, in leaf order
    for (size_t i = 0; i < r.branches.size(); ++i) {
        for (int v = r.branch_leaf[i]; v >= 0; v = t.parent[static_cast<size_t>(v)]) {
            const int32_t row = r.row0 + r.node_row[static_cast<size_t>(v)];
            batch_.seq_id[row][batch_.n_seq_id[row]++] = r.branches[i];
        }
    }
}

void BatchEngine::add_pending_rows(const Slot & s, const std::vector<int32_t> & seqs) {
    for (size_t j = 0; j < s.seq().pending.size(); ++j) {
        add_row(s.seq().pending[j], s.seq().pending_pos0 + static_cast<int32_t>(j), seqs, true);
    }
}

void BatchEngine::flush_pending(int idx, Slot & s) {
    if (s.seq().pending.empty() || s.state() == State::Idle) {
        return;
    }
    try {
        batch_.n_tokens = 0;
        add_pending_rows(s, {idx});
        decode_batch(true);
        s.pending_decoded();
    } catch (const Error &) {
        // the sequence keeps what it held; stop() cuts the slot's history back to that
        llama_memory_seq_rm(llama_get_memory(ctx_.ctx), idx, s.seq().pending_pos0, -1);
    }
}

// A branch keeps the slot's context between steps (commit_tree cuts only the tree's rows off), so
// a step copies only the cells committed since the branch's last step: copying the whole context
// into every branch each step was a KV scan and a position-map insert per cell per branch, the
// largest host part of a tree step. The branch must end where the slot's committed cells end
// (llama.cpp wants each sequence's rows to follow its last position); a branch that is not a
// prefix of the slot (a cut it missed, or emptied from outside) is copied whole again.
void BatchEngine::sync_branch(int idx, int32_t b) {
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    const llama_pos end = llama_memory_seq_pos_max(mem, idx) + 1;  // the slot's committed cells: [0, end)
    llama_pos have = llama_memory_seq_pos_max(mem, b) + 1;
    if (have > 0 && (llama_memory_seq_pos_min(mem, b) != 0 || have > end)) {
        llama_memory_seq_rm(mem, b, -1, -1);
        have = 0;
    }
    if (have < end) llama_memory_seq_cp(mem, idx, b, have, end);
}

void BatchEngine::cut_branches(int idx, llama_pos p0) {
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    for (int j = 0; j < tree_branches_; ++j) {
        llama_memory_seq_rm(mem, n_slots() + idx * tree_branches_ + j, p0, -1);
    }
}

void BatchEngine::remove_branches(Slot & s) {
    const StepLedger::Scope kv(stats_.ledger(), Part::Kv);
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    const auto idx = static_cast<int32_t>(&s - slots_.data());
    for (const int32_t b : s.rows().branches) {
        llama_memory_seq_rm(mem, b, b == idx ? s.seq().pos : -1, -1);  // the slot's own keeps its context
    }
    s.drop_branches();
}

void BatchEngine::add_filler_rows(int seq, int n) {
    const llama_pos p0 = llama_memory_seq_pos_max(llama_get_memory(ctx_.ctx), seq) + 1;
    if (p0 + n > opts_.n_ctx_slot) {
        return;  // no room in its stream: llama.cpp splits the batch there, which costs time only
    }
    // Fillers of plain steps (one row a slot) skip the LM head. A lazy-head verify (n > 1) wants
    // every row of the batch to output, and so does a capture of the last layer's output.
    const bool logits = n > 1 || target_.outputs_all_rows();
    for (int j = 0; j < n; ++j) {
        add_row(0, p0 + j, seq, logits);
    }
    fillers_.emplace_back(seq, p0);
    stats_.filler_rows(n);
}

void BatchEngine::remove_filler_rows() {
    const StepLedger::Scope kv(stats_.ledger(), Part::Kv);
    llama_memory_t mem = llama_get_memory(ctx_.ctx);
    for (const auto & [seq, p0] : fillers_) {
        llama_memory_seq_rm(mem, seq, p0, -1);
    }
    fillers_.clear();
}

void BatchEngine::decode_batch(bool prefill, bool lazy_head) {
    // On the callback path the capture copies the batch's rows of every feature
    // layer. A batch is one ubatch (at most n_ubatch rows; one sequence, or equal
    // rows per sequence in slot order), so the graph's rows are the batch's rows in
    // order, as with the taps; any other split fails check_complete's shape test.
    // (prompt rows always feed the drafter; verify rows unless the step starves it: BatchEngine::step)
    target_.set_feeding(prefill || feed_rows_);
    const bool capturing = target_.capture_path() == CapturePath::Callback && !target_.feature_layers().empty() &&
                           target_.feeding();
    if (capturing) {
        feature_capture_->arm(target_.feature_layers(), target_.n_embd(), batch_.n_tokens);
    }
    // verify rows of drafting slots: the head runs later, for the rows each verify reaches
    const bool cut = lazy_head && target_.arm_lazy_head(batch_.n_tokens);
    // Verify rows are generation work: they run with the one-row decodes' threads (n_threads),
    // not the prompt threads (n_threads_batch, which llama.cpp takes for any batch > 1): more
    // threads than plain decoding uses spin at every graph barrier on a busy machine.
    const int32_t nt = llama_n_threads(ctx_.ctx);
    const int32_t ntb = llama_n_threads_batch(ctx_.ctx);
    const bool swap_threads = !prefill && batch_.n_tokens > 1 && nt != ntb;
    if (swap_threads) {
        llama_set_n_threads(ctx_.ctx, nt, nt);
    }
    int32_t rc = 0;
    const auto t0 = std::chrono::steady_clock::now();
    {
        const StepLedger::Scope decode(stats_.ledger(), prefill ? Part::Prefill : Part::Decode);
        rc = llama_decode(ctx_.ctx, batch_);
    }
    if (rc == 0) {
        // a GPU's decode returns once launched: the wait for the device is its own part
        const StepLedger::Scope sync(stats_.ledger(), prefill ? Part::Prefill : Part::Sync);
        llama_synchronize(ctx_.ctx);
        if (!prefill) {
            stats_.timed_decode(batch_.n_tokens,
                                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                                feed_drafters_ && target_.feeding());
        }
    }
    if (swap_threads) {
        llama_set_n_threads(ctx_.ctx, nt, ntb);
    }
    if (capturing) {
        feature_capture_->disarm();
    }
    target_.end_lazy_head(cut, batch_.n_tokens);
    if (rc != 0) {
        throw Error("target llama_decode failed (code " + std::to_string(rc) + ") on a batch of " +
                    std::to_string(batch_.n_tokens) + " rows");
    }
    if (capturing) {
        feature_capture_->check_complete(target_.arch());
    }
    stats_.decoded(batch_.n_tokens);
}

const float * BatchEngine::row_logits(int32_t row) {
    if (target_.last_decode_lazy()) {
        const StepLedger::Scope head(stats_.ledger(), Part::Head);
        return target_.lazy_logits(row);  // the head runs now, for this row only
    }
    const float * r = llama_get_logits_ith(ctx_.ctx, row);
    if (r == nullptr) {
        throw Error("target produced no logits for batch row " + std::to_string(row));
    }
    return r;
}

// One group of slots with equal verify rows, in slot order. llama.cpp also needs the sequences
// of one ubatch to be consecutive: a slot between two members (idle, prefilling, or in another
// group) would split the batch, and each ubatch is a pass over the weights (a gap cost 40 -> 47
// ms a step of 8 slots at 2 threads). Such a slot gets n_rows filler rows after what its
// sequence holds instead; they are cut off again right after the decode.
int32_t BatchEngine::add_group_rows(int n_rows, const std::vector<int> & members) {
    const StepLedger::Scope build(stats_.ledger(), Part::Build);
    batch_.n_tokens = 0;
    // (exact batches: none, they would take the decode past exact_rows_; llama.cpp splits instead)
    const bool fill = fill_gaps_ && exact_rows_ == 0 && n_rows * (members.back() - members.front() + 1) <= batch_cap_;
    size_t next = 0;
    for (int i = members.front(); i <= members.back(); ++i) {
        if (members[next] != i) {
            if (fill) add_filler_rows(i, n_rows);
            continue;
        }
        ++next;
        Slot & s = slots_[static_cast<size_t>(i)];
        if (s.rows().block.is_tree) {
            add_tree_rows(i, s);  // its pending rows first, then the anchor (row0) and the nodes
        } else {
            add_chain_rows(i, s);
        }
    }
    return batch_.n_tokens - n_rows * static_cast<int32_t>(members.size());
}

void BatchEngine::add_chain_rows(int idx, Slot & s) {
    add_pending_rows(s, {idx});
    s.place_anchor(batch_.n_tokens);
    add_row(s.seq().anchor, s.seq().pos, idx, true);
    const std::vector<llama_token> & drafts = s.rows().block.tokens;
    for (size_t j = 0; j < drafts.size(); ++j) {
        add_row(drafts[j], s.seq().pos + 1 + static_cast<int32_t>(j), idx, true);
    }
}

void BatchEngine::decode_group(int n_rows, const std::vector<int> & members) {
    struct RemoveFillers {  // right after the decode, also when it throws (with the trees' branches then)
        BatchEngine & engine;
        const std::vector<int> & members;
        ~RemoveFillers() {
            engine.remove_filler_rows();
            if (std::uncaught_exceptions() > 0) {
                for (const int i : members) engine.remove_branches(engine.slots_[static_cast<size_t>(i)]);
            }
        }
    } remove_fillers{*this, members};
    // plain rows (one per slot) all need their head; a decode the full head was chosen for computes
    // every row's (apply_costs)
    decode_batch(false, /*lazy_head =*/n_rows > 1 && !takes_full_head(batch_.n_tokens, full_head_rows_));
}

// Prompt chunks, one decode per slot (a sequence alone is one ubatch), at most batch_cap_ prompt
// rows per step so that decoding slots keep their pace; slots take turns at going first. Exact
// batches: every chunk is n_batch rows from a multiple of n_batch (or the prompt's rest), as plain
// decoding's (the slot going first always has room for one).
int BatchEngine::prefill_chunks(std::vector<int32_t> & counts, std::vector<llama_token> & tokens) {
    const int n_slots_i = n_slots();
    int rows_left = batch_cap_;
    int rows = 0;
    for (int k = 0; k < n_slots_i && rows_left > 0; ++k) {
        const int i = (prefill_cursor_ + k) % n_slots_i;
        Slot & s = slots_[static_cast<size_t>(i)];
        if (s.state() != State::Prefill) {
            continue;
        }
        const int32_t left = static_cast<int32_t>(s.request().prompt.size()) - s.seq().n_prefilled;
        const int32_t chunk = std::min(left, rows_left);
        if (exact_rows_ > 0 && chunk < std::min(left, batch_cap_)) {
            continue;  // exact batches: plain decoding's whole chunk, at a later step
        }
        const StepLedger::Scope prefill(stats_.ledger(), Part::Prefill);  // all of the chunk's work
        {
            const StepLedger::Scope build(stats_.ledger(), Part::Build);
            batch_.n_tokens = 0;
            s.place_prompt_chunk(chunk);
            for (int32_t j = 0; j < chunk; ++j) {
                const int32_t p = s.seq().n_prefilled + j;
                add_row(s.request().prompt[static_cast<size_t>(p)], p, i, j == left - 1 || target_.outputs_all_rows());
            }
        }
        decode_batch(true);
        rows += chunk;
        rows_left -= chunk;
        commit_prefill(i, s, counts, tokens);
    }
    prefill_cursor_ = (prefill_cursor_ + 1) % n_slots_i;
    return rows;
}

}  // namespace pdf2
