// The path selector: picks one path of drafts through a proposal (the DFlash2 k-by-k lattice or
// DFlash1 logits), greedy, sampled or Viterbi.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace pdf2 {

enum class SelectorMode : int { Greedy = 0, Sample = 1, Viterbi = 2 };

// The engines' selector option (-1 = auto: sample when the target samples, else greedy; or a
// SelectorMode) and q_top_k (support of a DFlash1 draft distribution) as the C API takes them:
// throws Error for values outside those.
void check_selector_options(int selector, int q_top_k);

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
struct DraftPath {
    std::vector<int32_t> tokens;
    int k = 0;
    std::vector<int32_t> q_ids;  // [n_pos][k]
    std::vector<float> q;        // [n_pos][k]
};

DraftPath select_lattice_path(const Lattice & lat, SelectorMode mode, float temperature, uint64_t seed);

// DFlash1: logits [n_pos][n_vocab]; q over the top_k tokens of each position.
DraftPath select_logits_path(const float * logits, int n_pos, int n_vocab, SelectorMode mode, float temperature,
                             uint64_t seed, int top_k);

}  // namespace pdf2
