#include "engine/target_sampling.h"

#include "engine/mutation.h"

#include "common/errors.h"
#include "engine/grammar_shape.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pdf2 {

float SparseDist::prob_of(llama_token id) const {
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == id) {
            return probs[i];
        }
    }
    return 0.0f;
}

#if defined(__GNUC__) || defined(__clang__)
namespace {

// Four floats in one SIMD register (GCC/Clang vector extension: SSE on x86, NEON on ARM).
// A scan of 49 K logits per verified row costs ~45 us scalar, ~20 us in vectors.
typedef float Float4 __attribute__((vector_size(16)));

Float4 load4(const float * p) {
    Float4 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

// The largest value (NaN never wins: x > NaN and NaN > x are both false).
float max_logit(const float * logits, int32_t n) {
    const Float4 ninf = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    Float4 a = ninf, b = ninf, c = ninf, d = ninf;  // four chains: the loads overlap
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const Float4 x0 = load4(logits + i), x1 = load4(logits + i + 4);
        const Float4 x2 = load4(logits + i + 8), x3 = load4(logits + i + 12);
        a = x0 > a ? x0 : a;
        b = x1 > b ? x1 : b;
        c = x2 > c ? x2 : c;
        d = x3 > d ? x3 : d;
    }
    a = b > a ? b : a;
    c = d > c ? d : c;
    a = c > a ? c : a;
    float m = -INFINITY;
    for (int k = 0; k < 4; ++k) {
        m = a[k] > m ? a[k] : m;
    }
    for (; i < n; ++i) {
        m = logits[i] > m ? logits[i] : m;
    }
    return m;
}

}  // namespace

llama_token argmax_token(const float * logits, int32_t n_vocab) {
    const float m = max_logit(logits, n_vocab);
    const Float4 mm = {m, m, m, m};
    int32_t i = 0;
    for (; i + 8 <= n_vocab; i += 8) {  // skip whole blocks that do not hold the maximum
        const auto hit = (load4(logits + i) == mm) | (load4(logits + i + 4) == mm);
        if (hit[0] | hit[1] | hit[2] | hit[3]) {
            break;
        }
    }
    for (; i < n_vocab; ++i) {
        if (logits[i] == m) {
            return i;  // the first index of the maximum
        }
    }
    return 0;  // every logit NaN
}

#else  // compilers without GCC vector extensions (MSVC): the plain scan

llama_token argmax_token(const float * logits, int32_t n_vocab) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

#endif

namespace {

bool finite(float x) { return std::isfinite(x); }

}  // namespace

// The grammar's verdict on one token (the sampler masks a disallowed token to -inf).
bool grammar_allows(llama_sampler * grammar, llama_token token) {
    llama_token_data one{token, 0.0f, 0.0f};
    llama_token_data_array arr{&one, 1, -1, false};
    llama_sampler_apply(grammar, &arr);
    return one.logit != -INFINITY;
}

