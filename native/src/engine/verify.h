// Rejection sampling: the one home of the rule that decides which drafted tokens the target
// keeps (shared doc §4), for a chain, a tree and the first token after a prefill. Each rule is
// lossless: greedy output equals plain greedy decoding, and the stochastic rule (accept with
// min(1, p/q), else draw from max(0, p - q)) leaves every committed token distributed exactly as
// the target's p after its whole sampler chain. The target's own choice at a row is always
// TargetSampler::sample.
#pragma once

#include "drafter/draft_tree.h"
#include "engine/target_sampling.h"

#include <functional>
#include <vector>

namespace pdf2 {

struct VerifyResult {
    int n_accepted = 0;         // drafts accepted (a chain's prefix, a tree's path)
    llama_token next = -1;      // bonus / correction token: the next anchor
    std::vector<int32_t> path;  // tree: the accepted nodes, root first
};

// row(j) = target logits after the anchor and the first j drafts (j = 0..n). Rows are
// asked for in order and only as far as the verify gets (the target's head may run lazily).
using LogitRows = std::function<const float *(int)>;

// Every committed token (accepted drafts, then the bonus or correction token) is accepted into
// the sampler's history as verification reaches it.
// A chain: greedy targets keep drafts while they are the argmax; sampling targets by rejection
// (q[j] = the law the j-th draft was drawn from; one-hot for a picked draft).
VerifyResult verify_chain(const std::vector<llama_token> & drafts, const std::vector<SparseDist> & q,
                          const LogitRows & row, TargetSampler & sampler);

// node_row(v) = target logits after the anchor and node v's path (v = -1: the anchor's row).
// From the anchor, the target chooses its next token (TargetSampler::sample), and the verify
// descends into the child holding that token while there is one. Every committed token is the
// target's own choice at the committed prefix, so the output is what the target alone writes
// (greedy: plain greedy decoding; sampled: its law). With fixed candidates as children
// (one-hot draft distributions) this is the multi-draft rule of SpecInfer without sampled drafts.
// committed(logits, token) is called for each committed token (logprobs).
VerifyResult verify_tree(const DraftTree & tree, const LogitRows & node_row, TargetSampler & sampler,
                         const std::function<void(const float *, llama_token)> & committed);

// The first token of an answer, from the logits of the prompt's last row.
llama_token first_token(const float * logits, TargetSampler & sampler);

}  // namespace pdf2
