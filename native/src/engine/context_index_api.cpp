// C entry points of the context index, cache and per-key caches (tests and benchmarks drive the
// native structures the planner uses through them). Every argument is checked before use.
#include "engine/context_index.h"
#include "common/errors.h"

#include "pydflash2.h"

#include <algorithm>
#include <memory>
#include <string>

struct pdf2_context_index {
    std::unique_ptr<pdf2::ContextIndex> impl;
};

struct pdf2_context_cache {
    std::unique_ptr<pdf2::ContextCache> impl;
};

struct pdf2_context_caches {
    std::unique_ptr<pdf2::ContextCaches> impl;
};

namespace pdf2 {

// Keeps `bits` bits of every n-gram hash, so that tests make collisions common and check that they
// never produce a wrong match. Only on an empty index or cache: the table is rebuilt empty.
struct ContextTestHooks {
    static uint64_t mask(int32_t bits) {
        if (bits < 1 || bits > 64) {
            throw Error("context index: hash bits must be in 1..64, got " + std::to_string(bits));
        }
        return bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
    }
    static void set_hash_bits(ContextIndex & idx, int32_t bits) {
        const uint64_t m = mask(bits);
        if (idx.size() != 0) {
            throw Error("context index: set the hash bits before the first append");
        }
        idx.table_.reset(idx.opts_.max_ngram, m);
    }
    static void set_hash_bits(ContextCache & cache, int32_t bits) {
        const uint64_t m = mask(bits);
        if (cache.n_documents() != 0) {
            throw Error("context cache: set the hash bits before the first add");
        }
        cache.table_.reset(cache.opts_.index.max_ngram, m);
    }
};

}  // namespace pdf2

namespace {

constexpr int32_t kMaxDepth = 4096;

pdf2::ContextIndexOptions index_options(int32_t max_ngram, int32_t min_ngram, int32_t max_occurrences) {
    if (max_ngram < 1 || max_ngram > 64) {
        throw pdf2::Error("context index: max_ngram must be in 1..64, got " + std::to_string(max_ngram));
    }
    if (min_ngram < 1 || min_ngram > max_ngram) {
        throw pdf2::Error("context index: min_ngram must be in 1..max_ngram (" + std::to_string(max_ngram) +
                          "), got " + std::to_string(min_ngram));
    }
    if (max_occurrences < 1 || max_occurrences > 1024) {
        throw pdf2::Error("context index: max_occurrences must be in 1..1024, got " + std::to_string(max_occurrences));
    }
    pdf2::ContextIndexOptions o;
    o.max_ngram = max_ngram;
    o.min_ngram = min_ngram;
    o.max_occurrences = max_occurrences;
    return o;
}

pdf2::ContextCacheOptions cache_options(int32_t max_ngram, int32_t min_ngram, int32_t max_occurrences,
                                        int32_t max_documents, int64_t max_tokens) {
    pdf2::ContextCacheOptions o;
    o.index = index_options(max_ngram, min_ngram, max_occurrences);
    if (max_documents < 1) {
        throw pdf2::Error("context cache: max_documents must be >= 1, got " + std::to_string(max_documents));
    }
    if (max_tokens < 1 || max_tokens > (int64_t{1} << 31)) {
        throw pdf2::Error("context cache: max_tokens must be in 1..2^31, got " + std::to_string(max_tokens));
    }
    o.max_documents = max_documents;
    o.max_tokens = static_cast<size_t>(max_tokens);
    return o;
}

void check_tokens(const int32_t * tokens, int32_t n, const char * what) {
    if (n < 0) {
        throw pdf2::Error(std::string(what) + ": the token count must be >= 0, got " + std::to_string(n));
    }
    if (n > 0 && tokens == nullptr) {
        throw pdf2::Error(std::string(what) + ": tokens is NULL");
    }
}

void check_key(const char * key, const char * what) {
    if (key == nullptr) {
        throw pdf2::Error(std::string(what) + ": key is NULL");
    }
}

// The outputs of a propose, checked before the proposal is made: capacity must hold the largest
// proposal the settings allow (max_occurrences continuations of max_depth tokens), so that the
// check does not depend on the stream.
void check_outputs(const char * what, int32_t max_depth, int32_t capacity, int32_t max_occurrences,
                   const int32_t * n_nodes) {
    if (max_depth < 0 || max_depth > kMaxDepth) {
        throw pdf2::Error(std::string(what) + ": max_depth must be in 0.." + std::to_string(kMaxDepth) + ", got " +
                          std::to_string(max_depth));
    }
    const int64_t need = int64_t{max_depth} * max_occurrences;
    if (capacity < need) {
        throw pdf2::Error(std::string(what) + ": capacity " + std::to_string(capacity) +
                          " is below max_depth x max_occurrences = " + std::to_string(need));
    }
    if (n_nodes == nullptr) {
        throw pdf2::Error(std::string(what) + ": n_nodes is NULL");
    }
}

int write_paths(const pdf2::ContextPaths & p, int32_t * n_nodes, int32_t * parent, int32_t * depth, int32_t * token,
                int32_t * count, int32_t * match_length, int32_t * n_occurrences) {
    *n_nodes = p.size();
    if (parent) std::copy(p.parent.begin(), p.parent.end(), parent);
    if (depth) std::copy(p.depth.begin(), p.depth.end(), depth);
    if (token) std::copy(p.token.begin(), p.token.end(), token);
    if (count) std::copy(p.count.begin(), p.count.end(), count);
    if (match_length) *match_length = p.match_length;
    if (n_occurrences) *n_occurrences = p.n_occurrences;
    return 0;
}

}  // namespace

