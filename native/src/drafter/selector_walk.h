// Walks over a proposal: the DFlash2 k-by-k lattice or DFlash1 logits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pdf2 {

enum class WalkMode : int { Greedy = 0, Sample = 1, Viterbi = 2 };

// The engines' walk option (-1 = auto: sample when the target samples, else greedy; or a
// WalkMode) and q_top_k (support of a DFlash1 draft distribution) as the C API takes them:
// throws Error for values outside those.
void check_walk_options(int walk, int q_top_k);

// DFlash2 lattice of P drafted positions: candidates [P][k] (token ids) and
// scores [P][k(pred)][k(cand)]; position 0's rows are all the anchor's row.
struct Lattice {
    int n_pos = 0;
    int k = 0;
    std::vector<int32_t> cand;
    std::vector<float> scores;
    const float * row(int i, int pred) const { return scores.data() + (static_cast<size_t>(i) * k + pred) * k; }
};

// Per drafted position: the chosen token and the draft distribution q over
// q_ids (k entries): softmax(scores/T) for sample, one-hot for greedy/viterbi.
struct WalkResult {
    std::vector<int32_t> tokens;
    int k = 0;
    std::vector<int32_t> q_ids;  // [n_pos][k]
    std::vector<float> q;        // [n_pos][k]
};

WalkResult walk_lattice(const Lattice & lat, WalkMode mode, float temperature, uint64_t seed);

// DFlash1: logits [n_pos][n_vocab]; q over the top_k tokens of each position.
WalkResult walk_logits(const float * logits, int n_pos, int n_vocab, WalkMode mode, float temperature,
                       uint64_t seed, int top_k);

}  // namespace pdf2
