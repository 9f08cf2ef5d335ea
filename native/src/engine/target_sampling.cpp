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

// Eight floats (two SSE or NEON registers, one AVX register in the x86-64-v3 clone below).
typedef float Float8 __attribute__((vector_size(32)));
typedef int32_t Int8 __attribute__((vector_size(32)));

#if defined(__x86_64__) && defined(__linux__) && !defined(__clang__) && __GNUC__ >= 12
// The wheel targets baseline x86-64; CPUs with AVX2 and FMA (nearly all since 2013) run a clone
// built for them, chosen once at load time: 35 us a row of 49 K tokens instead of 85.
#define PDF2_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define PDF2_VECTOR_CLONES
#endif

// w[i] = e^(x[i] / t - m) for x = the logits and m = the largest x / t, and the sums of each
// block of weights. e^y for y <= 0 to about 1 ulp (8e-8 relative; Cephes' expf: y = n ln2 + r,
// |r| <= ln2 / 2, a degree-6 polynomial for e^r, 2^n into the exponent bits), 0 below -87.3 (under
// 2^-126) and for NaN. Written out in the loop: a helper taking 32-byte vectors would not be cloned.
PDF2_VECTOR_CLONES void temperature_weights(const float * logits, size_t n, float t, float * w, double * blocks,
                                            size_t block) {
    const float m = max_logit(logits, static_cast<int32_t>(n)) / t;  // x / t is monotone in x
    const Float8 lo = Float8{} - 87.3f;
    const Float8 round = Float8{} + 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to nearest
    for (size_t b0 = 0, k = 0; b0 < n; b0 += block, ++k) {
        const size_t b1 = std::min(n, b0 + block);
        Float8 acc{};
        size_t i = b0;
        for (; i < b1; i += 8) {
            Float8 y;
            if (i + 8 <= b1) {
                std::memcpy(&y, logits + i, sizeof y);
            } else {  // the vocabulary's tail: e^-inf = 0 past it
                y = Float8{} - INFINITY;
                std::memcpy(&y, logits + i, sizeof(float) * (b1 - i));
            }
            y = y / t - m;
            const Int8 live = y > lo;
            y = y > lo ? y : lo;
            const Float8 nf = (y * 1.44269504088896341f + round) - round;
            const Float8 r = y - nf * 0.693359375f - nf * -2.12194440e-4f;
            Float8 p = r * 1.9875691500e-4f + 1.3981999507e-3f;
            p = p * r + 8.3334519073e-3f;
            p = p * r + 4.1665795894e-2f;
            p = p * r + 1.6666665459e-1f;
            p = p * r + 5.0000001201e-1f;
            p = p * r * r + r + 1.0f;
            const Int8 bits = (__builtin_convertvector(nf, Int8) + 127) << 23;
            Float8 scale;
            std::memcpy(&scale, &bits, sizeof scale);
            const Float8 e = live ? p * scale : Float8{};
            if (i + 8 <= b1) {
                std::memcpy(w + i, &e, sizeof e);
            } else {
                std::memcpy(w + i, &e, sizeof(float) * (b1 - i));
            }
            acc += e;
        }
        double sum = 0.0;
        for (int j = 0; j < 8; ++j) sum += acc[j];
        blocks[k] = sum;
    }
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

#else  // compilers without GCC vector extensions (MSVC): the plain scans

namespace {

void temperature_weights(const float * logits, size_t n, float t, float * w, double * blocks, size_t block) {
    float m = -INFINITY;
    for (size_t i = 0; i < n; ++i) m = std::max(m, logits[i] / t);
    for (size_t b0 = 0, k = 0; b0 < n; b0 += block, ++k) {
        double sum = 0.0;
        for (size_t i = b0; i < std::min(n, b0 + block); ++i) {
            const float x = logits[i] / t - m;
            w[i] = x > -87.3f ? std::exp(x) : 0.0f;
            sum += w[i];
        }
        blocks[k] = sum;
    }
}

}  // namespace

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

void TargetSampler::law(const float * logits, TargetLaw & out) {
    if (temperature_only_) {
        temperature_law(logits, out);
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
    out.w.clear();
    for (size_t i = 0; i < arr.size; ++i) {
        if (arr.data[i].logit == -INFINITY) {
            continue;
        }
        out.ids.push_back(arr.data[i].id);
        out.w.push_back(std::exp(arr.data[i].logit - max_logit));
    }
    out.sum_blocks();
}

// The chain's law when it is the temperature alone: each logit divided by the temperature in float
// (llama.cpp's temperature sampler), then the softmax, in one vectorized pass over the logits
// instead of a copy of the vocabulary through the sampler chain (a token at -inf weighs 0).
void TargetSampler::temperature_law(const float * logits, TargetLaw & out) {
    const auto n = static_cast<size_t>(n_vocab_);
    out.ids.clear();
    out.w.resize(n);
    out.blocks.resize((n + TargetLaw::BLOCK - 1) / TargetLaw::BLOCK);
    temperature_weights(logits, n, params_.temperature, out.w.data(), out.blocks.data(), TargetLaw::BLOCK);
    out.total = out.blocks_total();
    if (!(out.total > 0.0)) {
        throw Error("the sampler chain leaves no token (the grammar or logit_bias masks every candidate)");
    }
}

double TargetLaw::block_sum(size_t k) const {
    double sum = 0.0;
    for (size_t i = k * BLOCK; i < std::min(w.size(), (k + 1) * BLOCK); ++i) sum += w[i];
    return sum;
}

double TargetLaw::blocks_total() const {
    double sum = 0.0;
    for (const double b : blocks) sum += b;
    return sum;
}

void TargetLaw::sum_blocks() {
    blocks.resize((w.size() + BLOCK - 1) / BLOCK);
    for (size_t k = 0; k < blocks.size(); ++k) blocks[k] = block_sum(k);
    total = blocks_total();
}

size_t TargetLaw::index_of(llama_token id) const {
    if (ids.empty()) return id >= 0 && static_cast<size_t>(id) < w.size() ? static_cast<size_t>(id) : w.size();
    return static_cast<size_t>(std::find(ids.begin(), ids.end(), id) - ids.begin());
}

float TargetLaw::prob_of(llama_token id) const {
    const size_t i = index_of(id);
    return i < w.size() ? static_cast<float>(w[i] / total) : 0.0f;
}

llama_token TargetLaw::draw(float u) const {
    const double target = static_cast<double>(u) * total;
    double acc = 0.0;
    size_t k = 0;
    while (k + 1 < blocks.size() && acc + blocks[k] <= target) acc += blocks[k++];
    const size_t end = std::min(w.size(), (k + 1) * BLOCK);
    size_t last = w.size();
    for (size_t i = k * BLOCK; i < end; ++i) {
        if (w[i] <= 0.0f) continue;
        acc += w[i];
        last = i;
        if (acc > target) return id_at(i);
    }
    // rounding left the target just above the sums: the last token with weight
    for (size_t i = last < w.size() ? last + 1 : w.size(); i-- > 0;) {
        if (w[i] > 0.0f) return id_at(i);
    }
    return id_at(0);
}

bool TargetLaw::subtract(const SparseDist & q) {
    // in p's units: w_i - q_i * total, floored at 0; only q's support changes
    std::vector<std::pair<size_t, float>> changed;  // (index, old weight): undone when nothing is left
    auto take = [&](size_t i, float qp) {
        const float left = std::max(0.0f, w[i] - static_cast<float>(qp * total));
        if (left == w[i]) return;
        changed.emplace_back(i, w[i]);
        w[i] = left;
    };
    if (ids.empty()) {
        for (size_t j = 0; j < q.ids.size(); ++j) {
            const size_t i = index_of(q.ids[j]);
            if (i < w.size()) take(i, q.probs[j]);
        }
    } else {
        std::vector<std::pair<llama_token, float>> qs;  // q by id, for a lookup per token of p
        for (size_t j = 0; j < q.ids.size(); ++j) qs.emplace_back(q.ids[j], q.probs[j]);
        std::sort(qs.begin(), qs.end());
        for (size_t i = 0; i < ids.size() && !qs.empty(); ++i) {
            const auto it = std::lower_bound(qs.begin(), qs.end(), std::make_pair(ids[i], -INFINITY));
            if (it != qs.end() && it->first == ids[i] && it->second > 0.0f) take(i, it->second);
        }
    }
    std::vector<std::pair<size_t, double>> touched;  // (block, old sum)
    for (const auto & c : changed) {
        const size_t k = c.first / BLOCK;
        if (std::none_of(touched.begin(), touched.end(), [k](const auto & t) { return t.first == k; })) {
            touched.emplace_back(k, blocks[k]);
        }
    }
    for (const auto & [k, old] : touched) blocks[k] = block_sum(k);
    const double left = blocks_total();
    if (!(left > 0.0)) {
        for (const auto & [i, old] : changed) w[i] = old;
        for (const auto & [k, old] : touched) blocks[k] = old;
        return false;
    }
    total = left;
    return true;
}

SamplerPtr TargetSampler::grammar_copy() const {
    return SamplerPtr(grammar_ != nullptr ? llama_sampler_clone(grammar_) : nullptr);
}

llama_token TargetSampler::sample(const float * logits) {
    if (params_.greedy()) {
        return greedy(logits);
    }
    law(logits, law_);
    return law_.draw(uniform());
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

}  // namespace pdf2