TargetSampler::TargetSampler(const SamplingParams & params, const llama_vocab * vocab, int32_t n_ctx)
    : params_(params), vocab_(vocab), n_ctx_(n_ctx), n_vocab_(llama_vocab_n_tokens(vocab)), rng_(params.seed) {
    if (!(params.temperature >= 0.0f) || !finite(params.temperature)) {
        throw Error("temperature must be a finite number >= 0");
    }
    if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
        throw Error("top_p must be in (0, 1]");
    }
    if (!(params.min_p >= 0.0f && params.min_p <= 1.0f)) {
        throw Error("min_p must be in [0, 1]");
    }
    if (!(params.typical_p > 0.0f && params.typical_p <= 1.0f)) {
        throw Error("typical_p must be in (0, 1]");
    }
    if (!(params.repeat_penalty > 0.0f) || !finite(params.repeat_penalty)) {
        throw Error("repeat_penalty must be a finite number > 0 (1: off)");
    }
    if (!finite(params.frequency_penalty) || !finite(params.presence_penalty)) {
        throw Error("frequency_penalty and presence_penalty must be finite numbers (0: off)");
    }
    if (params.repeat_last_n < -1) {
        throw Error("repeat_last_n must be >= 0, or -1 for the whole context");
    }
    if (params.n_logprobs < -1 || params.n_logprobs > MAX_LOGPROBS) {
        throw Error("logprobs (top alternatives) must be in 0.." + std::to_string(MAX_LOGPROBS));
    }
    for (const llama_logit_bias & b : params.logit_bias) {
        if (b.token < 0 || b.token >= n_vocab_) {
            throw Error("logit_bias: token id " + std::to_string(b.token) + " is outside the vocabulary (0.." +
                        std::to_string(n_vocab_ - 1) + ")");
        }
        if (std::isnan(b.bias) || b.bias == INFINITY) {
            throw Error("logit_bias: the bias of token " + std::to_string(b.token) +
                        " must be a finite number (or -inf: never)");
        }
    }
    if (params_.repeat_last_n == -1 || params_.repeat_last_n > n_ctx) {
        params_.repeat_last_n = n_ctx;  // a window longer than the context is the context
    }
    cur_.resize(static_cast<size_t>(n_vocab_));
    struct FreeOnThrow {  // the samplers made so far, when a later one fails
        TargetSampler & s;
        bool done = false;
        ~FreeOnThrow() {
            if (!done) s.free_samplers();
        }
    } guard{*this};
    if (!params_.logit_bias.empty() || params_.penalized()) {
        shaping_ = llama_sampler_chain_init(llama_sampler_chain_default_params());
        if (!params_.logit_bias.empty()) {
            llama_sampler_chain_add(shaping_, llama_sampler_init_logit_bias(
                n_vocab_, static_cast<int32_t>(params_.logit_bias.size()), params_.logit_bias.data()));
        }
        if (params_.penalized() && active_mutation() != Mutation::SkipPenalties) {
            llama_sampler_chain_add(shaping_, llama_sampler_init_penalties(
                n_vocab_, params_.repeat_last_n, params_.repeat_penalty, params_.frequency_penalty,
                params_.presence_penalty));
        }
    }
    if (!params_.grammar.empty() && active_mutation() != Mutation::SkipGrammar) {
        if (params_.grammar.find('\0') != std::string::npos) {
            throw Error("grammar: the GBNF text holds a NUL character");
        }
        grammar_ = init_grammar_sampler(vocab, params_.grammar.c_str());  // bounded, on a big stack
    }
    if (!params_.greedy()) {
        tail_ = llama_sampler_chain_init(llama_sampler_chain_default_params());
        const size_t min_keep = 1;
        llama_sampler_chain_add(tail_, llama_sampler_init_top_k(params_.top_k));
        llama_sampler_chain_add(tail_, llama_sampler_init_typical(params_.typical_p, min_keep));
        llama_sampler_chain_add(tail_, llama_sampler_init_top_p(params_.top_p, min_keep));
        llama_sampler_chain_add(tail_, llama_sampler_init_min_p(params_.min_p, min_keep));
        llama_sampler_chain_add(tail_, llama_sampler_init_temp(params_.temperature));
        // top-k <= 0, typical and top-p >= 1, min-p <= 0: llama.cpp's samplers return at once
        temperature_only_ = shaping_ == nullptr && grammar_ == nullptr && params_.top_k <= 0 &&
                            params_.typical_p >= 1.0f && params_.top_p >= 1.0f && params_.min_p <= 0.0f;
    }
    guard.done = true;
}

TargetSampler::~TargetSampler() { free_samplers(); }

void TargetSampler::free_samplers() {
    for (llama_sampler ** s : {&shaping_, &grammar_, &tail_}) {
        if (*s != nullptr) {
            llama_sampler_free(*s);
            *s = nullptr;
        }
    }
}

void TargetSampler::shape(const float * logits) {
    for (int32_t i = 0; i < n_vocab_; ++i) {
        cur_[static_cast<size_t>(i)] = llama_token_data{i, logits[i], 0.0f};
    }
    if (shaping_ != nullptr) {
        llama_token_data_array arr{cur_.data(), cur_.size(), -1, false};
        llama_sampler_apply(shaping_, &arr);  // in place, id order kept
    }
}

llama_token TargetSampler::greedy(const float * logits) {
    if (shaping_ == nullptr && grammar_ == nullptr) {
        return argmax_token(logits, n_vocab_);  // nothing shapes the logits: the fast scan
    }
    // the first index of the maximum, as llama.cpp's greedy sampler picks it
    auto argmax_cur = [this] {
        llama_token pick = -1;
        float top = -INFINITY;
        for (const llama_token_data & d : cur_) {
            if (d.logit > top) {
                top = d.logit;
                pick = d.id;
            }
        }
        return pick;
    };
    llama_token best;
    if (shaping_ != nullptr) {
        shape(logits);
        best = argmax_cur();
    } else {
        best = argmax_token(logits, n_vocab_);
    }
    // the grammar only masks tokens: when it allows the unmasked argmax, that is the masked one
    // (llama.cpp's common sampler checks the same way before it masks the whole vocabulary)
    if (best >= 0 && (grammar_ == nullptr || grammar_allows(grammar_, best))) {
        return best;
    }
    if (grammar_ != nullptr) {
        if (shaping_ == nullptr) {
            shape(logits);
        }
        llama_token_data_array arr{cur_.data(), cur_.size(), -1, false};
        llama_sampler_apply(grammar_, &arr);
        best = argmax_cur();
    }
    if (best < 0) {
        throw Error("the sampler chain leaves no token (the grammar or logit_bias masks every candidate)");
    }
    return best;
}

