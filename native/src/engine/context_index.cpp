// Drafts from the context: the hashed n-gram index over one stream, the bounded cache of past
// outputs, and the per-key caches (context_index.h says what each proposes).
#include "engine/context_index.h"

#include "common/errors.h"

#include <algorithm>
#include <iterator>
#include <string>

namespace pdf2 {
namespace context_detail {

namespace {

// splitmix64's finaliser over the running hash and one token: every bit of both reaches every bit.
uint64_t mix(uint64_t h, llama_token t) {
    uint64_t x = h + static_cast<uint32_t>(t) + 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

constexpr size_t kMinSlots = 16;

// hashes[n-1] for the n-grams ending at the last token of tok[0..len): n = 1..min(len, max_n). Built
// from the last token backwards, so that an n-gram's hash extends its (n-1)-gram suffix's.
template <typename Tokens>
int suffix_hashes(const Tokens & tok, size_t len, int max_n, uint64_t * hashes) {
    const int count = static_cast<int>(std::min(len, static_cast<size_t>(std::max(max_n, 0))));
    uint64_t h = 0;
    for (int n = 1; n <= count; ++n) {
        h = mix(h, tok[len - static_cast<size_t>(n)]);
        hashes[n - 1] = h;
    }
    return count;
}

}  // namespace

void NgramTable::reset(int max_ngram, uint64_t hash_mask) {
    max_ngram_ = max_ngram;
    hash_mask_ = hash_mask;
    base_ = 0;
    maps_.assign(static_cast<size_t>(max_ngram), Map{});
    links_.clear();
    links_front_ = 0;
}

uint32_t NgramTable::key_of(uint64_t hash) const {
    const uint64_t h = hash & hash_mask_;
    const uint32_t k = static_cast<uint32_t>(h ^ (h >> 32));
    return k == 0 ? 1 : k;  // 0 marks an empty slot; merging it with 1 is one more collision
}

size_t NgramTable::home(const Map & m, uint32_t key) const {
    // keys are hashes already; the odd multiplier spreads the small keys that a weakened hash leaves
    return static_cast<size_t>(key * 2654435761u) & (m.slots.size() - 1);
}

const NgramTable::Slot * NgramTable::find(const Map & m, uint32_t key) const {
    if (m.slots.empty()) {
        return nullptr;
    }
    const size_t mask = m.slots.size() - 1;
    for (size_t i = home(m, key);; i = (i + 1) & mask) {
        if (m.slots[i].key == key) {
            return &m.slots[i];
        }
        if (m.slots[i].key == 0) {
            return nullptr;
        }
    }
}

NgramTable::Slot * NgramTable::find(Map & m, uint32_t key) const {
    return const_cast<Slot *>(find(static_cast<const Map &>(m), key));
}

void NgramTable::insert(Map & m, uint32_t key, uint32_t head) {
    if ((m.used + 1) * 10 > m.slots.size() * 7) {  // load <= 0.7 keeps linear probes short
        std::vector<Slot> old(std::max(kMinSlots, m.slots.size() * 2));
        old.swap(m.slots);
        m.used = 0;
        for (const Slot & s : old) {
            if (s.key != 0) {
                insert(m, s.key, s.head);
            }
        }
    }
    const size_t mask = m.slots.size() - 1;
    size_t i = home(m, key);
    while (m.slots[i].key != 0) {
        i = (i + 1) & mask;
    }
    m.slots[i] = Slot{key, head};
    ++m.used;
}

void NgramTable::erase(Map & m, Slot * slot) {
    // backward-shift deletion: no tombstones, so probes stay as short as the live keys make them
    const size_t mask = m.slots.size() - 1;
    size_t hole = static_cast<size_t>(slot - m.slots.data());
    for (size_t j = (hole + 1) & mask; m.slots[j].key != 0; j = (j + 1) & mask) {
        const size_t probe = (j - home(m, m.slots[j].key)) & mask;  // how far j is from its home
        if (probe >= ((j - hole) & mask)) {                           // the hole lies on its probe path
            m.slots[hole] = m.slots[j];
            hole = j;
        }
    }
    m.slots[hole] = Slot{};
    --m.used;
}

int64_t NgramTable::unwrap(uint32_t pos32) const {
    return base_ + static_cast<int64_t>(static_cast<uint32_t>(pos32 - static_cast<uint32_t>(base_)));
}

void NgramTable::prefetch(const uint64_t * hashes, int count) const {
    for (int n = 1; n <= count; ++n) {
        const Map & m = maps_[static_cast<size_t>(n - 1)];
        if (!m.slots.empty()) __builtin_prefetch(&m.slots[home(m, key_of(hashes[n - 1]))]);
    }
}

void NgramTable::push_back(const uint64_t * hashes, int count) {
    const int64_t pos = end();
    const size_t row = links_.size();
    links_.resize(row + static_cast<size_t>(max_ngram_), 0);
    prefetch(hashes, count);
    for (int n = 1; n <= count; ++n) {
        Map & m = maps_[static_cast<size_t>(n - 1)];
        const uint32_t key = key_of(hashes[n - 1]);
        if (Slot * s = find(m, key)) {
            const int64_t gap = pos - unwrap(s->head);
            links_[row + static_cast<size_t>(n - 1)] = gap <= int64_t{UINT32_MAX} ? static_cast<uint32_t>(gap) : 0;
            s->head = static_cast<uint32_t>(pos);
        } else {
            insert(m, key, static_cast<uint32_t>(pos));
        }
    }
}

void NgramTable::pop_front(const uint64_t * hashes, int count) {
    for (int n = 1; n <= count; ++n) {
        Map & m = maps_[static_cast<size_t>(n - 1)];
        Slot * s = find(m, key_of(hashes[n - 1]));
        // base_ is the oldest position of its chain: when it is also the newest, the chain is empty
        if (s != nullptr && unwrap(s->head) == base_) {
            erase(m, s);
        }
    }
    links_front_ += static_cast<size_t>(max_ngram_);
    ++base_;
    if (links_front_ * 2 > links_.size()) {  // amortised O(1): each entry moves at most once per halving
        links_.erase(links_.begin(), links_.begin() + static_cast<std::ptrdiff_t>(links_front_));
        links_front_ = 0;
    }
}

int64_t NgramTable::latest(int n, uint64_t hash) const {
    const Slot * s = find(maps_[static_cast<size_t>(n - 1)], key_of(hash));
    return s == nullptr ? -1 : unwrap(s->head);
}

int64_t NgramTable::previous(int n, int64_t pos) const {
    const uint32_t gap =
        links_[links_front_ + static_cast<size_t>(pos - base_) * static_cast<size_t>(max_ngram_) +
               static_cast<size_t>(n - 1)];
    if (gap == 0 || pos - gap < base_) {  // the chain goes on into evicted positions: it ends here
        return -1;
    }
    return pos - gap;
}

}  // namespace context_detail

namespace {

constexpr int kMaxNgram = 64;  // the suffix hashes of a query live on the stack
constexpr int kMaxOccurrences = 1 << 16;
constexpr size_t kMaxCacheTokens = size_t{1} << 31;  // positions in a chain differ by < 2^32

void check_index_options(const ContextIndexOptions & o) {
    if (o.max_ngram < 1 || o.max_ngram > kMaxNgram) {
        throw Error("context index: max_ngram must be in 1.." + std::to_string(kMaxNgram) + ", got " +
                    std::to_string(o.max_ngram));
    }
    if (o.min_ngram < 1) {
        throw Error("context index: min_ngram must be >= 1, got " + std::to_string(o.min_ngram));
    }
    if (o.max_occurrences < 1 || o.max_occurrences > kMaxOccurrences) {
        throw Error("context index: max_occurrences must be in 1.." + std::to_string(kMaxOccurrences) +
                    ", got " + std::to_string(o.max_occurrences));
    }
}

// Merges continuations into a trie, in the order ContextPaths documents: nodes first seen first.
class TrieBuilder {
  public:
    // nodes: at most max_depth per continuation (reserved so that a query allocates once)
    TrieBuilder(ContextPaths & out, size_t nodes) : out_(out) {
        first_child_.reserve(nodes);
        next_sibling_.reserve(nodes);
        out_.parent.reserve(nodes);
        out_.depth.reserve(nodes);
        out_.token.reserve(nodes);
        out_.count.reserve(nodes);
    }

