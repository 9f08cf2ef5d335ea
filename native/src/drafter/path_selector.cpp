#include "drafter/path_selector.h"

#include "common/errors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>

namespace pdf2 {

namespace {

int argmax(const float * x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

// softmax(x / T) into q; returns a sampled index
int sample_softmax(const float * x, int n, float temperature, std::mt19937_64 & rng, float * q) {
    const float mx = *std::max_element(x, x + n);
    double sum = 0.0;
    for (int j = 0; j < n; ++j) {
        const double e = std::isfinite(x[j]) ? std::exp(static_cast<double>(x[j] - mx) / temperature) : 0.0;
        q[j] = static_cast<float>(e);
        sum += e;
    }
    for (int j = 0; j < n; ++j) q[j] = static_cast<float>(q[j] / sum);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    double r = u(rng);
    for (int j = 0; j < n; ++j) {
        r -= q[j];
        if (r < 0.0) return j;
    }
    for (int j = n - 1; j >= 0; --j) {  // rounding: last index with mass
        if (q[j] > 0.0f) return j;
    }
    return 0;
}

void check_temperature(SelectorMode mode, float temperature) {
    if (mode == SelectorMode::Sample && !(temperature > 0.0f && std::isfinite(temperature))) {
        throw Error("the sample selector needs a temperature > 0, got " + std::to_string(temperature));
    }
}

}  // namespace

void check_selector_options(int selector, int q_top_k) {
    if (selector < -1 || selector > static_cast<int>(SelectorMode::Viterbi)) {
        throw Error("selector must be -1 (auto), 0 (greedy), 1 (sample) or 2 (viterbi)");
    }
    if (q_top_k < 1) {
        throw Error("q_top_k must be >= 1");
    }
}

DraftPath select_lattice_path(const Lattice & lat, SelectorMode mode, float temperature, uint64_t seed) {
    check_temperature(mode, temperature);
    const int P = lat.n_pos;
    const int k = lat.k;
    DraftPath res;
    res.k = k;
    res.tokens.resize(P);
    res.q_ids.assign(lat.cand.begin(), lat.cand.end());
    res.q.assign(static_cast<size_t>(P) * k, 0.0f);
    if (P == 0) return res;

    std::vector<int> choice(P);
    if (mode == SelectorMode::Viterbi) {
        // best[c]: best total score of a path ending in candidate c at position i
        std::vector<double> best(k), next(k);
        std::vector<int> back(static_cast<size_t>(P) * k, 0);
        const float * r0 = lat.row(0, 0);
        for (int c = 0; c < k; ++c) best[c] = r0[c];
        for (int i = 1; i < P; ++i) {
            for (int c = 0; c < k; ++c) {
                double bv = -std::numeric_limits<double>::infinity();
                int bp = 0;
                for (int p = 0; p < k; ++p) {
                    const double v = best[p] + lat.row(i, p)[c];
                    if (v > bv) {
                        bv = v;
                        bp = p;
                    }
                }
                next[c] = bv;
                back[static_cast<size_t>(i) * k + c] = bp;
            }
            best.swap(next);
        }
        int c = static_cast<int>(std::max_element(best.begin(), best.end()) - best.begin());
        for (int i = P - 1; i >= 0; --i) {
            choice[i] = c;
            c = back[static_cast<size_t>(i) * k + c];
        }
    } else {
        std::mt19937_64 rng(seed);
        int prev = 0;  // position 0: every predecessor row is the anchor's
        for (int i = 0; i < P; ++i) {
            const float * row = lat.row(i, prev);
            float * q = res.q.data() + static_cast<size_t>(i) * k;
            prev = mode == SelectorMode::Sample ? sample_softmax(row, k, temperature, rng, q) : argmax(row, k);
            choice[i] = prev;
        }
    }
    for (int i = 0; i < P; ++i) {
        res.tokens[i] = lat.cand[static_cast<size_t>(i) * k + choice[i]];
        if (mode != SelectorMode::Sample) res.q[static_cast<size_t>(i) * k + choice[i]] = 1.0f;
    }
    return res;
}

DraftPath select_logits_path(const float * logits, int n_pos, int n_vocab, SelectorMode mode, float temperature,
                             uint64_t seed, int top_k) {
    check_temperature(mode, temperature);
    if (top_k < 1 || top_k > n_vocab) {
        throw Error("top_k must be in [1, " + std::to_string(n_vocab) + "], got " + std::to_string(top_k));
    }
    DraftPath res;
    res.k = top_k;
    res.tokens.resize(n_pos);
    res.q_ids.resize(static_cast<size_t>(n_pos) * top_k);
    res.q.assign(static_cast<size_t>(n_pos) * top_k, 0.0f);
    std::mt19937_64 rng(seed);
    std::vector<int32_t> idx(n_vocab);
    std::vector<float> vals(top_k);
    for (int i = 0; i < n_pos; ++i) {
        const float * l = logits + static_cast<size_t>(i) * n_vocab;
        std::iota(idx.begin(), idx.end(), 0);
        std::partial_sort(idx.begin(), idx.begin() + top_k, idx.end(), [&](int32_t a, int32_t b) {
            return l[a] > l[b] || (l[a] == l[b] && a < b);
        });
        int32_t * ids = res.q_ids.data() + static_cast<size_t>(i) * top_k;
        float * q = res.q.data() + static_cast<size_t>(i) * top_k;
        for (int j = 0; j < top_k; ++j) {
            ids[j] = idx[j];
            vals[j] = l[idx[j]];
        }
        int j = 0;  // greedy / viterbi (positions are independent): the argmax
        if (mode == SelectorMode::Sample) {
            j = sample_softmax(vals.data(), top_k, temperature, rng, q);
        } else {
            q[0] = 1.0f;
        }
        res.tokens[i] = ids[j];
    }
    return res;
}

}  // namespace pdf2
