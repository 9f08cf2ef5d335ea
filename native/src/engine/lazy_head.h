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
// compute from the same hidden state. Where reading the weight, not the
// arithmetic, bounds the product (an F32 or F16 head, a GPU), a product of
// several rows costs about one row's, so the runner may ask for rows in
// groups (TargetRunner::lazy_logits): on SmolLM2 requantized to F32 (2 CPU
// threads) lazy one-row products made auto 1.69x plain decoding on the agentic
// prompts where the head in the decode's graph made it 2.11x (issue 57).
#pragma once

#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml.h>

#include <cstdint>
#include <vector>

namespace pdf2 {

// Where the full head (every verify row's head in the decode's graph) costs no more than the lazy
// one, from measured tables over verify sizes b = 1..B: lazy_s[b-1] a decode cut before the head
// plus one row's product, full_s[b-1] the same decode with every row's head, head_s one more row's
// product. A verify that accepts a draft reads a second row, and what the full head adds to a
// decode is all the head its verify then needs: so a size takes the full head where full_s -
// lazy_s, the b rows' head beyond the one the lazy table holds, is at most head_s. Where the head's
// weight, not its arithmetic, bounds it (an F32 head on a CPU, a GPU), a few rows cost about one
// row's product and small verifies take the full head; where the arithmetic does (Q4_1 on a CPU, or
// the many rows of a deep tree) every row adds its share and the lazy head wins. The difference is
// smoothed (the median of the sizes b-2..b+2) against the tables' noise, and the sizes that take the
// full head are the first ones: full_rows, the largest size up to which every size does (0: none).
// Sizes without both measured (0) stop the count.
struct HeadChoice {
    bool measured = false;  // both tables held a size >= 2
    int full_rows = 0;      // verifies of at most this many rows take the full head
    double extra_s = 0.0;   // the smoothed full - lazy at size 2 and at full_rows + 1 (or B), for the record
    double extra_last_s = 0.0;
    double head_s = 0.0;
};
HeadChoice choose_head(const std::vector<double> & lazy_s, const std::vector<double> & full_s, double head_s);

class LazyHead {
  public:
    // weight: [n_embd, n_vocab] (the graph's result_output src0); n_threads: for a CPU backend.
    LazyHead(const ggml_tensor * weight, int32_t n_threads);
    ~LazyHead();
    LazyHead(const LazyHead &) = delete;
    LazyHead & operator=(const LazyHead &) = delete;

    const ggml_tensor * weight() const { return weight_; }
    int64_t n_vocab() const { return n_vocab_; }
    // logits (rows x n_vocab floats, row by row) of `rows` consecutive hidden rows (n_embd floats
    // each); rows in 1..MAX_ROWS
    void logits(const float * hidden, int32_t rows, float * out);
    static constexpr int32_t MAX_ROWS = 8;

  private:
    // one graph per number of rows, built on first use (a graph's shapes are fixed)
    struct Product {
        ggml_context * ctx = nullptr;
        ggml_gallocr_t alloc = nullptr;
        ggml_cgraph * graph = nullptr;
        ggml_tensor * in = nullptr;
        ggml_tensor * out = nullptr;
    };
    void start_backend(int32_t n_threads);
    Product & product(int32_t rows);
    void release();

    const ggml_tensor * weight_;
    int64_t n_embd_, n_vocab_;
    ggml_backend_t backend_ = nullptr;
    Product products_[MAX_ROWS];  // [rows - 1]
};

}  // namespace pdf2
