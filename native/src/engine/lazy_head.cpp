#include "engine/lazy_head.h"

#include "common/devices.h"
#include "common/errors.h"

#include <algorithm>
#include <string>

namespace pdf2 {

HeadChoice choose_head(const std::vector<double> & lazy_s, const std::vector<double> & full_s, double head_s) {
    HeadChoice c;
    c.head_s = head_s;
    size_t n = std::min(lazy_s.size(), full_s.size());
    for (size_t i = 1; i < n; ++i) {
        if (lazy_s[i] <= 0.0 || full_s[i] <= 0.0) n = i;  // the measured sizes: 1..n
    }
    if (n < 2 || head_s <= 0.0) return c;
    c.measured = true;
    std::vector<double> extra(n, 0.0);  // [i]: size i + 1
    for (size_t i = 1; i < n; ++i) extra[i] = full_s[i] - lazy_s[i];
    const auto smoothed = [&](size_t i) {
        std::vector<double> w;
        for (size_t j = i > 3 ? i - 2 : 1; j < std::min(n, i + 3); ++j) w.push_back(extra[j]);
        std::nth_element(w.begin(), w.begin() + static_cast<std::ptrdiff_t>(w.size() / 2), w.end());
        return w[w.size() / 2];
    };
    c.extra_s = smoothed(1);
    c.extra_last_s = smoothed(n - 1);
    for (size_t i = 1; i < n; ++i) {
        const double e = smoothed(i);
        if (e > head_s) {
            c.extra_last_s = e;
            break;
        }
        c.full_rows = static_cast<int>(i) + 1;
    }
    return c;
}

LazyHead::LazyHead(const ggml_tensor * weight, int32_t n_threads)
    : weight_(weight), n_embd_(weight->ne[0]), n_vocab_(weight->ne[1]) {
    try {
        start_backend(n_threads);
        (void) product(1);  // a head this backend cannot multiply fails here, before any verify
    } catch (...) {
        release();  // the destructor does not run for a constructor that throws
        throw;
    }
}

void LazyHead::start_backend(int32_t n_threads) {
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
}

namespace {
void free_product_parts(ggml_context *& ctx, ggml_gallocr_t & alloc) {
    if (alloc) ggml_gallocr_free(alloc);
    if (ctx) ggml_free(ctx);
    alloc = nullptr;
    ctx = nullptr;
}
}  // namespace

LazyHead::Product & LazyHead::product(int32_t rows) {
    if (rows < 1 || rows > MAX_ROWS) {
        throw Error("lazy head: " + std::to_string(rows) + " rows (1.." + std::to_string(MAX_ROWS) + ")");
    }
    Product & kept = products_[rows - 1];
    if (kept.graph != nullptr) return kept;
    Product p;
    try {
        const ggml_init_params params = {ggml_tensor_overhead() * 4 + ggml_graph_overhead_custom(8, false), nullptr,
                                         true};
        p.ctx = ggml_init(params);
        p.in = ggml_new_tensor_2d(p.ctx, GGML_TYPE_F32, n_embd_, rows);
        ggml_set_name(p.in, "lazy_head_hidden");
        ggml_set_input(p.in);
        // the graph reads llama.cpp's own weight tensor (not a copy)
        p.out = ggml_mul_mat(p.ctx, const_cast<ggml_tensor *>(weight_), p.in);
        ggml_set_name(p.out, "lazy_head_logits");
        ggml_set_output(p.out);
        p.graph = ggml_new_graph_custom(p.ctx, 8, false);
        ggml_build_forward_expand(p.graph, p.out);
        if (!ggml_backend_supports_op(backend_, p.out)) {
            throw Error(std::string("lazy head: ") + ggml_backend_name(backend_) + " cannot multiply a " +
                        ggml_type_name(weight_->type) + " head");
        }
        p.alloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend_));
        if (p.alloc == nullptr || !ggml_gallocr_alloc_graph(p.alloc, p.graph)) {
            throw Error("lazy head: cannot allocate the head graph");
        }
    } catch (...) {
        free_product_parts(p.ctx, p.alloc);
        throw;
    }
    kept = p;
    return kept;
}

LazyHead::~LazyHead() { release(); }

void LazyHead::release() {
    for (Product & p : products_) {
        free_product_parts(p.ctx, p.alloc);
        p = Product{};
    }
    if (backend_) ggml_backend_free(backend_);
    backend_ = nullptr;
}

void LazyHead::logits(const float * hidden, int32_t rows, float * out) {
    Product & p = product(rows);
    ggml_backend_tensor_set(p.in, hidden, 0, static_cast<size_t>(n_embd_) * static_cast<size_t>(rows) * sizeof(float));
    if (ggml_backend_graph_compute(backend_, p.graph) != GGML_STATUS_SUCCESS) {
        throw Error("lazy head: the head computation failed");
    }
    ggml_backend_tensor_get(p.out, out, 0, static_cast<size_t>(n_vocab_) * static_cast<size_t>(rows) * sizeof(float));
}

}  // namespace pdf2