void TargetSampler::distribution(const float * logits, SparseDist & out) {
    if (temperature_only_) {
        temperature_distribution(logits, out);
        return;
    }
    shape(logits);
    llama_token_data_array arr{cur_.data(), cur_.size(), -1, false};
    if (grammar_ != nullptr) {
        llama_sampler_apply(grammar_, &arr);
    }
    llama_sampler_apply(tail_, &arr);

    float max_logit = -INFINITY;
    for (size_t i = 0; i < arr.size; ++i) {
        max_logit = std::max(max_logit, arr.data[i].logit);
    }
    if (max_logit == -INFINITY) {
        throw Error("the sampler chain leaves no token (the grammar or logit_bias masks every candidate)");
    }
    out.ids.clear();
    out.probs.clear();
    double sum = 0.0;
    for (size_t i = 0; i < arr.size; ++i) {
        if (arr.data[i].logit == -INFINITY) {
            continue;
        }
        const double e = std::exp(static_cast<double>(arr.data[i].logit) - max_logit);
        out.ids.push_back(arr.data[i].id);
        out.probs.push_back(static_cast<float>(e));
        sum += e;
    }
    for (float & p : out.probs) {
        p = static_cast<float>(p / sum);
    }
}

// The chain's law when it is the temperature alone: each logit divided by the temperature in float
// (llama.cpp's temperature sampler), then the softmax as distribution() computes it, in one pass
// over the logits instead of a copy of the vocabulary through the sampler chain.
void TargetSampler::temperature_distribution(const float * logits, SparseDist & out) {
    const float t = params_.temperature;
    const auto n = static_cast<size_t>(n_vocab_);
    out.ids.resize(n);
    out.probs.resize(n);
    float max_logit = -INFINITY;
    size_t k = 0;
    for (size_t i = 0; i < n; ++i) {
        const float l = logits[i] / t;
        if (l == -INFINITY) continue;  // as the chain's: a token it rules out is not in the law
        out.ids[k] = static_cast<llama_token>(i);
        out.probs[k++] = l;
        max_logit = std::max(max_logit, l);
    }
    out.ids.resize(k);
    out.probs.resize(k);
    if (k == 0) {
        throw Error("the sampler chain leaves no token (the grammar or logit_bias masks every candidate)");
    }
    double sum = 0.0;
    for (float & p : out.probs) {
        const double e = std::exp(static_cast<double>(p) - max_logit);
        p = static_cast<float>(e);
        sum += e;
    }
    for (float & p : out.probs) p = static_cast<float>(p / sum);
}

SamplerPtr TargetSampler::grammar_copy() const {
    return SamplerPtr(grammar_ != nullptr ? llama_sampler_clone(grammar_) : nullptr);
}

llama_token TargetSampler::sample(const float * logits) {
    if (params_.greedy()) {
        return greedy(logits);
    }
    distribution(logits, dist_);
    return draw(dist_);
}

void TargetSampler::accept(llama_token token) {
    if (shaping_ != nullptr) {
        llama_sampler_accept(shaping_, token);
    }
    if (grammar_ != nullptr) {
        // llama.cpp aborts the process on an end-of-generation token its grammar does not allow
        if (!grammar_allows(grammar_, token)) {
            throw Error("token " + std::to_string(token) + " is not allowed by the grammar here");
        }
        llama_sampler_accept(grammar_, token);
    }
}

void token_logprob(const float * logits, int32_t n_vocab, llama_token token, int32_t n_top, TokenLogprob & out) {
    double max_logit = -INFINITY;
    for (int32_t i = 0; i < n_vocab; ++i) {
        max_logit = std::max(max_logit, static_cast<double>(logits[i]));
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        sum += std::exp(static_cast<double>(logits[i]) - max_logit);
    }
    const double log_z = max_logit + std::log(sum);
    out.logprob = static_cast<float>(static_cast<double>(logits[token]) - log_z);
    out.top_ids.clear();
    out.top_logprobs.clear();
    if (n_top <= 0) {
        return;
    }
    // most likely first; equal logits: the higher id first (llama-cpp-python sorts (logprob, id) descending)
    std::vector<llama_token> ids(static_cast<size_t>(n_vocab));
    for (int32_t i = 0; i < n_vocab; ++i) ids[static_cast<size_t>(i)] = i;
    const size_t k = std::min<size_t>(static_cast<size_t>(n_top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(),
                      [logits](llama_token a, llama_token b) {
                          return logits[a] != logits[b] ? logits[a] > logits[b] : a > b;
                      });
    for (size_t i = 0; i < k; ++i) {
        out.top_ids.push_back(ids[i]);
        out.top_logprobs.push_back(static_cast<float>(static_cast<double>(logits[ids[i]]) - log_z));
    }
}

float TargetSampler::uniform() { return std::uniform_real_distribution<float>(0.0f, 1.0f)(rng_); }

llama_token TargetSampler::draw(const SparseDist & dist) {
    const float u = uniform();
    float acc = 0.0f;
    for (size_t i = 0; i < dist.ids.size(); ++i) {
        acc += dist.probs[i];
        if (u < acc) {
            return dist.ids[i];
        }
    }
    return dist.ids.back();  // rounding left u just above the total
}

}  // namespace pdf2
