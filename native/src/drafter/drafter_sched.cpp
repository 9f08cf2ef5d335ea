#include "drafter/drafter_sched.h"

#include "drafter/drafter_graph.h"
#include "common/errors.h"

#include <cstring>
#include <unordered_set>

namespace pdf2 {

namespace {

bool is_view_op(ggml_op op) {
    return op == GGML_OP_VIEW || op == GGML_OP_RESHAPE || op == GGML_OP_PERMUTE || op == GGML_OP_TRANSPOSE;
}

ggml_backend_buffer_t storage(const ggml_tensor * t) { return t->view_src ? t->view_src->buffer : t->buffer; }

std::string describe(const ggml_tensor * t) {
    return "'" + std::string(t->name) + "' (" + ggml_op_desc(t) + ", " + ggml_type_name(t->type) + ")";
}

}  // namespace

DrafterSched::DrafterSched(ggml_backend_t device, ggml_backend_t cpu, size_t graph_size,
                           const std::vector<ggml_context *> & external)
    : graph_size_(graph_size) {
    for (ggml_context * ctx : external) {
        if (ctx == nullptr) continue;
        for (ggml_tensor * t = ggml_get_first_tensor(ctx); t != nullptr; t = ggml_get_next_tensor(ctx, t)) {
            external_.insert(t);
        }
    }
    if (device != cpu) backends_.push_back(device);
    backends_.push_back(cpu);  // the scheduler takes the last backend for the CPU
    sched_ = ggml_backend_sched_new(backends_.data(), nullptr, static_cast<int>(backends_.size()), graph_size, false,
                                    true);
    if (sched_ == nullptr) {
        throw Error("failed to create the ggml scheduler");
    }
}

DrafterSched::~DrafterSched() {
    if (sched_) ggml_backend_sched_free(sched_);
}

std::string DrafterSched::backend_names() const {
    std::string out;
    for (ggml_backend_t b : backends_) out += (out.empty() ? "" : ", ") + std::string(ggml_backend_name(b));
    return out;
}

// Mirrors the assertions of ggml_backend_sched_alloc_graph / split_graph
// (ggml-backend.cpp), in the order the scheduler meets them.
void DrafterSched::check(const DrafterGraph & g) const {
    std::unordered_set<const ggml_tensor *> own;
    for (ggml_tensor * t = ggml_get_first_tensor(g.ctx); t != nullptr; t = ggml_get_next_tensor(g.ctx, t)) {
        own.insert(t);
        // an allocation left from an earlier schedule would be taken as pre-allocated
        if (t->view_src == nullptr && t->buffer != nullptr) {
            throw Error("drafter graph tensor " + describe(t) + " is still allocated by an earlier schedule");
        }
    }
    std::unordered_set<const ggml_tensor *> all;
    const int n_nodes = ggml_graph_n_nodes(g.gf);
    for (int i = 0; i < n_nodes; ++i) {
        const ggml_tensor * node = ggml_graph_node(g.gf, i);
        all.insert(node);
        for (int j = 0; j < GGML_MAX_SRC; ++j) {
            const ggml_tensor * src = node->src[j];
            if (src == nullptr) continue;
            all.insert(src);
            // "all inputs should be assigned by now": an input is built by this
            // graph or is a weight / the cache, never a scheduler's copy from
            // an earlier split (not dereferenced: it may be gone)
            if (own.count(src) == 0 && external_.count(src) == 0) {
                throw Error("input #" + std::to_string(j) + " of drafter node " + describe(node) +
                            " is neither built by this graph nor a weight or cache tensor (left over from an "
                            "earlier schedule)");
            }
        }
    }
    // the scheduler's hash set holds graph_size tensors
    if (all.size() > graph_size_) {
        throw Error("drafter graph has " + std::to_string(all.size()) + " tensors, more than the scheduler's " +
                    std::to_string(graph_size_));
    }
    for (const ggml_tensor * t : all) {
        const ggml_backend_buffer_t buf = storage(t);
        bool placed = false;
        bool runnable = false;
        for (ggml_backend_t b : backends_) {
            const bool op_ok = ggml_backend_supports_op(b, t);
            runnable = runnable || op_ok;
            placed = placed || (buf != nullptr && op_ok && ggml_backend_supports_buft(b, ggml_backend_buffer_get_type(buf)));
        }
        // "pre-allocated tensor in a buffer that cannot run the operation"
        if (buf != nullptr && !placed) {
            throw Error("drafter tensor " + describe(t) + " lives in a " + ggml_backend_buffer_name(buf) +
                        " buffer where none of the drafter's backends (" + backend_names() + ") can run it");
        }
        // "all nodes should be assigned by now"
        if (buf == nullptr && t->op != GGML_OP_NONE && !is_view_op(t->op) && !runnable) {
            throw Error("none of the drafter's backends (" + backend_names() + ") supports " + describe(t));
        }
    }
}

void DrafterSched::alloc(DrafterGraph & g) {
    release();
    check(g);
    if (!ggml_backend_sched_alloc_graph(sched_, g.gf)) {
        ggml_backend_sched_reset(sched_);
        throw Error("failed to allocate the drafter's compute buffers on " + backend_names());
    }
    held_ = &g;
}

void DrafterSched::compute(DrafterGraph & g) {
    if (held_ != &g) {
        throw Error("internal: the drafter ran a graph the scheduler does not hold");
    }
    if (ggml_backend_sched_graph_compute(sched_, g.gf) != GGML_STATUS_SUCCESS) {
        release();
        throw Error("drafter graph computation failed on " + backend_names());
    }
}

size_t DrafterSched::buffer_bytes() const {
    size_t total = 0;
    for (ggml_backend_t b : backends_) total += ggml_backend_sched_get_buffer_size(sched_, b);
    return total;
}

void DrafterSched::write_host_pages(const DrafterGraph & g) const {
    if (held_ != &g) {
        throw Error("internal: writing the pages of a graph the scheduler does not hold");
    }
    for (ggml_tensor * t = ggml_get_first_tensor(g.ctx); t != nullptr; t = ggml_get_next_tensor(g.ctx, t)) {
        if (t->view_src != nullptr || t->buffer == nullptr || t->data == nullptr) continue;
        if (!ggml_backend_buffer_is_host(t->buffer)) continue;  // device memory is not the process's RSS
        std::memset(t->data, 0, ggml_nbytes(t));
    }
}

void DrafterSched::release() {
    held_ = nullptr;
    ggml_backend_sched_reset(sched_);
}

}  // namespace pdf2
