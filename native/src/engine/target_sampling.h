// The target's token distribution p, shaped exactly as plain llama.cpp
// decoding shapes it: the same llama_sampler objects (top-k, typical, top-p,
// min-p, temperature, in llama-cpp-python's order) are applied to the logits,
// and p is the softmax of what they leave. Only the final draw differs: the
// verifier draws from p itself (rejection sampling), which is the same law.
#pragma once

#include <llama.h>

#include <cstdint>
#include <random>
#include <vector>

namespace pdf2 {

struct SamplingParams {
    float temperature = 0.0f;  // 0 = greedy
    int32_t top_k = 0;         // <= 0: off
    float top_p = 1.0f;        // 1: off
    float min_p = 0.0f;        // 0: off
    float typical_p = 1.0f;    // 1: off
    uint64_t seed = 0;

    bool greedy() const { return temperature <= 0.0f; }
};

// A distribution over a subset of the vocabulary (tokens outside have 0).
struct SparseDist {
    std::vector<llama_token> ids;
    std::vector<float> probs;  // same length, sums to 1

    float prob_of(llama_token id) const;
};

// First index of the largest logit: llama.cpp's greedy sampler breaks ties the same way.
llama_token argmax_token(const float * logits, int32_t n_vocab);

class TargetSampler {
  public:
    TargetSampler(const SamplingParams & params, int32_t n_vocab);
    ~TargetSampler();
    TargetSampler(const TargetSampler &) = delete;
    TargetSampler & operator=(const TargetSampler &) = delete;

    const SamplingParams & params() const { return params_; }

    // p for one row of target logits (only for temperature > 0).
    void distribution(const float * logits, SparseDist & out);

    // Draws a token from a distribution with this sampler's seeded generator.
    llama_token draw(const SparseDist & dist);
    float uniform();

    std::mt19937_64 & rng() { return rng_; }

  private:
    SamplingParams params_;
    int32_t n_vocab_;
    llama_sampler * chain_ = nullptr;
    std::vector<llama_token_data> cur_;
    std::mt19937_64 rng_;
};

}  // namespace pdf2
