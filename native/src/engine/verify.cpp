#include "engine/verify.h"

#include "engine/mutation.h"

#include <algorithm>

namespace pdf2 {

namespace {

// A rejected draft: the correction drawn from normalize(max(0, p - q)); q is zero outside its
// support. Where p <= q everywhere (only rounding does that), p is the law.
llama_token draw_residual(TargetLaw & p, const SparseDist & q, TargetSampler & sampler) {
    p.subtract(q);
    return p.draw(sampler.uniform());
}

// Whether draft j is kept; when not, *next is the correction.
bool accept_draft(llama_token draft, const SparseDist & q, const float * logits, TargetSampler & sampler,
                  TargetLaw & p, llama_token * next) {
    if (sampler.params().greedy()) {
        const llama_token want = sampler.sample(logits);
        *next = want;
        return want == draft;
    }
    sampler.law(logits, p);
    const float pd = active_mutation() == Mutation::QForP ? q.prob_of(draft) : p.prob_of(draft);
    const float qd = q.prob_of(draft);
    if (qd > 0.0f && sampler.uniform() * qd < pd) {  // accept with probability min(1, p/q)
        return true;
    }
    *next = draw_residual(p, q, sampler);
    return false;
}

}  // namespace

VerifyResult verify_chain(const std::vector<llama_token> & drafts, const std::vector<SparseDist> & q,
                          const LogitRows & row, TargetSampler & sampler) {
    static const SparseDist none;  // a greedy verify reads no draft law
    VerifyResult r;
    TargetLaw p;
    for (size_t j = 0; j < drafts.size(); ++j) {
        llama_token next = -1;
        const bool kept = accept_draft(drafts[j], j < q.size() ? q[j] : none, row(static_cast<int>(j)), sampler, p,
                                       &next);
        if (!kept && active_mutation() == Mutation::AcceptExtraDraft && j + 1 < drafts.size()) {
            sampler.accept(drafts[j]);  // the defect: a rejected draft kept
            ++r.n_accepted;
            continue;
        }
        if (!kept) {
            sampler.accept(next);
            r.next = next;
            return r;
        }
        sampler.accept(drafts[j]);
        ++r.n_accepted;
    }
    r.next = sampler.sample(row(static_cast<int>(drafts.size())));
    sampler.accept(r.next);
    return r;
}

VerifyResult verify_tree(const DraftTree & tree, const LogitRows & node_row, TargetSampler & sampler,
                         const std::function<void(const float *, llama_token)> & committed) {
    VerifyResult r;
    const int n = tree.size();
    r.path.reserve(static_cast<size_t>(n));
    int node = -1;
    for (;;) {
        const float * logits = node_row(node);
        const llama_token x = sampler.sample(logits);
        sampler.accept(x);
        committed(logits, x);
        int child = -1;
        for (int v = node + 1; v < n; ++v) {  // children come after their parent
            if (tree.parent[static_cast<size_t>(v)] == node && tree.token[static_cast<size_t>(v)] == x) {
                child = v;
                break;
            }
        }
        if (child >= 0 && active_mutation() == Mutation::WrongTreeBranch) {
            for (int v = node + 1; v < n; ++v) {  // the defect: a sibling of the target's choice
                if (v != child && tree.parent[static_cast<size_t>(v)] == node) {
                    child = v;
                    break;
                }
            }
        }
        if (child < 0) {
            r.next = x;
            break;
        }
        r.path.push_back(child);
        node = child;
    }
    r.n_accepted = static_cast<int>(r.path.size());
    return r;
}

llama_token first_token(const float * logits, TargetSampler & sampler) {
    const llama_token first = sampler.sample(logits);
    sampler.accept(first);
    return first;
}

}  // namespace pdf2
