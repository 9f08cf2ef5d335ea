// Verification of a drafted block against the target's logits (shared doc §4).
// Both rules are lossless: greedy output equals plain greedy decoding, and the
// stochastic rule (accept with min(1, p/q), else draw from max(0, p - q))
// leaves every committed token distributed exactly as the target's p.
#pragma once

#include "engine/target_sampling.h"

#include <functional>
#include <vector>

namespace pdf2 {

struct VerifyResult {
    int n_accepted = 0;      // drafts accepted (a prefix of the block)
    llama_token next = -1;   // bonus / correction token: the next anchor
};

// row(j) = target logits after the anchor and the first j drafts (j = 0..n). Rows are
// asked for in order and only as far as the verify gets (the target's head may run lazily).
using LogitRows = std::function<const float *(int)>;

// Both take the sampler chain: every committed token (accepted drafts, then the bonus or
// correction token) is accepted into its history as the walk reaches it.
VerifyResult verify_greedy(const std::vector<llama_token> & drafts, const LogitRows & row, TargetSampler & sampler);

// q[j] = the draft distribution the j-th draft was drawn from.
VerifyResult verify_stochastic(const std::vector<llama_token> & drafts, const std::vector<SparseDist> & q,
                               const LogitRows & row, TargetSampler & sampler);

}  // namespace pdf2
