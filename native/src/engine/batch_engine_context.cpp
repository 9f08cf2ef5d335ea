// The engine's side of context drafts (context_draft_source.h): each slot's mode and key, the
// global cache's bounds, and what each verified tree's sources drafted and got accepted.
#include "engine/batch_engine.h"

#include "common/errors.h"

#include <algorithm>
#include <memory>
#include <string>

namespace pdf2 {

namespace {
// The global context cache's default bounds: its index takes about 300 bytes a token (n-grams of
// 1..12 tokens), so at most 16 keys x 128K tokens, about 600 MB, however many keys call.
constexpr size_t CONTEXT_CACHE_KEYS = 16;
constexpr int CONTEXT_CACHE_DOCUMENTS = 256;
constexpr size_t CONTEXT_CACHE_TOKENS = size_t{1} << 17;
}  // namespace

void BatchEngine::init_context() {
    for (Slot & s : slots_) s.drafting.context = std::make_unique<ContextDraftSource>(context_acceptance_);
    set_context_cache_limits(CONTEXT_CACHE_KEYS, CONTEXT_CACHE_DOCUMENTS, CONTEXT_CACHE_TOKENS);
}

// A request starts: its context source reads its prompt (and its key's past outputs, in global mode).
void BatchEngine::start_context(Slot & s, const std::vector<llama_token> & prompt) {
    if (s.drafting.context == nullptr) return;
    if (s.context_mode == ContextDrafts::Off) {
        s.drafting.context->finish();
        return;
    }
    s.drafting.context->start(prompt, s.context_mode == ContextDrafts::Global ? &context_caches_ : nullptr,
                              s.context_key);
}

void BatchEngine::set_context_cache_limits(size_t max_keys, int max_documents, size_t max_tokens) {
    if (max_keys < 1 || max_documents < 1 || max_tokens < 1) {
        throw Error("context cache limits must be >= 1");
    }
    ContextCacheOptions o = context_caches_.options();
    o.max_documents = max_documents;
    o.max_tokens = max_tokens;
    context_caches_ = ContextCaches(o, max_keys);  // slots look their key up at each use
}

void BatchEngine::set_context_drafts(int slot, ContextDrafts mode, const std::string & key) {
    Slot & s = slot_at(slot);
    if (mode != ContextDrafts::Off && opts_.context_nodes == 0) {
        throw Error("context drafts are off in this engine (it was made without context_nodes)");
    }
    s.context_mode = mode;
    s.context_key = key;
}

// A verified tree's nodes by source: the counters, and each source's calibration learns which of
// its estimates the target accepted.
void BatchEngine::record_sources(Slot & s, const std::vector<int32_t> & path) {
    const DraftBlock & b = s.rows.block;
    const int n = b.tree.size();
    std::vector<char> accepted(static_cast<size_t>(n), 0);
    for (const int32_t v : path) accepted[static_cast<size_t>(v)] = 1;
    SlotStats & st = s.request.stats;
    if (!b.has_context_nodes()) {
        lattice_calibration_.observe(b.tree.logp, accepted);
        stats_.n_lattice_nodes += n;
        stats_.n_lattice_accepted += static_cast<int64_t>(path.size());
        st.n_lattice_nodes += n;
        st.n_lattice_accepted += static_cast<int64_t>(path.size());
        return;
    }
    std::vector<double> lat_logp, ctx_logp;
    std::vector<char> lat_hit, ctx_hit;
    for (int v = 0; v < n; ++v) {
        const auto i = static_cast<size_t>(v);
        if (b.origin[i] & kFromLattice) {
            lat_logp.push_back(b.lattice_logp[i]);
            lat_hit.push_back(accepted[i]);
        }
        if (b.origin[i] & kFromContext) {
            ctx_logp.push_back(b.context_logp[i]);
            ctx_hit.push_back(accepted[i]);
            if (accepted[i]) stats_.context_accepted_per_pos[static_cast<size_t>(b.tree.depth[i] - 1)] += 1;
        }
    }
    const auto hits = [](const std::vector<char> & h) { return static_cast<int64_t>(std::count(h.begin(), h.end(), 1)); };
    if (!lat_logp.empty()) lattice_calibration_.observe(lat_logp, lat_hit);
    stats_.n_lattice_nodes += static_cast<int64_t>(lat_logp.size());
    stats_.n_lattice_accepted += hits(lat_hit);
    stats_.n_context_nodes += static_cast<int64_t>(ctx_logp.size());
    stats_.n_context_accepted += hits(ctx_hit);
    st.n_lattice_nodes += static_cast<int64_t>(lat_logp.size());
    st.n_lattice_accepted += hits(lat_hit);
    st.n_context_nodes += static_cast<int64_t>(ctx_logp.size());
    st.n_context_accepted += hits(ctx_hit);
}

}  // namespace pdf2