// ---- one stream ----

extern "C" pdf2_context_index * pdf2_context_index_new(int32_t max_ngram, int32_t min_ngram,
                                                       int32_t max_occurrences) {
    return pdf2::guarded<pdf2_context_index *>(nullptr, [&] {
        auto h = std::make_unique<pdf2_context_index>();
        h->impl = std::make_unique<pdf2::ContextIndex>(index_options(max_ngram, min_ngram, max_occurrences));
        return h.release();
    });
}

extern "C" void pdf2_context_index_free(pdf2_context_index * idx) { delete idx; }

extern "C" int pdf2_context_index_set_hash_bits(pdf2_context_index * idx, int32_t bits) {
    return pdf2::guarded<int>(-1, [&] {
        pdf2::ContextTestHooks::set_hash_bits(pdf2::handle_impl(idx, "context index"), bits);
        return 0;
    });
}

extern "C" int pdf2_context_index_append(pdf2_context_index * idx, const int32_t * tokens, int32_t n) {
    return pdf2::guarded<int>(-1, [&] {
        auto & index = pdf2::handle_impl(idx, "context index");
        check_tokens(tokens, n, "context index append");
        index.append(tokens, static_cast<size_t>(n));
        return 0;
    });
}

extern "C" int64_t pdf2_context_index_size(const pdf2_context_index * idx) {
    return pdf2::guarded<int64_t>(
        -1, [&] { return static_cast<int64_t>(pdf2::handle_impl(idx, "context index").size()); });
}

extern "C" int pdf2_context_index_propose(const pdf2_context_index * idx, int32_t max_depth, int32_t capacity,
                                          int32_t * n_nodes, int32_t * parent, int32_t * depth, int32_t * token,
                                          int32_t * count, int32_t * match_length, int32_t * n_occurrences) {
    return pdf2::guarded<int>(-1, [&] {
        const auto & index = pdf2::handle_impl(idx, "context index");
        check_outputs("context index propose", max_depth, capacity, index.options().max_occurrences, n_nodes);
        pdf2::ContextPaths p;
        index.propose(max_depth, p);
        return write_paths(p, n_nodes, parent, depth, token, count, match_length, n_occurrences);
    });
}

// ---- past outputs ----

extern "C" pdf2_context_cache * pdf2_context_cache_new(int32_t max_ngram, int32_t min_ngram, int32_t max_occurrences,
                                                       int32_t max_documents, int64_t max_tokens) {
    return pdf2::guarded<pdf2_context_cache *>(nullptr, [&] {
        auto h = std::make_unique<pdf2_context_cache>();
        h->impl = std::make_unique<pdf2::ContextCache>(
            cache_options(max_ngram, min_ngram, max_occurrences, max_documents, max_tokens));
        return h.release();
    });
}

extern "C" void pdf2_context_cache_free(pdf2_context_cache * cache) { delete cache; }

extern "C" int pdf2_context_cache_set_hash_bits(pdf2_context_cache * cache, int32_t bits) {
    return pdf2::guarded<int>(-1, [&] {
        pdf2::ContextTestHooks::set_hash_bits(pdf2::handle_impl(cache, "context cache"), bits);
        return 0;
    });
}

extern "C" int pdf2_context_cache_add(pdf2_context_cache * cache, const int32_t * tokens, int32_t n) {
    return pdf2::guarded<int>(-1, [&] {
        auto & c = pdf2::handle_impl(cache, "context cache");
        check_tokens(tokens, n, "context cache add");
        c.add(tokens, static_cast<size_t>(n));
        return 0;
    });
}

