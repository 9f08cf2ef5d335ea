// LazyHead: the target's LM head, run one row at a time.
//
// A verify batch [anchor, d1..dn] needs the logits of row j only while drafts
// 1..j were accepted: after the first rejection the rest are thrown away. On
// SmolLM2 the head (49,152 x 576) is a fifth of a row's compute, and a block of
// 8 rows usually keeps 1-2 of them. So the verify decode stops after the final
// norm (CallbackCapture::cut_head) and this class multiplies the head weight,
// the very tensor llama.cpp's graph reads, by each hidden row the verify
// reaches: in all, the target computes the head once per committed token, as
// plain decoding does.
//
// The head runs on the backend of the weight's buffer (the CPU, or the device
// the target offloaded it to) as a one-row mul_mat: the kernel plain one-row
// decoding uses for its head, so the logits are those plain decoding would
// compute from the same hidden state.
#pragma once

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml.h>

#include <cstdint>
#include <vector>

namespace pdf2 {

class LazyHead {
  public:
    // weight: [n_embd, n_vocab] (the graph's result_output src0); n_threads: for a CPU backend.
    LazyHead(const ggml_tensor * weight, int32_t n_threads);
    ~LazyHead();
    LazyHead(const LazyHead &) = delete;
    LazyHead & operator=(const LazyHead &) = delete;

    const ggml_tensor * weight() const { return weight_; }
    int64_t n_vocab() const { return n_vocab_; }
    // logits (n_vocab floats) of one hidden row (n_embd floats)
    void logits(const float * hidden, float * out);

  private:
    void build(int32_t n_threads);
    void release();

    const ggml_tensor * weight_;
    int64_t n_embd_, n_vocab_;
    ggml_backend_t backend_ = nullptr;
    ggml_context * ctx_ = nullptr;
    ggml_gallocr_t alloc_ = nullptr;
    ggml_cgraph * graph_ = nullptr;
    ggml_tensor * in_ = nullptr;
    ggml_tensor * out_ = nullptr;
};

}  // namespace pdf2