    // Walks one continuation down from the root; `at(d)` is its d-th token (d = 0..len-1).
    template <typename At>
    void add(size_t len, At && at) {
        int32_t node = -1;
        for (size_t d = 0; d < len; ++d) {
            const llama_token t = at(d);
            int32_t child = node < 0 ? root_first_ : first_child_[static_cast<size_t>(node)];
            int32_t last = -1;
            while (child >= 0 && out_.token[static_cast<size_t>(child)] != t) {
                last = child;
                child = next_sibling_[static_cast<size_t>(child)];
            }
            if (child < 0) {
                child = out_.size();
                out_.parent.push_back(node);
                out_.depth.push_back(static_cast<int32_t>(d + 1));
                out_.token.push_back(t);
                out_.count.push_back(0);
                first_child_.push_back(-1);
                next_sibling_.push_back(-1);
                if (last >= 0) {
                    next_sibling_[static_cast<size_t>(last)] = child;
                } else if (node < 0) {
                    root_first_ = child;
                } else {
                    first_child_[static_cast<size_t>(node)] = child;
                }
            }
            ++out_.count[static_cast<size_t>(child)];
            node = child;
        }
        ++out_.n_occurrences;
    }

  private:
    ContextPaths & out_;
    int32_t root_first_ = -1;
    std::vector<int32_t> first_child_;
    std::vector<int32_t> next_sibling_;
};

// A query's paths: the latest occurrences (at most max_occurrences) of its longest suffix that the
// table holds (n_max down to min_ngram tokens; `hashes` its suffix hashes), merged into a trie of
// what follows each, at most max_depth tokens. same(e, n): whether the n tokens ending at stream
// position e equal the query's last n; token_at(e): the token at e; after(e): how many follow e (>= 1).
template <typename Same, typename TokenAt, typename After>
void propose_paths(const context_detail::NgramTable & table, const uint64_t * hashes, int n_max, int min_ngram,
                   int max_occurrences, int max_depth, Same && same, TokenAt && token_at, After && after,
                   ContextPaths & out) {
    table.prefetch(hashes, n_max);
    std::vector<int64_t> found;
    found.reserve(static_cast<size_t>(std::min(max_occurrences, 64)));
    for (int n = n_max; n >= min_ngram; --n) {
        for (int64_t e = table.latest(n, hashes[n - 1]); e >= 0 && static_cast<int>(found.size()) < max_occurrences;
             e = table.previous(n, e)) {
            if (same(e, n)) {
                found.push_back(e);
            }
        }
        if (!found.empty()) {
            out.match_length = n;
            break;
        }
    }
    const size_t depth = static_cast<size_t>(std::max(max_depth, 0));
    TrieBuilder trie(out, std::min<size_t>(found.size() * depth, 4096));
    for (const int64_t e : found) {
        trie.add(std::min(after(e), depth), [&](size_t d) { return token_at(e + 1 + static_cast<int64_t>(d)); });
    }
}

}  // namespace

// ---- ContextIndex ----

ContextIndex::ContextIndex(const ContextIndexOptions & opts) : opts_(opts) {
    check_index_options(opts_);
    table_.reset(opts_.max_ngram, ~uint64_t{0});
}

void ContextIndex::append(llama_token t) {
    tokens_.push_back(t);
    const size_t n = tokens_.size();
    if (n < 2) {
        return;
    }
    // position n-2 now has a token after it: only then can its n-grams propose
    uint64_t hashes[kMaxNgram];
    const int count = context_detail::suffix_hashes(tokens_, n - 1, opts_.max_ngram, hashes);
    table_.push_back(hashes, count);
}

void ContextIndex::append(const llama_token * t, size_t n) {
    tokens_.reserve(tokens_.size() + n);
    for (size_t i = 0; i < n; ++i) {
        append(t[i]);
    }
}

void ContextIndex::clear() {
    tokens_.clear();
    table_.reset(opts_.max_ngram, table_.hash_mask());
}

size_t ContextIndex::size() const { return tokens_.size(); }

const std::vector<llama_token> & ContextIndex::tokens() const { return tokens_; }

void ContextIndex::propose(int max_depth, ContextPaths & out) const {
    out.clear();
    const size_t size = tokens_.size();
    if (size < 2) {
        return;
    }
    uint64_t hashes[kMaxNgram];
    // a suffix as long as the stream has no earlier occurrence
    const int longest = static_cast<int>(std::min(static_cast<size_t>(opts_.max_ngram), size - 1));
    const int n_max = context_detail::suffix_hashes(tokens_, size, longest, hashes);
    const llama_token * query_end = tokens_.data() + size;
    propose_paths(
        table_, hashes, n_max, opts_.min_ngram, opts_.max_occurrences, max_depth,
        [&](int64_t e, int n) { return std::equal(query_end - n, query_end, tokens_.data() + (e + 1 - n)); },
        [&](int64_t i) { return tokens_[static_cast<size_t>(i)]; },
        [&](int64_t e) { return size - 1 - static_cast<size_t>(e); },  // >= 1: e has a token after it
        out);
}

// ---- ContextCache ----

ContextCache::ContextCache(const ContextCacheOptions & opts) : opts_(opts) {
    check_index_options(opts_.index);
    if (opts_.max_documents < 0) {
        throw Error("context cache: max_documents must be >= 0, got " + std::to_string(opts_.max_documents));
    }
    if (opts_.max_tokens > kMaxCacheTokens) {
        throw Error("context cache: max_tokens must be <= " + std::to_string(kMaxCacheTokens) + ", got " +
                    std::to_string(opts_.max_tokens));
    }
    table_.reset(opts_.index.max_ngram, ~uint64_t{0});
}

void ContextCache::add(const llama_token * doc, size_t n) {
    // an empty document proposes nothing, and one longer than max_tokens would evict every other
    // document and then itself: neither is kept, nor evicts anything
    if (n == 0 || n > opts_.max_tokens || opts_.max_documents == 0) {
        return;
    }
    if (doc == nullptr) {
        throw Error("context cache: document is NULL");
    }
    while (!documents_.empty() && (documents_.size() + 1 > static_cast<size_t>(opts_.max_documents) ||
                                   n_tokens() + n > opts_.max_tokens)) {
        evict_oldest();
    }
    const int64_t start = table_.end();
    tokens_.insert(tokens_.end(), doc, doc + n);
    uint64_t hashes[kMaxNgram];
    for (size_t i = 0; i < n; ++i) {
        // the n-grams ending at i within the document, when a token follows in it
        const int count =
            i + 1 < n ? context_detail::suffix_hashes(doc, i + 1, opts_.index.max_ngram, hashes) : 0;
        table_.push_back(hashes, count);
    }
    documents_.push_back(Document{start, start + static_cast<int64_t>(n)});
}

void ContextCache::evict_oldest() {
    const Document d = documents_.front();
    const llama_token * doc = tokens_.data() + tokens_front_;
    const size_t n = static_cast<size_t>(d.end - d.start);
    uint64_t hashes[kMaxNgram];
    for (size_t i = 0; i < n; ++i) {
        const int count =
            i + 1 < n ? context_detail::suffix_hashes(doc, i + 1, opts_.index.max_ngram, hashes) : 0;
        table_.pop_front(hashes, count);
    }
    documents_.pop_front();
    tokens_front_ += n;
    if (tokens_front_ * 2 > tokens_.size()) {  // amortised O(1) per token, as the table's links
        tokens_.erase(tokens_.begin(), tokens_.begin() + static_cast<std::ptrdiff_t>(tokens_front_));
        tokens_front_ = 0;
    }
}

size_t ContextCache::n_documents() const { return documents_.size(); }

size_t ContextCache::n_tokens() const { return tokens_.size() - tokens_front_; }

const ContextCache::Document & ContextCache::document_of(int64_t pos) const {
    // the last document that starts at or before pos
    auto it = std::upper_bound(documents_.begin(), documents_.end(), pos,
                               [](int64_t p, const Document & d) { return p < d.start; });
    return *std::prev(it);
}

void ContextCache::propose(const llama_token * query, size_t n_query, int max_depth, ContextPaths & out) const {
    out.clear();
    if (n_query == 0 || documents_.empty()) {
        return;
    }
    if (query == nullptr) {
        throw Error("context cache: query is NULL");
    }
    uint64_t hashes[kMaxNgram];
    const int n_max = context_detail::suffix_hashes(query, n_query, opts_.index.max_ngram, hashes);
    const llama_token * query_end = query + n_query;
    propose_paths(
        table_, hashes, n_max, opts_.index.min_ngram, opts_.index.max_occurrences, max_depth,
        [&](int64_t e, int n) {
            for (int i = 0; i < n; ++i) {
                if (token_at(e + 1 - n + i) != query_end[i - n]) return false;
            }
            return true;
        },
        [&](int64_t i) { return token_at(i); },
        [&](int64_t e) { return static_cast<size_t>(document_of(e).end - 1 - e); },  // >= 1 by construction
        out);
}

// ---- ContextCaches ----

ContextCaches::ContextCaches(const ContextCacheOptions & opts, size_t max_keys) : opts_(opts), max_keys_(max_keys) {
    if (max_keys_ < 1) {
        throw Error("context caches: max_keys must be >= 1");
    }
    ContextCache check(opts_);  // refuses bad options now rather than at the first key
}

ContextCache & ContextCaches::for_key(const std::string & key) {
    auto it = by_key_.find(key);
    if (it != by_key_.end()) {
        lru_.splice(lru_.begin(), lru_, it->second);  // iterators stay valid: the cache does not move
        return lru_.front().second;
    }
    lru_.emplace_front(key, ContextCache(opts_));
    by_key_[key] = lru_.begin();
    while (lru_.size() > max_keys_) {
        by_key_.erase(lru_.back().first);
        lru_.pop_back();
    }
    return lru_.front().second;
}

const ContextCache * ContextCaches::find(const std::string & key) const {
    auto it = by_key_.find(key);
    return it == by_key_.end() ? nullptr : &it->second->second;
}

void ContextCaches::erase(const std::string & key) {
    auto it = by_key_.find(key);
    if (it != by_key_.end()) {
        lru_.erase(it->second);
        by_key_.erase(it);
    }
}

void ContextCaches::clear() {
    by_key_.clear();
    lru_.clear();
}

size_t ContextCaches::n_documents() const {
    size_t n = 0;
    for (const Entry & e : lru_) {
        n += e.second.n_documents();
    }
    return n;
}

size_t ContextCaches::n_tokens() const {
    size_t n = 0;
    for (const Entry & e : lru_) {
        n += e.second.n_tokens();
    }
    return n;
}

}  // namespace pdf2
