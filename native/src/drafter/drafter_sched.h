// DrafterSched: the ggml scheduler that runs the drafter's graphs on its
// device (+ the CPU), and the checks that turn what ggml_backend_sched would
// assert on into an Error.
//
// ggml_backend_sched_split_graph rewrites a graph in place: a node's input
// that lives on another backend is redirected to a copy in the scheduler's
// own context, and some backends (CUDA, Metal, Vulkan) reorder the nodes. So
// a graph is allocated once and may run again only while the scheduler still
// holds it; after the scheduler ran another graph, a fresh graph is built (as
// llama.cpp does). On the CPU alone nothing is redirected, which is why reusing
// a graph across schedules only broke on other devices.
#pragma once

#include <ggml-backend.h>
#include <ggml.h>

#include <string>
#include <unordered_set>
#include <vector>

namespace pdf2 {

struct DrafterGraph;

class DrafterSched {
  public:
    // device may equal cpu (then the scheduler has the CPU alone); external:
    // the contexts of the pre-allocated tensors graphs may read (weights, cache)
    DrafterSched(ggml_backend_t device, ggml_backend_t cpu, size_t graph_size,
                 const std::vector<ggml_context *> & external);
    ~DrafterSched();
    DrafterSched(const DrafterSched &) = delete;
    DrafterSched & operator=(const DrafterSched &) = delete;

    // the graph currently allocated (and runnable again as is), or null
    const DrafterGraph * held() const { return held_; }
    // resets the scheduler, checks g and allocates it; throws Error
    void alloc(DrafterGraph & g);
    // runs the held graph g (inputs already set); throws Error
    void compute(DrafterGraph & g);
    // writes the host-memory compute tensors of the allocated graph g once (zeros), so that
    // their pages are resident from now on instead of first touched while serving
    void write_host_pages(const DrafterGraph & g) const;
    // forgets the held graph (its next run needs a fresh graph)
    void release();

    // throws Error naming the tensor and op when the scheduler would assert on gf
    void check(const DrafterGraph & g) const;
    // bytes of the compute buffers it allocated, over its backends
    size_t buffer_bytes() const;

  private:
    std::string backend_names() const;

    std::vector<ggml_backend_t> backends_;
    std::unordered_set<const ggml_tensor *> external_;
    size_t graph_size_;
    ggml_backend_sched_t sched_ = nullptr;
    const DrafterGraph * held_ = nullptr;
};

}  // namespace pdf2
