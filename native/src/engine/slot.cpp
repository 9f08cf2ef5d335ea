#include "engine/slot.h"

#include <algorithm>
#include <utility>

namespace pdf2 {

void Slot::set_context_drafts(ContextDrafts mode, const std::string & key) {
    context_mode_ = mode;
    context_key_ = key;
}

void Slot::begin(const std::vector<llama_token> & prompt, std::unique_ptr<TargetSampler> sampler, int32_t max_tokens,
                 int32_t keep) {
    request_.sampler = std::move(sampler);
    request_.prompt = prompt;
    seq_.history = prompt;  // positions >= keep are prefilled next
    seq_.prompt_rows = static_cast<int32_t>(prompt.size());
    seq_.n_prefilled = keep;
    seq_.pos = 0;
    seq_.anchor = -1;
    request_.max_tokens = max_tokens;
    drafting_.sources.begin(
        SourceStart{&prompt, static_cast<int>(context_mode_), &context_key_, !request_.sampler->params().greedy()});
    state_ = State::Prefill;
}

void Slot::start_decoding(llama_token first) {
    state_ = State::Decode;
    seq_.pos = seq_.n_prefilled;
    seq_.anchor = first;
}

void Slot::end() {
    // what the sequence holds: the prefilled prompt rows, or every committed row
    const int32_t held =
        state_ == State::Prefill ? seq_.n_prefilled : seq_.pos - static_cast<int32_t>(seq_.pending.size());
    seq_.pending.clear();
    seq_.history.resize(static_cast<size_t>(std::min<int32_t>(held, static_cast<int32_t>(seq_.history.size()))));
    state_ = State::Idle;
    drafting_.sources.finish();  // the context's output joins the global cache
    request_.prompt.clear();
    request_.sampler.reset();
}

bool Slot::fill(int32_t n_ctx) {
    if (state_ != State::Decode || seq_.pos < n_ctx) return false;
    state_ = State::Full;
    return true;
}

void Slot::commit(const std::vector<llama_token> & accepted, llama_token next) {
    seq_.history.push_back(seq_.anchor);
    seq_.history.insert(seq_.history.end(), accepted.begin(), accepted.end());
    seq_.pos += static_cast<int32_t>(accepted.size()) + 1;
    seq_.anchor = next;
}

void Slot::cut_to(int32_t keep, int32_t feature_width) {
    if (drafting_.drafter != nullptr) {
        drafting_.drafter->truncate(keep);
        // rows committed but not yet injected: keep those below `keep` (positions ascend)
        std::vector<int32_t> & positions = drafting_.feed.positions;
        const auto cut = std::lower_bound(positions.begin(), positions.end(), keep);
        const size_t n_kept = static_cast<size_t>(cut - positions.begin());
        positions.resize(n_kept);
        drafting_.feed.features.resize(n_kept * static_cast<size_t>(feature_width));
    }
    seq_.history.resize(static_cast<size_t>(keep));
}

DraftBlock & Slot::plan_block(const std::string & plan, double expected) {
    rows_.block.clear();
    plan_.name = plan;
    plan_.expected = expected;
    return rows_.block;
}

void Slot::price(double rate, double plain_rate) {
    plan_.rate = rate;
    plan_.plain_rate = plain_rate;
}

void Slot::place_prompt_chunk(int32_t n) {
    rows_.row0 = 0;
    rows_.n_rows = n;
}

// The tree decoded the way llama.cpp decodes trees (BatchEngine::add_tree_rows): a sequence per
// leaf, every node in the sequences of the leaves below it. Depth first, best child first: a row's
// cells come in batch order, so the first-child chain sits at the cells of its positions and every
// path's cells increase with depth (commit_tree keeps that order).
void Slot::lay_out_tree(int32_t own_seq, int32_t first_seq) {
    const DraftTree & t = rows_.block.tree;
    const int n = t.size();
    std::vector<int32_t> first_child(static_cast<size_t>(n), -1);
    for (int v = n - 1; v >= 0; --v) {  // children come after their parent: the lowest index wins
        const int32_t p = t.parent[static_cast<size_t>(v)];
        if (p >= 0) first_child[static_cast<size_t>(p)] = v;
    }
    int32_t chain_leaf = 0;  // node 0 is the root's first child
    while (n > 0 && first_child[static_cast<size_t>(chain_leaf)] >= 0) {
        chain_leaf = first_child[static_cast<size_t>(chain_leaf)];
    }
    rows_.branches.clear();
    rows_.branch_leaf.clear();
    rows_.node_branch.assign(static_cast<size_t>(n), -1);
    int32_t n_own = 0;  // branches with a sequence of their own
    for (int leaf = 0; leaf < n; ++leaf) {
        if (first_child[static_cast<size_t>(leaf)] >= 0) continue;
        const int32_t b = leaf == chain_leaf ? own_seq : first_seq + n_own++;
        rows_.branches.push_back(b);
        rows_.branch_leaf.push_back(leaf);
        for (int v = leaf; v >= 0 && rows_.node_branch[static_cast<size_t>(v)] < 0; v = t.parent[static_cast<size_t>(v)]) {
            rows_.node_branch[static_cast<size_t>(v)] = b;
        }
    }
    rows_.node_row.assign(static_cast<size_t>(n), 0);
    std::vector<int32_t> stack;
    for (int v = n - 1; v >= 0; --v) {
        if (t.parent[static_cast<size_t>(v)] < 0) stack.push_back(v);  // later siblings deeper in the stack
    }
    int32_t row = 1;
    while (!stack.empty()) {
        const int32_t v = stack.back();
        stack.pop_back();
        rows_.node_row[static_cast<size_t>(v)] = row++;
        for (int c = n - 1; c > v; --c) {
            if (t.parent[static_cast<size_t>(c)] == v) stack.push_back(c);
        }
    }
}

void Slot::drop_branches() {
    rows_.branches.clear();
    rows_.branch_leaf.clear();
}

bool Slot::prompt_chunk_done() {
    seq_.n_prefilled += rows_.n_rows;
    return seq_.n_prefilled >= static_cast<int32_t>(request_.prompt.size());
}

void Slot::defer_rows(const std::vector<llama_token> & accepted, int n_in_place) {
    seq_.pending.assign(accepted.begin() + static_cast<std::ptrdiff_t>(n_in_place), accepted.end());
    seq_.pending_pos0 = seq_.pos + n_in_place + 1;  // (before commit() moves the position)
}

void Slot::record_logprob(const float * logits, int32_t n_vocab, llama_token token) {
    const auto i = static_cast<size_t>(request_.n_logprobs);
    if (request_.logprobs.size() <= i) request_.logprobs.resize(i + 1);
    token_logprob(logits, n_vocab, token, request_.sampler->params().n_logprobs, request_.logprobs[i]);
    request_.n_logprobs += 1;
}

}  // namespace pdf2
