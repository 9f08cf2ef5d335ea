// The engine's side of the candidate sources (draft_sources.h): the context's per slot, each
// slot's mode and key, the global cache's bounds, and sources added by name.
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
    for (Slot & s : slots_) s.sources().add(make_draft_source("context", source_kit_));
    set_context_cache_limits(CONTEXT_CACHE_KEYS, CONTEXT_CACHE_DOCUMENTS, CONTEXT_CACHE_TOKENS);
}

void BatchEngine::add_draft_source(const std::string & name) {
    if (opts_.context_nodes == 0) {
        throw Error("draft source '" + name + "' needs merged trees: make the engine with context_nodes > 0");
    }
    for (const Slot & s : slots_) {
        if (s.state() != State::Idle) throw Error("draft sources are added while every slot is idle");
    }
    for (Slot & s : slots_) s.sources().add(make_draft_source(name, source_kit_));
}

void BatchEngine::set_context_cache_limits(size_t max_keys, int max_documents, size_t max_tokens) {
    if (max_keys < 1 || max_documents < 1 || max_tokens < 1) {
        throw Error("context cache limits must be >= 1");
    }
    ContextCacheOptions o = source_kit_.context_caches.options();
    o.max_documents = max_documents;
    o.max_tokens = max_tokens;
    source_kit_.context_caches = ContextCaches(o, max_keys);  // slots look their key up at each use
}

void BatchEngine::set_context_drafts(int slot, ContextDrafts mode, const std::string & key) {
    Slot & s = slot_at(slot);
    if (mode != ContextDrafts::Off && opts_.context_nodes == 0) {
        throw Error("context drafts are off in this engine (it was made without context_nodes)");
    }
    s.set_context_drafts(mode, key);
}

}  // namespace pdf2
