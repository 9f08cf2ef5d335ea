#include "drafter/drafter_cache.h"

#include "drafter/drafter_model.h"
#include "common/errors.h"

#include <ggml-alloc.h>

#include <algorithm>
#include <string>

namespace pdf2 {

namespace {
uint32_t round_up(uint32_t x, uint32_t m) { return (x + m - 1) / m * m; }
}  // namespace

DrafterCache::DrafterCache(const DrafterModel & model, uint32_t n_ctx, ggml_type type) : n_ctx_(n_ctx), type_(type) {
    const DrafterHParams & hp = model.hparams();
    if (n_ctx < 1 || n_ctx > (1u << 24)) {
        throw Error("n_ctx must be in [1, 16777216], got " + std::to_string(n_ctx));
    }
    capacity_ = round_up(n_ctx + hp.block_size, BUCKET);
    const int64_t row = static_cast<int64_t>(hp.head_dim) * hp.n_head_kv;
    ggml_init_params ip = {ggml_tensor_overhead() * (2 * hp.n_layer + 2), nullptr, /*no_alloc =*/true};
    ctx_ = ggml_init(ip);
    for (uint32_t il = 0; il < hp.n_layer; ++il) {
        ggml_tensor * k = ggml_new_tensor_2d(ctx_, type, row, capacity_);
        ggml_tensor * v = ggml_new_tensor_2d(ctx_, type, row, capacity_);
        ggml_format_name(k, "cache_k_l%u", il);
        ggml_format_name(v, "cache_v_l%u", il);
        k_.push_back(k);
        v_.push_back(v);
    }
    buf_ = ggml_backend_alloc_ctx_tensors_from_buft(ctx_, ggml_backend_dev_buffer_type(model.device()));
    if (buf_ == nullptr) {
        ggml_free(ctx_);
        throw Error("failed to allocate the drafter KV cache (" + std::to_string(capacity_) + " rows) on " +
                    model.device_name());
    }
    ggml_backend_buffer_clear(buf_, 0);
    pos_.reserve(n_ctx);
}

DrafterCache::~DrafterCache() {
    if (buf_) ggml_backend_buffer_free(buf_);
    if (ctx_) ggml_free(ctx_);
}

uint32_t DrafterCache::bucket_for(uint32_t n_extra) const {
    return std::min(capacity_, round_up(n_cached() + n_extra, BUCKET));
}

void DrafterCache::commit(const int32_t * positions, uint32_t n) { pos_.insert(pos_.end(), positions, positions + n); }

void DrafterCache::truncate(int32_t pos) {
    auto it = std::lower_bound(pos_.begin(), pos_.end(), pos);
    pos_.erase(it, pos_.end());
}

}  // namespace pdf2
