// Drafts from the context (prompt lookup, SuffixDecoding): an index over a token stream (a
// request's prompt and committed output) that proposes what followed earlier occurrences of the
// stream's current suffix, and a bounded cache of past outputs across requests (the server's
// global cache) that proposes for another stream's suffix. Model-free: a query costs
// microseconds, so the planner can price the context's drafts before it asks the drafter.
//
// The index is hashed n-grams: for every n in 1..max_ngram, the end positions of each n-gram, so
// that appending a token is O(max_ngram) = amortised O(1) and a query finds the longest matching
// suffix (up to max_ngram tokens) and its most recent earlier occurrences directly.
#pragma once

#include <llama.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

namespace pdf2 {

struct ContextTestHooks;  // context_index_api.cpp: weakens the n-gram hash so tests see collisions

namespace context_detail {

// The n-gram table behind ContextIndex and ContextCache. Positions are global and stable (a cache
// evicts from the front, base() moves up). For each n, an open-addressing map from the n-gram's
// 32-bit hash to its most recent end position, and per position a link to the previous end position
// with the same hash (an LZ77-style hash chain): 8-16 bytes per distinct n-gram and 4 per n-gram,
// so a 1M-token cache fits in a few hundred MB. Lookups return candidates only: the caller compares
// tokens, so a hash collision costs a comparison, never a wrong match.
class NgramTable {
  public:
    void reset(int max_ngram, uint64_t hash_mask);
    int max_ngram() const { return max_ngram_; }
    uint64_t hash_mask() const { return hash_mask_; }
    int64_t base() const { return base_; }  // the oldest position kept
    int64_t end() const { return base_ + static_cast<int64_t>(n_rows()); }

    // Registers the n-grams of length 1..count (count <= max_ngram) ending at position end(), their
    // hashes in hashes[n-1]; count 0 keeps the position without n-grams.
    void push_back(const uint64_t * hashes, int count);
    // Asks the cache for the slots of those n-grams' maps: the maps are large and cold after a
    // target decode, and one miss at a time per n-gram length (12) was most of an append or lookup.
    void prefetch(const uint64_t * hashes, int count) const;
    // Drops position base(), whose n-grams (the same hashes and count as pushed) go with it.
    void pop_front(const uint64_t * hashes, int count);

    int64_t latest(int n, uint64_t hash) const;   // most recent end position, -1 if none
    int64_t previous(int n, int64_t pos) const;   // the one before pos in its chain, -1 if none

  private:
    struct Slot {
        uint32_t key = 0;   // 0 = empty
        uint32_t head = 0;  // the most recent end position, modulo 2^32 (live positions span < 2^32)
    };
    struct Map {
        std::vector<Slot> slots;  // power-of-two size, linear probing
        size_t used = 0;
    };

    size_t n_rows() const { return (links_.size() - links_front_) / static_cast<size_t>(max_ngram_); }
    uint32_t key_of(uint64_t hash) const;
    size_t home(const Map & m, uint32_t key) const;
    Slot * find(Map & m, uint32_t key) const;
    const Slot * find(const Map & m, uint32_t key) const;
    void insert(Map & m, uint32_t key, uint32_t head);
    void erase(Map & m, Slot * slot);
    int64_t unwrap(uint32_t pos32) const;

    int max_ngram_ = 0;
    uint64_t hash_mask_ = ~uint64_t{0};
    int64_t base_ = 0;
    std::vector<Map> maps_;           // [n-1]
    std::vector<uint32_t> links_;     // [(pos - base) * max_ngram + n-1]: pos - previous, 0 = none
    size_t links_front_ = 0;          // entries before it are evicted (compacted when half the vector)
};

}  // namespace context_detail

// Candidate continuations as a trie: nodes in first-seen order (a parent before its children),
// children of a node in first-seen order, occurrences taken most recent first.
struct ContextPaths {
    std::vector<int32_t> parent;      // node index, -1 = hangs under the root (the stream's last token)
    std::vector<int32_t> depth;       // 1..max_depth
    std::vector<llama_token> token;
    std::vector<int32_t> count;       // occurrences whose continuation passes through the node
    int32_t match_length = 0;         // tokens of the matched suffix (0: no match, no nodes)
    int32_t n_occurrences = 0;        // occurrences merged (the root's count)

