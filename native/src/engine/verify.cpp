#include "engine/verify.h"

#include <algorithm>

namespace pdf2 {

VerifyResult verify_greedy(const std::vector<llama_token> & drafts, const LogitRows & row, TargetSampler & sampler) {
    VerifyResult r;
    for (size_t j = 0; j < drafts.size(); ++j) {
        const llama_token want = sampler.greedy(row(static_cast<int>(j)));
        sampler.accept(want);
        if (want != drafts[j]) {
            r.next = want;
            return r;
        }
        ++r.n_accepted;
    }
    r.next = sampler.greedy(row(static_cast<int>(drafts.size())));
    sampler.accept(r.next);
    return r;
}

VerifyResult verify_stochastic(const std::vector<llama_token> & drafts, const std::vector<SparseDist> & q,
                               const LogitRows & row, TargetSampler & sampler) {
    VerifyResult r;
    SparseDist p;
    for (size_t j = 0; j < drafts.size(); ++j) {
        sampler.distribution(row(static_cast<int>(j)), p);
        const float pd = p.prob_of(drafts[j]);
        const float qd = q[j].prob_of(drafts[j]);
        if (qd > 0.0f && sampler.uniform() * qd < pd) {  // accept with probability min(1, p/q)
            sampler.accept(drafts[j]);
            ++r.n_accepted;
            continue;
        }
        // rejected: draw from normalize(max(0, p - q)); q is zero outside its support
        SparseDist residual;
        double total = 0.0;
        for (size_t i = 0; i < p.ids.size(); ++i) {
            const float d = std::max(0.0f, p.probs[i] - q[j].prob_of(p.ids[i]));
            if (d > 0.0f) {
                residual.ids.push_back(p.ids[i]);
                residual.probs.push_back(d);
                total += d;
            }
        }
        if (total <= 0.0) {
            r.next = sampler.draw(p);  // p <= q everywhere only through rounding: p is the law then
        } else {
            for (float & v : residual.probs) {
                v = static_cast<float>(v / total);
            }
            r.next = sampler.draw(residual);
        }
        sampler.accept(r.next);
        return r;
    }
    sampler.distribution(row(static_cast<int>(drafts.size())), p);
    r.next = sampler.draw(p);
    sampler.accept(r.next);
    return r;
}

}  // namespace pdf2
