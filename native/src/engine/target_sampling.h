// The target's sampler chain, exactly as plain llama-cpp-python decoding applies
// it, with llama.cpp's own samplers in llama-cpp-python's order: logit bias,
// penalties, grammar, then (temperature > 0) top-k, typical, top-p, min-p,
// temperature. Greedy takes the argmax after bias, penalties and grammar;
// sampling uses p = the softmax of what the whole chain leaves, and only the
// final draw differs: the verifier draws from p itself (rejection sampling),
// which is the same law. History-dependent samplers (penalties, grammar) see
// exactly the committed tokens: accept() each, in order, as verification walks
// the rows (a row is read only when every draft before it was accepted).
#pragma once

#include <llama.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace pdf2 {

constexpr int32_t MAX_LOGPROBS = 20;  // top alternatives per token (OpenAI's top_logprobs limit)

struct SamplingParams {
    float temperature = 0.0f;  // 0 = greedy
    int32_t top_k = 0;         // <= 0: off
    float top_p = 1.0f;        // 1: off
    float min_p = 0.0f;        // 0: off
    float typical_p = 1.0f;    // 1: off
    uint64_t seed = 0;
    std::vector<llama_logit_bias> logit_bias;  // added to the logits first
    float repeat_penalty = 1.0f;     // 1: off
    float frequency_penalty = 0.0f;  // 0: off
    float presence_penalty = 0.0f;   // 0: off
    int32_t repeat_last_n = 64;      // penalties look at this many last tokens (-1: the whole context)
    std::string grammar;             // GBNF (root rule "root"), "": none
    int32_t n_logprobs = -1;         // < 0: no logprobs; else top alternatives per committed token (0..20)

    bool greedy() const { return temperature <= 0.0f; }
    bool penalized() const {
        return repeat_last_n != 0 && (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
    }
};

struct SamplerFree {
    void operator()(llama_sampler * s) const { llama_sampler_free(s); }
};
using SamplerPtr = std::unique_ptr<llama_sampler, SamplerFree>;

// Whether a grammar sampler in its current state allows token next.
bool grammar_allows(llama_sampler * grammar, llama_token token);

// A committed token's log-probability under the target (the log-softmax of its raw
// logits, as llama-server's n_probs and llama-cpp-python's logprobs report them), and
// the top alternatives, most likely first.
struct TokenLogprob {
    float logprob = 0.0f;
    std::vector<llama_token> top_ids;
    std::vector<float> top_logprobs;
};
void token_logprob(const float * logits, int32_t n_vocab, llama_token token, int32_t n_top, TokenLogprob & out);

// A distribution over a subset of the vocabulary (tokens outside have 0).
struct SparseDist {
    std::vector<llama_token> ids;
    std::vector<float> probs;  // same length, sums to 1

    float prob_of(llama_token id) const;
};

// The target's law p at one row after its whole sampler chain: weights w over ids (p_i = w_i /
// total), ids empty meaning every token with id = index (the chain was the temperature alone).
// Blocks of weights keep their sums, so a draw walks blocks before tokens and a residual changes
// only the blocks it touches: a row costs one pass over the vocabulary, not three.
class TargetLaw {
  public:
    float prob_of(llama_token id) const;
    // The token whose cumulative weight first exceeds u * total (u in [0, 1)).
    llama_token draw(float u) const;
    // In place: normalize(max(0, p - q)), q zero outside its support (a rejected draft's correction
    // law). False, leaving p, when nothing would be left, which only rounding makes.
    bool subtract(const SparseDist & q);

  private:
    friend class TargetSampler;
    static constexpr size_t BLOCK = 64;
    void sum_blocks();                      // blocks and total from w
    double block_sum(size_t k) const;       // the weights of block k, summed
    double blocks_total() const;            // the blocks' sums, summed
    size_t index_of(llama_token id) const;  // its place in w, or w.size()
    llama_token id_at(size_t i) const { return ids.empty() ? static_cast<llama_token>(i) : ids[i]; }

    std::vector<llama_token> ids;
    std::vector<float> w;
    std::vector<double> blocks;
    double total = 0.0;
};

// First index of the largest logit: llama.cpp's greedy sampler breaks ties the same way.
llama_token argmax_token(const float * logits, int32_t n_vocab);

class TargetSampler {
  public:
    // Validates every parameter before llama.cpp sees it (a bad grammar is an Error).
    // n_ctx: the sequence's context (repeat_last_n -1, and the largest window).
    TargetSampler(const SamplingParams & params, const llama_vocab * vocab, int32_t n_ctx);
    ~TargetSampler();
    TargetSampler(const TargetSampler &) = delete;
    TargetSampler & operator=(const TargetSampler &) = delete;

    const SamplingParams & params() const { return params_; }
    // what it was made for: the target's vocabulary and the sequence's context
    const llama_vocab * vocab() const { return vocab_; }
    int32_t n_ctx() const { return n_ctx_; }

    // Greedy: the token plain greedy decoding picks from this row of target logits
    // (the argmax after logit bias, penalties and grammar).
    llama_token greedy(const float * logits);
    // p for one row of target logits (only for temperature > 0), after the whole chain.
    void law(const float * logits, TargetLaw & out);
    // The target's own choice at this row: greedy(), or a draw from law(). The one
    // place the two modes part (verify.h's rules all choose through it).
    llama_token sample(const float * logits);
    // A token is committed: the history-dependent samplers take it.
    void accept(llama_token token);
    // A copy of the grammar in its current state (to try drafts on), null without one.
    SamplerPtr grammar_copy() const;

    float uniform();  // this sampler's seeded generator

    std::mt19937_64 & rng() { return rng_; }

  private:
    void free_samplers();
    void shape(const float * logits);  // cur_ = the logits after bias and penalties (id order kept)
    void temperature_law(const float * logits, TargetLaw & out);

    SamplingParams params_;
    const llama_vocab * vocab_;
    int32_t n_ctx_;
    int32_t n_vocab_;
    llama_sampler * shaping_ = nullptr;  // logit bias, penalties (null: neither)
    llama_sampler * grammar_ = nullptr;
    llama_sampler * tail_ = nullptr;     // top-k .. temperature (temperature > 0)
    // the chain is the temperature alone (no bias, penalties, grammar or truncation): law() then
    // scales the raw logits as llama.cpp's temperature sampler does, without the copy through it
    bool temperature_only_ = false;
    std::vector<llama_token_data> cur_;
    TargetLaw law_;  // sample()'s
    std::mt19937_64 rng_;
};

}  // namespace pdf2
