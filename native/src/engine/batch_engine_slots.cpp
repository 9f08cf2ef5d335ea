// The engine's slots: a request starts on a slot (its prompt's prefix reused from what the slot
// holds, its sources told), and stops; and exact batches, which keep every decode in plain
// decoding's shape (exact mode on targets whose kernels switch with the batch).
#include "engine/batch_engine.h"

#include "common/errors.h"

#include <algorithm>
#include <string>

namespace pdf2 {

Slot & BatchEngine::slot_at(int slot) {
    if (slot < 0 || slot >= n_slots()) {
        throw Error("slot " + std::to_string(slot) + " does not exist (0.." + std::to_string(n_slots() - 1) + ")");
    }
    return slots_[static_cast<size_t>(slot)];
}

void BatchEngine::start(int slot, const std::vector<llama_token> & prompt, const SamplingParams & sampling,
                        int32_t max_tokens) {
    slot_at(slot);  // a bad index before the grammar is parsed
    // validates every parameter (the grammar too) before the slot changes
    start(slot, prompt, std::make_unique<TargetSampler>(sampling, target_.vocab(), opts_.n_ctx_slot), max_tokens);
}

void BatchEngine::start(int slot, const std::vector<llama_token> & prompt, std::unique_ptr<TargetSampler> sampler,
                        int32_t max_tokens) {
    Slot & s = slot_at(slot);
    if (sampler == nullptr) {
        throw Error("the sampler chain is NULL");
    }
    if (sampler->vocab() != target_.vocab() || sampler->n_ctx() != opts_.n_ctx_slot) {
        throw Error("the sampler chain was made for another target or context size");
    }
    if (max_tokens < 0) {
        throw Error("max_tokens must be >= 0 (0: no limit), got " + std::to_string(max_tokens));
    }
    if (s.state() != State::Idle) {
        throw Error("slot " + std::to_string(slot) + " is busy: stop it first");
    }
    if (prompt.empty()) {
        throw Error("the prompt is empty: at least one token is needed");
    }
    if (static_cast<int32_t>(prompt.size()) >= opts_.n_ctx_slot) {
        throw Error("the prompt (" + std::to_string(prompt.size()) + " tokens) does not fit the context (" +
                    std::to_string(opts_.n_ctx_slot) + " tokens)");
    }
    for (const llama_token t : prompt) {
        if (t < 0 || t >= target_.n_vocab()) {
            throw Error("token id " + std::to_string(t) + " is outside the target vocabulary");
        }
    }
    if (borrowed_) {
        // the owner may have decoded in its context since, and other engines may share it:
        // its taps are set for this engine again, and nothing it holds is trusted; its cells go too
        // (another engine's tree branches keep theirs after a request): left in a unified cache, they
        // move where this request's rows land and how many cells attention reads, which flips near-ties
        target_.claim();
        s.forget_history();
        llama_memory_clear(llama_get_memory(ctx_.ctx), false);
    }
    const int32_t keep = reuse_prefix(s, slot, prompt);
    stats_.start(s.stats(), static_cast<int64_t>(prompt.size()), keep, step_width_, max_draft_);
    s.begin(prompt, std::move(sampler), max_tokens, keep);
}

void BatchEngine::stop(int slot) {
    Slot & s = slot_at(slot);
    if (s.state() == State::Idle) {
        return;
    }
    flush_pending(slot, s);
    s.end();
}

namespace {

// the common prefix of what a slot holds and a prompt, leaving at least the
// last prompt token to decode (its logits give the first answer token)
size_t reusable_rows(const std::vector<llama_token> & history, const std::vector<llama_token> & prompt) {
    const size_t limit = std::min(history.size(), prompt.empty() ? 0 : prompt.size() - 1);
    size_t keep = 0;
    while (keep < limit && history[keep] == prompt[keep]) {
        ++keep;
    }
    return keep;
}

}  // namespace

int32_t BatchEngine::cached_prefix(int slot, const std::vector<llama_token> & prompt) {
    const Slot & s = slot_at(slot);
    if (s.state() != State::Idle) {
        throw Error("slot " + std::to_string(slot) + " is busy");
    }
    return reusable_prefix(s, prompt);
}

// Exact batches: plain decoding prefills a prompt in chunks of n_batch rows from position 0, and
// a row's numbers depend on its chunk (which rows take the gemm kernel, which the gemv). Rows of
// the last prompt's whole chunks are its rows; rows after them (a partial chunk, generated tokens)
// were decoded in other shapes.
int32_t BatchEngine::reusable_prefix(const Slot & s, const std::vector<llama_token> & prompt) const {
    const auto keep = static_cast<int32_t>(reusable_rows(s.seq().history, prompt));
    if (exact_rows_ == 0) {
        return keep;
    }
    return std::min(keep, s.seq().prompt_rows) / batch_cap_ * batch_cap_;
}

void BatchEngine::set_exact_batches(int max_rows) {
    if (max_rows < 0 || max_rows > batch_cap_) {
        throw Error("exact batches: max_rows must be in 0.." + std::to_string(batch_cap_) + ", got " +
                    std::to_string(max_rows));
    }
    if (max_rows > 0 && max_verify_rows() > max_rows) {
        throw Error("exact batches of at most " + std::to_string(max_rows) + " rows, but a step verifies up to " +
                    std::to_string(max_verify_rows()) + " rows for one slot (make the engine with max_draft <= " +
                    std::to_string(max_rows - 1) + ")");
    }
    exact_rows_ = max_rows;
    // a group of head rows is a batch too: exact mode keeps the one-row product plain decoding uses
    target_.set_head_rows(max_rows > 0 ? 1 : 0);
    apply_costs();  // and the lazy head, not the full one
}

// Each group's slots in as many decodes as keep every one within exact_rows_ rows (one group, one
// decode, when off).
BatchEngine::Decodes BatchEngine::group_decodes(const Groups & groups) const {
    Decodes out;
    for (const auto & [n_rows, members] : groups) {
        const size_t per = exact_rows_ > 0 ? static_cast<size_t>(std::max(1, exact_rows_ / n_rows)) : members.size();
        for (size_t k = 0; k < members.size(); k += per) {
            const auto first = members.begin() + static_cast<std::ptrdiff_t>(k);
            out.emplace_back(n_rows, std::vector<int>(first, first + static_cast<std::ptrdiff_t>(
                                                                          std::min(per, members.size() - k))));
        }
    }
    return out;
}

int32_t BatchEngine::reuse_prefix(Slot & s, int slot, const std::vector<llama_token> & prompt) {
    const int32_t k = reusable_prefix(s, prompt);
    llama_memory_seq_rm(llama_get_memory(ctx_.ctx), slot, k, -1);
    cut_branches(slot, k);  // the branches keep a prefix of the slot's context (sync_branch)
    s.cut_to(k, target_.feature_width());
    return k;
}

}  // namespace pdf2
