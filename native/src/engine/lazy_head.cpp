#include "engine/lazy_head.h"

#include "common/devices.h"
#include "common/errors.h"

#include <string>

namespace pdf2 {

LazyHead::LazyHead(const ggml_tensor * weight, int32_t n_threads)
    : weight_(weight), n_embd_(weight->ne[0]), n_vocab_(weight->ne[1]) {
    try {
        build(n_threads);
    } catch (...) {
        release();  // the destructor does not run for a constructor that throws
        throw;
    }
}

void LazyHead::build(int32_t n_threads) {
    ggml_backend_buffer_type_t buft = ggml_backend_buffer_get_type(weight_->buffer);
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev == nullptr && ggml_backend_buft_is_host(buft)) {
        dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);  // mmap'd weights (CPU_Mapped) name no device
    }
    if (dev == nullptr) {
        throw Error(std::string("lazy head: the head weight's buffer (") + ggml_backend_buft_name(buft) +
                    ") belongs to no device");
    }
    backend_ = ggml_backend_dev_init(dev, nullptr);
    if (backend_ == nullptr) {
        throw Error(std::string("lazy head: cannot start device ") + ggml_backend_dev_name(dev));
    }
    set_cpu_threads(backend_, n_threads);
    const ggml_init_params params = {ggml_tensor_overhead() * 4 + ggml_graph_overhead_custom(8, false), nullptr, true};
    ctx_ = ggml_init(params);
    in_ = ggml_new_tensor_2d(ctx_, GGML_TYPE_F32, n_embd_, 1);
    ggml_set_name(in_, "lazy_head_hidden");
    ggml_set_input(in_);
    // the graph reads llama.cpp's own weight tensor (not a copy)
    out_ = ggml_mul_mat(ctx_, const_cast<ggml_tensor *>(weight_), in_);
    ggml_set_name(out_, "lazy_head_logits");
    ggml_set_output(out_);
    graph_ = ggml_new_graph_custom(ctx_, 8, false);
    ggml_build_forward_expand(graph_, out_);
    if (!ggml_backend_supports_op(backend_, out_)) {
        throw Error(std::string("lazy head: ") + ggml_backend_name(backend_) + " cannot multiply a " +
                    ggml_type_name(weight_->type) + " head");
    }
    alloc_ = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_));
    if (alloc_ == nullptr || !ggml_gallocr_alloc_graph(alloc_, graph_)) {
        throw Error("lazy head: cannot allocate the head graph");
    }
}

LazyHead::~LazyHead() { release(); }

void LazyHead::release() {
    if (alloc_) ggml_gallocr_free(alloc_);
    if (ctx_) ggml_free(ctx_);
    if (backend_) ggml_backend_free(backend_);
    alloc_ = nullptr;
    ctx_ = nullptr;
    backend_ = nullptr;
}

void LazyHead::logits(const float * hidden, float * out) {
    ggml_backend_tensor_set(in_, hidden, 0, static_cast<size_t>(n_embd_) * sizeof(float));
    if (ggml_backend_graph_compute(backend_, graph_) != GGML_STATUS_SUCCESS) {
        throw Error("lazy head: the head computation failed");
    }
    ggml_backend_tensor_get(out_, out, 0, static_cast<size_t>(n_vocab_) * sizeof(float));
}

}  // namespace pdf2
