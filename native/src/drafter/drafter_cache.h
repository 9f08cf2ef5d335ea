// DrafterCache: the drafter's own K/V rows of committed context positions.
// Row r of every layer holds the K (normed, RoPE'd at its true position) and
// V of one injected target position; positions are kept on the host for the
// masks. Rows past n_ctx are scratch for the block being proposed.
#pragma once

#include <ggml-backend.h>
#include <ggml.h>

#include <cstdint>
#include <vector>

namespace pdf2 {

class DrafterModel;

class DrafterCache {
  public:
    static constexpr uint32_t BUCKET = 256;  // graphs see the cache in multiples of this many rows

    DrafterCache(const DrafterModel & model, uint32_t n_ctx, ggml_type type);
    ~DrafterCache();
    DrafterCache(const DrafterCache &) = delete;
    DrafterCache & operator=(const DrafterCache &) = delete;

    uint32_t n_ctx() const { return n_ctx_; }        // rows inject may fill
    uint32_t capacity() const { return capacity_; }  // rows allocated (n_ctx + block scratch, bucketed)
    uint32_t n_cached() const { return static_cast<uint32_t>(pos_.size()); }
    int32_t last_pos() const { return pos_.empty() ? -1 : pos_.back(); }
    const std::vector<int32_t> & positions() const { return pos_; }
    ggml_type type() const { return type_; }

    ggml_context * context() const { return ctx_; }  // holds the K/V tensors
    ggml_tensor * k(uint32_t il) const { return k_[il]; }  // [head_dim*n_head_kv, capacity]
    ggml_tensor * v(uint32_t il) const { return v_[il]; }

    // rows the graphs must see to cover n_cached + n_extra rows
    uint32_t bucket_for(uint32_t n_extra) const;

    void commit(const int32_t * positions, uint32_t n);  // after the inject graph ran
    void truncate(int32_t pos);                          // drops rows at positions >= pos

  private:
    uint32_t n_ctx_;
    uint32_t capacity_;
    ggml_type type_;
    ggml_context * ctx_ = nullptr;
    ggml_backend_buffer_t buf_ = nullptr;
    std::vector<ggml_tensor *> k_;
    std::vector<ggml_tensor *> v_;
    std::vector<int32_t> pos_;
};

}  // namespace pdf2
