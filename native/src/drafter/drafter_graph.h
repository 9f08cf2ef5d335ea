// ggml graphs of the drafter, built top-down like llama.cpp's src/models/*.cpp:
//  - inject:  target features -> fc -> hidden_norm -> per layer K/V rows into the cache
//  - propose: block [anchor, MASK...] through all layers over [cache; block],
//             final norm, target head, and (DFlash2) the selector lattice.
// A graph is built once per shape and reused: per-call data goes in through
// input tensors (ggml_backend_tensor_set).
#pragma once

#include <ggml.h>

#include <cstdint>
#include <memory>

namespace pdf2 {

class DrafterModel;
class DrafterCache;

struct DrafterGraph {
    ggml_context * ctx = nullptr;
    ggml_cgraph * gf = nullptr;
    int n_tokens = 0;  // block length (propose) or rows (inject)
    int n_kv = 0;      // cache rows the attention sees (propose)

    // inputs
    ggml_tensor * tokens = nullptr;    // I32 [n]            propose
    ggml_tensor * features = nullptr;  // F32 [n_tl*H, n]    inject
    ggml_tensor * pos = nullptr;       // I32 [n]
    ggml_tensor * rows = nullptr;      // I64 [n] cache rows written
    ggml_tensor * mask = nullptr;      // F16 [n_kv, n]
    ggml_tensor * mask_swa = nullptr;  // F16 [n_kv, n] (sliding-window layers), or null

    // propose graphs that also inject m committed rows first (one graph per step instead of two)
    int n_inject = 0;
    ggml_tensor * inj_features = nullptr;  // F32 [n_tl*H, m]
    ggml_tensor * inj_pos = nullptr;       // I32 [m]
    ggml_tensor * inj_rows = nullptr;      // I64 [m] cache rows written

    // output: DFlash2: F32 [k + k*k, n-1] (candidate ids as floats | scores, predecessor-major)
    //         DFlash1: F32 [n_vocab, n-1] logits of the drafted positions
    ggml_tensor * out = nullptr;

    ~DrafterGraph();
};

// mem: null, or drafter_graph_ctx_bytes(model) bytes (16-byte aligned) that hold the graph's
// tensor metadata, and must outlive it: a graph slot builds each of its shapes in the same
// memory, so that rebuilding allocates nothing (the server rebuilds often; contexts freed and
// taken again fragmented its heap)
std::unique_ptr<DrafterGraph> build_inject_graph(const DrafterModel & model, const DrafterCache & cache, int n_rows,
                                                 void * mem = nullptr);
// n_inject > 0: the graph first writes the K/V rows of n_inject context rows (as an inject
// graph would), then proposes over the cache including them
std::unique_ptr<DrafterGraph> build_propose_graph(const DrafterModel & model, const DrafterCache & cache, int n_tokens,
                                                  int n_kv, int n_inject = 0, void * mem = nullptr);

// nodes a drafter graph may need (for the scheduler and graph contexts)
size_t drafter_graph_size(const DrafterModel & model);
// bytes of a graph's context (tensor and graph metadata; no data)
size_t drafter_graph_ctx_bytes(const DrafterModel & model);

}  // namespace pdf2
