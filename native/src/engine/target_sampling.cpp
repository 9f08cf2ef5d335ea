#include "engine/target_sampling.h"

#include "common/errors.h"

#include <algorithm>
#include <cmath>

namespace pdf2 {

float SparseDist::prob_of(llama_token id) const {
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] == id) {
            return probs[i];
        }
    }
    return 0.0f;
}

llama_token argmax_token(const float * logits, int32_t n_vocab) {
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) {
        if (logits[i] > logits[best]) {
            best = i;
        }
    }
    return best;
}

TargetSampler::TargetSampler(const SamplingParams & params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {
    if (!(params.temperature >= 0.0f) || !std::isfinite(params.temperature)) {
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
    if (params.greedy()) {
        return;
    }
    chain_ = llama_sampler_chain_init(llama_sampler_chain_default_params());
    const size_t min_keep = 1;
    llama_sampler_chain_add(chain_, llama_sampler_init_top_k(params.top_k));
    llama_sampler_chain_add(chain_, llama_sampler_init_typical(params.typical_p, min_keep));
    llama_sampler_chain_add(chain_, llama_sampler_init_top_p(params.top_p, min_keep));
    llama_sampler_chain_add(chain_, llama_sampler_init_min_p(params.min_p, min_keep));
    llama_sampler_chain_add(chain_, llama_sampler_init_temp(params.temperature));
    cur_.resize(static_cast<size_t>(n_vocab));
}

TargetSampler::~TargetSampler() {
    if (chain_ != nullptr) {
        llama_sampler_free(chain_);
    }
}

void TargetSampler::distribution(const float * logits, SparseDist & out) {
    for (int32_t i = 0; i < n_vocab_; ++i) {
        cur_[static_cast<size_t>(i)] = llama_token_data{i, logits[i], 0.0f};
    }
    llama_token_data_array arr{cur_.data(), cur_.size(), -1, false};
    llama_sampler_apply(chain_, &arr);

    float max_logit = -INFINITY;
    for (size_t i = 0; i < arr.size; ++i) {
        max_logit = std::max(max_logit, arr.data[i].logit);
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