extern "C" int pdf2_context_cache_propose(const pdf2_context_cache * cache, const int32_t * query, int32_t n_query,
                                          int32_t max_depth, int32_t capacity, int32_t * n_nodes, int32_t * parent,
                                          int32_t * depth, int32_t * token, int32_t * count, int32_t * match_length,
                                          int32_t * n_occurrences) {
    return pdf2::guarded<int>(-1, [&] {
        const auto & c = pdf2::handle_impl(cache, "context cache");
        check_tokens(query, n_query, "context cache propose");
        check_outputs("context cache propose", max_depth, capacity, c.options().index.max_occurrences, n_nodes);
        pdf2::ContextPaths p;
        c.propose(query, static_cast<size_t>(n_query), max_depth, p);
        return write_paths(p, n_nodes, parent, depth, token, count, match_length, n_occurrences);
    });
}

extern "C" int64_t pdf2_context_cache_n_documents(const pdf2_context_cache * cache) {
    return pdf2::guarded<int64_t>(
        -1, [&] { return static_cast<int64_t>(pdf2::handle_impl(cache, "context cache").n_documents()); });
}

extern "C" int64_t pdf2_context_cache_n_tokens(const pdf2_context_cache * cache) {
    return pdf2::guarded<int64_t>(
        -1, [&] { return static_cast<int64_t>(pdf2::handle_impl(cache, "context cache").n_tokens()); });
}

// ---- one cache per key ----

extern "C" pdf2_context_caches * pdf2_context_caches_new(int32_t max_ngram, int32_t min_ngram,
                                                         int32_t max_occurrences, int32_t max_documents,
                                                         int64_t max_tokens, int32_t max_keys) {
    return pdf2::guarded<pdf2_context_caches *>(nullptr, [&] {
        const pdf2::ContextCacheOptions o =
            cache_options(max_ngram, min_ngram, max_occurrences, max_documents, max_tokens);
        if (max_keys < 1) {
            throw pdf2::Error("context caches: max_keys must be >= 1, got " + std::to_string(max_keys));
        }
        auto h = std::make_unique<pdf2_context_caches>();
        h->impl = std::make_unique<pdf2::ContextCaches>(o, static_cast<size_t>(max_keys));
        return h.release();
    });
}

extern "C" void pdf2_context_caches_free(pdf2_context_caches * caches) { delete caches; }

extern "C" int pdf2_context_caches_add(pdf2_context_caches * caches, const char * key, const int32_t * tokens,
                                       int32_t n) {
    return pdf2::guarded<int>(-1, [&] {
        auto & cs = pdf2::handle_impl(caches, "context caches");
        check_key(key, "context caches add");
        check_tokens(tokens, n, "context caches add");
        cs.for_key(key).add(tokens, static_cast<size_t>(n));
        return 0;
    });
}

extern "C" int pdf2_context_caches_propose(pdf2_context_caches * caches, const char * key, const int32_t * query,
                                           int32_t n_query, int32_t max_depth, int32_t capacity, int32_t * n_nodes,
                                           int32_t * parent, int32_t * depth, int32_t * token, int32_t * count,
                                           int32_t * match_length, int32_t * n_occurrences) {
    return pdf2::guarded<int>(-1, [&] {
        auto & cs = pdf2::handle_impl(caches, "context caches");
        check_key(key, "context caches propose");
        check_tokens(query, n_query, "context caches propose");
        check_outputs("context caches propose", max_depth, capacity, cs.options().index.max_occurrences, n_nodes);
        pdf2::ContextPaths p;
        cs.for_key(key).propose(query, static_cast<size_t>(n_query), max_depth, p);
        return write_paths(p, n_nodes, parent, depth, token, count, match_length, n_occurrences);
    });
}

extern "C" int64_t pdf2_context_caches_n_keys(const pdf2_context_caches * caches) {
    return pdf2::guarded<int64_t>(
        -1, [&] { return static_cast<int64_t>(pdf2::handle_impl(caches, "context caches").n_keys()); });
}

extern "C" int pdf2_context_caches_contains(const pdf2_context_caches * caches, const char * key) {
    return pdf2::guarded<int>(-1, [&] {
        const auto & cs = pdf2::handle_impl(caches, "context caches");
        check_key(key, "context caches contains");
        return cs.contains(key) ? 1 : 0;
    });
}

extern "C" int64_t pdf2_context_caches_n_documents(const pdf2_context_caches * caches, const char * key) {
    return pdf2::guarded<int64_t>(-1, [&] {
        const auto & cs = pdf2::handle_impl(caches, "context caches");
        check_key(key, "context caches n_documents");
        const pdf2::ContextCache * c = cs.find(key);
        return c == nullptr ? int64_t{0} : static_cast<int64_t>(c->n_documents());
    });
}
