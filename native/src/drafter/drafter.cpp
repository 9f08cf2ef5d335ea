#include "drafter/drafter.h"

#include "common/errors.h"
#include "common/json_writer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

namespace pdf2 {

namespace {
// inject graphs exist for 64 rows and powers of two below: any count is a few of them, so
// that injects of arbitrary lengths (prompts, rows queued while not drafting) add no new shapes
constexpr int INJECT_CHUNK = 64;
}

Drafter::Drafter(const std::string & drafter_path, const std::string & target_path, const DrafterOptions & opts) {
    if (opts.cache_type != GGML_TYPE_F16 && opts.cache_type != GGML_TYPE_F32) {
        throw Error("cache type must be f16 or f32");
    }
    ModelOptions mo;
    mo.device = opts.device;
    mo.n_threads = opts.n_threads;
    model_ = std::make_shared<DrafterModel>(drafter_path, target_path, mo);
    init(opts);
}

Drafter::Drafter(std::shared_ptr<DrafterModel> model, const DrafterOptions & opts) : model_(std::move(model)) {
    if (!model_) {
        throw Error("the drafter to share weights with has no model");
    }
    if (opts.cache_type != GGML_TYPE_F16 && opts.cache_type != GGML_TYPE_F32) {
        throw Error("cache type must be f16 or f32");
    }
    init(opts);
}

void Drafter::init(const DrafterOptions & opts) {
    cache_ = std::make_unique<DrafterCache>(*model_, opts.n_ctx, opts.cache_type);
    external_ = model_->weight_contexts();
    external_.push_back(cache_->context());
    const char * reuse = std::getenv("PYDFLASH2_DEBUG_REUSE_SPLIT_GRAPHS");
    reuse_split_graphs_ = reuse != nullptr && std::string(reuse) == "1";
    if (reuse_split_graphs_) max_slots_ = 1;  // the hook needs shapes to take turns in one schedule
    slots_.reserve(max_slots_);
}

Drafter::~Drafter() {
    for (GraphSlot & s : slots_) s.sched.reset();  // before the graphs they may hold
    slots_.clear();
    stale_graphs_.clear();
}

void Drafter::set_max_graph_slots(size_t n) {
    if (n < 1) {
        throw Error("a drafter keeps at least one graph");
    }
    if (reuse_split_graphs_) {
        return;  // the test hook runs with one slot
    }
    max_slots_ = n;
    slots_.reserve(max_slots_);  // slot_for hands out references: no reallocation later
    while (slots_.size() > max_slots_) {  // the least recently used go first
        auto lru = std::min_element(slots_.begin(), slots_.end(),
                                    [](const GraphSlot & a, const GraphSlot & b) { return a.last_use < b.last_use; });
        lru->sched.reset();  // before the graph it holds
        lru->graph.reset();  // before the memory it lives in
        slots_.erase(lru);
    }
}

Drafter::GraphSlot & Drafter::slot_for(const GraphKey & key) {
    for (GraphSlot & s : slots_) {
        if (s.key == key) return s;
    }
    if (slots_.size() < max_slots_ && compute_buffer_bytes() < MAX_GRAPH_BYTES) {
        slots_.push_back(new_slot());
        slots_.back().key = key;
        return slots_.back();
    }
    // full: the least recently used shape gives up its scheduler
    GraphSlot & lru = *std::min_element(slots_.begin(), slots_.end(),
                                        [](const GraphSlot & a, const GraphSlot & b) { return a.last_use < b.last_use; });
    lru.sched->release();
    if (lru.graph && reuse_split_graphs_) stale_graphs_.emplace_back(lru.key, std::move(lru.graph));
    lru.graph.reset();
    lru.key = key;
    return lru;
}

Drafter::GraphSlot Drafter::new_slot() const {
    GraphSlot s;
    const size_t words = (drafter_graph_ctx_bytes(*model_) + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t);
    s.graph_mem.reset(new std::max_align_t[words]);  // not written here: pages come as graphs use them
    s.sched = std::make_unique<DrafterSched>(model_->backend(), model_->backend_cpu(), drafter_graph_size(*model_),
                                             external_);
    return s;
}

void Drafter::reserve_graph_slots() {
    if (reuse_split_graphs_) {
        return;  // the test hook runs with its one slot
    }
    const int block = static_cast<int>(hparams().block_size);
    // the largest shapes: an inject chunk, and a full block over the whole cache that injects a block first
    const GraphKey largest[] = {{false, INJECT_CHUNK, 0, 0}, {true, block, static_cast<int>(cache_->capacity()), block}};
    for (size_t i = 0; i < max_slots_; ++i) {
        if (i == slots_.size()) {
            if (compute_buffer_bytes() >= MAX_GRAPH_BYTES) break;
            slots_.push_back(new_slot());
        }
        GraphSlot & slot = slots_[i];
        slot.sched->release();
        slot.graph.reset();
        slot.key = GraphKey();  // n = 0: no shape's key; last_use 0: taken first
        slot.last_use = 0;
        for (const GraphKey & key : largest) {
            std::unique_ptr<DrafterGraph> g =
                key.propose ? build_propose_graph(*model_, *cache_, key.n, key.n_kv, key.n_inject, slot.graph_mem.get())
                            : build_inject_graph(*model_, *cache_, key.n, slot.graph_mem.get());
            slot.sched->alloc(*g);
            slot.sched->write_host_pages(*g);
            slot.sched->release();
        }
    }
}

size_t Drafter::compute_buffer_bytes() const {
    size_t total = 0;
    for (const GraphSlot & s : slots_) total += s.sched->buffer_bytes();
    return total;
}

DrafterGraph & Drafter::graph_for(const GraphKey & key) {
    GraphSlot & slot = slot_for(key);
    slot.last_use = ++n_uses_;
    if (slot.graph && slot.sched->held() == slot.graph.get()) {
        return *slot.graph;  // allocated, inputs in place: runs again as is
    }
    const auto t0 = std::chrono::steady_clock::now();
    struct AddSetupTime {  // also when building or allocating throws
        double & total;
        std::chrono::steady_clock::time_point t0;
        ~AddSetupTime() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    } add_setup_time{graph_setup_s_, t0};
    slot.sched->release();
    slot.graph.reset();
    for (auto it = stale_graphs_.begin(); it != stale_graphs_.end(); ++it) {
        if (it->first == key) {
            // test hook: the pre-fix behaviour, a split graph reused in a new schedule
            slot.graph = std::move(it->second);
            stale_graphs_.erase(it);
            for (ggml_tensor * t = ggml_get_first_tensor(slot.graph->ctx); t;
                 t = ggml_get_next_tensor(slot.graph->ctx, t)) {
                t->data = nullptr;
                t->buffer = nullptr;
            }
            break;
        }
    }
    if (!slot.graph) {
        // the test hook keeps graphs past their slot's next build: they get memory of their own
        void * mem = reuse_split_graphs_ ? nullptr : slot.graph_mem.get();
        slot.graph = key.propose ? build_propose_graph(*model_, *cache_, key.n, key.n_kv, key.n_inject, mem)
                                 : build_inject_graph(*model_, *cache_, key.n, mem);
        ++n_graph_builds_;
    }
    try {
        slot.sched->alloc(*slot.graph);
    } catch (...) {
        slot.graph.reset();
        throw;
    }
    return *slot.graph;
}

void Drafter::compute(DrafterGraph & g, const std::function<void()> & set_inputs) {
    set_inputs();
    for (GraphSlot & s : slots_) {
        if (s.graph.get() == &g) {
            s.sched->compute(g);
            return;
        }
    }
    throw Error("internal: the drafter ran a graph it does not hold");
}

// KQ mask of n block queries over the first n_kv cache rows: context rows
// [0, n_cached) and the block rows right after them; -inf elsewhere.
void Drafter::fill_mask(std::vector<uint16_t> & mask, int n_kv, const int32_t * q_pos, int n, bool swa) const {
    const auto & hp = hparams();
    const auto & kpos = cache_->positions();
    const int n_ctx_rows = static_cast<int>(kpos.size());
    const ggml_fp16_t NEG = ggml_fp32_to_fp16(-INFINITY);
    const ggml_fp16_t ZERO = ggml_fp32_to_fp16(0.0f);
    mask.assign(static_cast<size_t>(n_kv) * n, NEG);
    for (int i = 0; i < n; ++i) {
        uint16_t * row = mask.data() + static_cast<size_t>(i) * n_kv;
        auto allowed = [&](int32_t kp) {
            if (hp.causal && kp > q_pos[i]) return false;
            if (swa && static_cast<int64_t>(q_pos[i]) - kp >= static_cast<int64_t>(hp.sliding_window)) return false;
            return true;
        };
        for (int r = 0; r < n_ctx_rows; ++r) {
            if (allowed(kpos[r])) row[r] = ZERO;
        }
        for (int j = 0; j < n; ++j) {
            if (allowed(q_pos[j])) row[n_ctx_rows + j] = ZERO;
        }
    }
}

void Drafter::check_inject(const float * features, size_t width, const int32_t * positions, int n) const {
    const size_t want = static_cast<size_t>(feature_width());
    if (width != want) {
        throw Error("feature width mismatch: got " + std::to_string(width) + " floats per row, the drafter expects " +
                    std::to_string(want) + " (" + std::to_string(hparams().target_layers.size()) +
                    " target layers x hidden size " + std::to_string(hparams().n_embd) + ")");
    }
    if (n <= 0) {
        throw Error("inject needs at least one row");
    }
    if (features == nullptr || positions == nullptr) {
        throw Error("inject: features/positions are NULL");
    }
    int32_t prev = cache_->last_pos();
    for (int i = 0; i < n; ++i) {
        if (positions[i] <= prev) {
            throw Error("inject positions must be strictly increasing and after the cache end (last cached position " +
                        std::to_string(cache_->last_pos()) + "); got " + std::to_string(positions[i]) + " at row " +
                        std::to_string(i));
        }
        prev = positions[i];
    }
    if (static_cast<uint64_t>(cache_->n_cached()) + n > cache_->n_ctx()) {
        throw Error("drafter cache full: " + std::to_string(cache_->n_cached()) + " rows cached + " + std::to_string(n) +
                    " new > n_ctx " + std::to_string(cache_->n_ctx()) + " (truncate or use a larger n_ctx)");
    }
}

void Drafter::inject(const float * features, size_t width, const int32_t * positions, int n) {
    check_inject(features, width, positions, n);
    const size_t want = static_cast<size_t>(feature_width());
    for (int off = 0, m = INJECT_CHUNK; off < n; off += m) {
        while (m > n - off) m /= 2;
        DrafterGraph & g = graph_for({false, m, 0});
        std::vector<int64_t> rows(m);
        for (int i = 0; i < m; ++i) rows[i] = cache_->n_cached() + i;
        compute(g, [&] {
            ggml_backend_tensor_set(g.features, features + static_cast<size_t>(off) * want, 0,
                                    static_cast<size_t>(m) * want * sizeof(float));
            ggml_backend_tensor_set(g.pos, positions + off, 0, m * sizeof(int32_t));
            ggml_backend_tensor_set(g.rows, rows.data(), 0, m * sizeof(int64_t));
        });
        cache_->commit(positions + off, m);
    }
}

void Drafter::truncate(int32_t pos) {
    if (pos < 0) {
        throw Error("truncate position must be >= 0, got " + std::to_string(pos));
    }
    cache_->truncate(pos);
}

const Proposal & Drafter::propose(int32_t anchor, int32_t pos, int n) {
    return inject_and_propose(nullptr, 0, nullptr, 0, anchor, pos, n);
}

const Proposal & Drafter::inject_and_propose(const float * features, size_t width, const int32_t * positions, int m,
                                             int32_t anchor, int32_t pos, int n) {
    if (m > max_fused_inject()) {
        inject(features, width, positions, m);
        m = 0;
    }
    if (m > 0) {
        check_inject(features, width, positions, m);
    }
    const auto & hp = hparams();
    if (n < 2 || static_cast<uint32_t>(n) > hp.block_size) {
        throw Error("block length " + std::to_string(n) + " is outside [2, block_size = " +
                    std::to_string(hp.block_size) + "]");
    }
    if (anchor < 0 || static_cast<uint32_t>(anchor) >= hp.n_vocab) {
        throw Error("anchor token " + std::to_string(anchor) + " is outside the vocabulary [0, " +
                    std::to_string(hp.n_vocab) + ")");
    }
    const int32_t last_pos = m > 0 ? positions[m - 1] : cache_->last_pos();
    if (pos <= last_pos || pos < 0) {
        throw Error("block position " + std::to_string(pos) + " is not after the cache end (last cached position " +
                    std::to_string(last_pos) + ")");
    }
    if (pos > INT32_MAX - n) {
        throw Error("block position overflows");
    }
    const int n_kv = static_cast<int>(cache_->bucket_for(static_cast<uint32_t>(m + n)));
    const uint32_t row0 = cache_->n_cached();
    // The rows injected come padded to a power of two: a step injects the rows it accepted, and
    // each count was a graph of its own to build the first time it came (most of a merged step's
    // graph setup). The padding rows are zero features written past the block's rows, where no
    // mask reaches and the next commit overwrites them.
    int m_graph = m;
    if (m > 0) {
        while ((m_graph & (m_graph - 1)) != 0) ++m_graph;
        m_graph = std::min(m_graph, max_fused_inject());  // (reserve_graph_slots' largest shape)
        if (row0 + static_cast<uint32_t>(m_graph + n) > cache_->capacity()) m_graph = m;
    }
    DrafterGraph & g = graph_for({true, n, n_kv, m_graph});

    std::vector<int64_t> inj_rows(static_cast<size_t>(m_graph));
    std::vector<int32_t> inj_pos(static_cast<size_t>(m_graph));
    for (int i = 0; i < m_graph; ++i) {
        inj_rows[static_cast<size_t>(i)] = i < m ? row0 + i : row0 + n + i;
        inj_pos[static_cast<size_t>(i)] = positions[std::min(i, m - 1)];
    }
    if (m_graph > m) padding_.resize(static_cast<size_t>(m_graph - m) * width, 0.0f);
    std::vector<int32_t> tokens(n, hp.mask_token_id);
    tokens[0] = anchor;
    std::vector<int32_t> qpos(n);
    std::vector<int64_t> rows(n);
    for (int i = 0; i < n; ++i) {
        qpos[i] = pos + i;
        rows[i] = row0 + m + i;
    }
    // the injected rows are context rows of this block's masks: commit their positions
    // first, and take them back if the graph fails
    if (m > 0) cache_->commit(positions, static_cast<uint32_t>(m));
    last_ = Proposal();
    try {
        std::vector<uint16_t> mask, mask_swa;
        fill_mask(mask, n_kv, qpos.data(), n, false);
        if (g.mask_swa) fill_mask(mask_swa, n_kv, qpos.data(), n, true);
        compute(g, [&] {
            if (m > 0) {
                const size_t real = static_cast<size_t>(m) * width * sizeof(float);
                ggml_backend_tensor_set(g.inj_features, features, 0, real);
                if (m_graph > m) {
                    ggml_backend_tensor_set(g.inj_features, padding_.data(), real,
                                            static_cast<size_t>(m_graph - m) * width * sizeof(float));
                }
                ggml_backend_tensor_set(g.inj_pos, inj_pos.data(), 0, m_graph * sizeof(int32_t));
                ggml_backend_tensor_set(g.inj_rows, inj_rows.data(), 0, m_graph * sizeof(int64_t));
            }
            ggml_backend_tensor_set(g.tokens, tokens.data(), 0, n * sizeof(int32_t));
            ggml_backend_tensor_set(g.pos, qpos.data(), 0, n * sizeof(int32_t));
            ggml_backend_tensor_set(g.rows, rows.data(), 0, n * sizeof(int64_t));
            ggml_backend_tensor_set(g.mask, mask.data(), 0, mask.size() * sizeof(uint16_t));
            if (g.mask_swa) ggml_backend_tensor_set(g.mask_swa, mask_swa.data(), 0, mask_swa.size() * sizeof(uint16_t));
        });
    } catch (...) {
        if (m > 0) cache_->truncate(positions[0]);
        throw;
    }

    // one read-back per block
    const int P = n - 1;
    readback_.resize(ggml_nelements(g.out));
    ggml_backend_tensor_get(g.out, readback_.data(), 0, ggml_nbytes(g.out));
    if (model_->is_v2()) {
        const int k = static_cast<int>(hp.selector_top_k);
        const int w = k + k * k;
        Lattice & lat = last_.lattice;
        lat.n_pos = P;
        lat.k = k;
        lat.cand.resize(static_cast<size_t>(P) * k);
        lat.scores.resize(static_cast<size_t>(P) * k * k);
        for (int i = 0; i < P; ++i) {
            const float * row = readback_.data() + static_cast<size_t>(i) * w;
            for (int c = 0; c < k; ++c) lat.cand[static_cast<size_t>(i) * k + c] = static_cast<int32_t>(row[c]);
            std::copy(row + k, row + w, lat.scores.begin() + static_cast<std::ptrdiff_t>(i) * k * k);
        }
    } else {
        last_.logits.assign(readback_.begin(), readback_.end());
    }
    last_.anchor = anchor;
    last_.pos = pos;
    last_.n = n;
    return last_;
}

DraftPath Drafter::select_path(SelectorMode selector, float temperature, uint64_t seed, int top_k) const {
    if (!last_.valid()) {
        throw Error("select_path: no proposal yet (call propose first)");
    }
    if (selector != SelectorMode::Greedy && selector != SelectorMode::Sample && selector != SelectorMode::Viterbi) {
        throw Error("unknown selector");
    }
    if (model_->is_v2()) {
        return select_lattice_path(last_.lattice, selector, temperature, seed);
    }
    return select_logits_path(last_.logits.data(), last_.n - 1, static_cast<int>(hparams().n_vocab), selector,
                              temperature, seed, top_k);
}

std::string Drafter::info_json() const {
    JsonWriter w;
    w.begin_object();
    w.field("device", model_->device_name());
    w.field("n_threads", model_->n_threads());
    w.field("n_ctx", cache_->n_ctx());
    w.field("cache_capacity", cache_->capacity());
    w.field("cache_type", ggml_type_name(cache_->type()));
    w.field("target_head_mapped", model_->target_head_mapped());
    w.field("n_graph_builds", n_graph_builds_);
    w.field("graph_slots", static_cast<int64_t>(slots_.size()));  // graph shapes kept allocated
    w.field("compute_buffer_bytes", static_cast<int64_t>(compute_buffer_bytes()));
    w.field("weights_address", static_cast<int64_t>(reinterpret_cast<intptr_t>(model_.get())));
    w.field("weights_users", static_cast<int64_t>(model_.use_count()));  // drafters sharing these weights
    w.end_object();
    return w.str();
}

}  // namespace pdf2
