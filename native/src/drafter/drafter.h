// Drafter: model + KV cache + cached graphs + scheduler. The C++ entry point
// for the draft-verify loop: inject() committed target features, propose() a
// block, select_path() through it; truncate() rolls the cache back.
#pragma once

#include "drafter/drafter_cache.h"
#include "drafter/drafter_graph.h"
#include "drafter/drafter_model.h"
#include "drafter/drafter_sched.h"
#include "drafter/path_selector.h"

#include <ggml-backend.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pdf2 {

struct DrafterOptions {
    std::string device;  // "" or "auto": first GPU, else CPU; or a ggml device name
    int n_threads = 0;
    uint32_t n_ctx = 4096;
    ggml_type cache_type = GGML_TYPE_F16;
};

// Result of the last propose(): a lattice (DFlash2) or logits (DFlash1) of
// the n-1 drafted positions.
struct Proposal {
    int32_t anchor = -1;
    int32_t pos = -1;
    int n = 0;  // block length; n-1 drafted positions
    Lattice lattice;            // DFlash2
    std::vector<float> logits;  // DFlash1: [n-1][n_vocab]
    bool valid() const { return n > 0; }
};

class Drafter {
  public:
    Drafter(const std::string & drafter_path, const std::string & target_path, const DrafterOptions & opts);
    // over a model another drafter loaded (its weights, device and threads);
    // opts give the cache only. Drafters sharing a model run one at a time.
    Drafter(std::shared_ptr<DrafterModel> model, const DrafterOptions & opts);
    ~Drafter();
    Drafter(const Drafter &) = delete;
    Drafter & operator=(const Drafter &) = delete;

    const DrafterModel & model() const { return *model_; }
    std::shared_ptr<DrafterModel> shared_model() const { return model_; }
    const DrafterHParams & hparams() const { return model_->hparams(); }
    const DrafterCache & cache() const { return *cache_; }
    int feature_width() const { return static_cast<int>(hparams().target_layers.size() * hparams().n_embd); }

    // features: n rows of feature_width() floats; positions strictly increasing, after the cache end
    void inject(const float * features, size_t width, const int32_t * positions, int n);
    void truncate(int32_t pos);
    const Proposal & propose(int32_t anchor, int32_t pos, int n);
    // inject(features, width, positions, m) and propose(anchor, pos, n) as ONE graph computation
    // (m <= max_fused_inject(), else the rows are injected by graphs of their own first). A
    // step commits at most a block's rows; more come after a stretch without drafting.
    // The injected rows go through the same ops as inject()'s (equal but for float rounding:
    // ggml's matmuls round by the shapes they are given).
    const Proposal & inject_and_propose(const float * features, size_t width, const int32_t * positions, int m,
                                        int32_t anchor, int32_t pos, int n);
    int max_fused_inject() const { return static_cast<int>(hparams().block_size); }
    // At most this many graph shapes keep their allocation (least recently used evicted):
    // each costs about 1 MB of host memory for SmolLM2's drafter. A server with a drafter
    // per slot keeps few; a single generation loop keeps the shapes its steps alternate.
    void set_max_graph_slots(size_t n);
    // Creates every graph slot now, each with its compute buffers sized for the largest shapes and
    // their host pages written once: memory then stays flat while the drafter serves (a server
    // slot's drafter would otherwise grow as rarer shapes and longer contexts come). Throws Error.
    void reserve_graph_slots();
    const Proposal & last() const { return last_; }
    // the selector's path through the last proposal; top_k: DFlash1's q support (DFlash2 uses selector_top_k)
    DraftPath select_path(SelectorMode selector, float temperature, uint64_t seed, int top_k) const;

    std::string info_json() const;

    // Seconds spent building and allocating graphs (inside inject/propose), and how many were built:
    // the engine reports them as their own phase of a step.
    double graph_setup_seconds() const { return graph_setup_s_; }
    uint64_t n_graph_builds() const { return n_graph_builds_; }

  private:
    // the shape a graph is built for: inject of n rows, or propose of n over n_kv
    struct GraphKey {
        bool propose = false;
        int n = 0;
        int n_kv = 0;
        int n_inject = 0;  // propose graphs that inject rows first
        bool operator==(const GraphKey & o) const {
            return propose == o.propose && n == o.n && n_kv == o.n_kv && n_inject == o.n_inject;
        }
    };
    void check_inject(const float * features, size_t width, const int32_t * positions, int n) const;
    // the graph for key, allocated: the one built for that shape earlier if its scheduler still
    // holds it, else a fresh one
    DrafterGraph & graph_for(const GraphKey & key);
    // runs g (from graph_for) after set_inputs wrote its inputs
    void compute(DrafterGraph & g, const std::function<void()> & set_inputs);
    void fill_mask(std::vector<uint16_t> & mask, int n_kv, const int32_t * q_pos, int n, bool swa) const;

    void init(const DrafterOptions & opts);

    // One allocated graph per shape, each with a scheduler of its own: a step alternates
    // shapes (the rows injected vary with the drafts accepted), and a graph stays runnable
    // only while its scheduler holds it (drafter_sched.h). Least recently used shape evicted.
    struct GraphSlot {
        GraphKey key;
        // the tensor metadata of this slot's graphs, one at a time (declared before graph: outlives it)
        std::unique_ptr<std::max_align_t[]> graph_mem;
        std::unique_ptr<DrafterGraph> graph;  // null after a failed allocation
        std::unique_ptr<DrafterSched> sched;  // declared after graph: freed before the graph it holds
        uint64_t last_use = 0;
    };
    // the shapes of a fixed n_max <= 16 over two cache buckets, while their compute buffers (about
    // 1 MB each for SmolLM2's drafter, more for large drafters on a GPU) stay under MAX_GRAPH_BYTES
    static constexpr size_t MAX_GRAPH_SLOTS = 24;
    static constexpr size_t MAX_GRAPH_BYTES = size_t{256} << 20;
    GraphSlot & slot_for(const GraphKey & key);
    GraphSlot new_slot() const;  // a scheduler and graph memory, no graph
    size_t compute_buffer_bytes() const;

    std::shared_ptr<DrafterModel> model_;
    std::unique_ptr<DrafterCache> cache_;
    std::vector<ggml_context *> external_;  // weight and cache contexts: what graphs may read
    std::vector<GraphSlot> slots_;
    size_t max_slots_ = MAX_GRAPH_SLOTS;
    uint64_t n_uses_ = 0;
    uint64_t n_graph_builds_ = 0;
    double graph_setup_s_ = 0;
    // test hook (PYDFLASH2_DEBUG_REUSE_SPLIT_GRAPHS=1): one scheduler (slot) for all shapes, and
    // split graphs kept and reused in later schedules, the bug DrafterSched::check must catch
    bool reuse_split_graphs_ = false;
    std::vector<std::pair<GraphKey, std::unique_ptr<DrafterGraph>>> stale_graphs_;
    Proposal last_;
    std::vector<float> readback_;
    std::vector<float> padding_;  // zero feature rows that pad a fused inject (inject_and_propose)
};

}  // namespace pdf2