    int size() const { return static_cast<int>(token.size()); }
    void clear() {
        parent.clear();
        depth.clear();
        token.clear();
        count.clear();
        match_length = 0;
        n_occurrences = 0;
    }
};

struct ContextIndexOptions {
    int max_ngram = 12;        // the longest suffix matched
    int min_ngram = 1;         // shorter matches propose nothing
    int max_occurrences = 8;   // the most recent earlier occurrences merged into the trie
};

// One stream (a request's prompt and output).
class ContextIndex {
  public:
    explicit ContextIndex(const ContextIndexOptions & opts = {});

    void append(llama_token t);
    void append(const llama_token * t, size_t n);
    void clear();
    size_t size() const;
    const std::vector<llama_token> & tokens() const;

    // The continuations of the longest suffix of the stream (min_ngram..max_ngram tokens, not
    // longer than size()-1) that also ends at an earlier position: the up to max_depth tokens
    // after each of its max_occurrences most recent earlier end positions (fewer where the stream
    // ends first; none when it ends right there), merged into a trie. out is overwritten.
    void propose(int max_depth, ContextPaths & out) const;

    const ContextIndexOptions & options() const { return opts_; }

  private:
    friend struct ContextTestHooks;

    ContextIndexOptions opts_;
    std::vector<llama_token> tokens_;
    context_detail::NgramTable table_;  // n-grams of the positions with a token after them
};

struct ContextCacheOptions {
    ContextIndexOptions index;
    int max_documents = 256;       // past outputs kept (the oldest go first)
    size_t max_tokens = 1 << 20;   // ... and their tokens in all
};

// Past outputs across requests (SuffixDecoding's global tree), bounded by document count and
// tokens (least recently added first out). A match never crosses a document boundary.
class ContextCache {
  public:
    explicit ContextCache(const ContextCacheOptions & opts = {});

    void add(const llama_token * doc, size_t n);  // one past output (evicts beyond the bounds)
    size_t n_documents() const;
    size_t n_tokens() const;

    // As ContextIndex::propose, for the suffix of `query` (another stream) against the documents:
    // the longest suffix of query (min_ngram..max_ngram tokens) that occurs in a document with at
    // least one token after it; its most recent occurrences (the newest document first, within a
    // document the last occurrence first), continuations stop at the document's end.
    void propose(const llama_token * query, size_t n_query, int max_depth, ContextPaths & out) const;

    const ContextCacheOptions & options() const { return opts_; }

  private:
    friend struct ContextTestHooks;

    struct Document {
        int64_t start;  // global positions [start, end)
        int64_t end;
    };

    llama_token token_at(int64_t pos) const {
        return tokens_[tokens_front_ + static_cast<size_t>(pos - table_.base())];
    }
    const Document & document_of(int64_t pos) const;
    void evict_oldest();

    ContextCacheOptions opts_;
    std::deque<Document> documents_;
    std::vector<llama_token> tokens_;   // the kept documents' tokens, from tokens_front_ on
    size_t tokens_front_ = 0;           // evicted tokens before it (compacted when half the vector)
    context_detail::NgramTable table_;  // n-grams with a token after them in their document
};

// One ContextCache per key (the server's API keys, so that no key's past outputs draft for another),
// at most max_keys of them: the least recently used key's cache goes first. Not thread-safe.
class ContextCaches {
  public:
    explicit ContextCaches(const ContextCacheOptions & opts = {}, size_t max_keys = 64);

    // The key's cache, made empty when it has none; the key becomes the most recently used, and the
    // least recently used other key is dropped beyond max_keys. The reference stays valid until a
    // later for_key drops this key (or erase / clear).
    ContextCache & for_key(const std::string & key);
    const ContextCache * find(const std::string & key) const;  // nullptr if none; not a use
    bool contains(const std::string & key) const { return find(key) != nullptr; }
    void erase(const std::string & key);
    void clear();

    size_t n_keys() const { return lru_.size(); }
    size_t max_keys() const { return max_keys_; }
    size_t n_documents() const;  // over all keys
    size_t n_tokens() const;
    const ContextCacheOptions & options() const { return opts_; }

  private:
    using Entry = std::pair<std::string, ContextCache>;

    ContextCacheOptions opts_;
    size_t max_keys_;
    std::list<Entry> lru_;  // the most recently used first
    std::unordered_map<std::string, std::list<Entry>::iterator> by_key_;
};

}  // namespace pdf2
