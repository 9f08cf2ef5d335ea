// TargetRunner: the target model's llama_context as the draft-verify loop
// uses it (the engine decodes; the context may belong to llama-cpp-python):
// which layer inputs it captures and how, the captured rows (the drafter's
// features), and the lazy LM head's rows.
//
// Features come through one of two capture paths (capture_rule.h): llama.cpp's
// layer-input taps where the architecture has them, else a CallbackCapture
// installed in the context as its graph evaluation callback.
#pragma once

#include "capture/capture_rule.h"
#include "capture/feature_capture_callback.h"
#include "drafter/drafter.h"
#include "engine/lazy_head.h"

#include <llama.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace pdf2 {

std::string model_arch(const llama_model * model);  // general.architecture, or "" if absent

class TargetRunner {
  public:
    // feature_layers: target layer INPUT indices to capture (dflash.target_layers); empty = none.
    // capture: the CallbackCapture the context was created with (its cb_eval user data), or
    // null. Taps are used where the architecture has them; otherwise the capture is required.
    TargetRunner(llama_context * ctx, const std::vector<int32_t> & feature_layers,
                 CallbackCapture * capture = nullptr);
    ~TargetRunner();
    TargetRunner(const TargetRunner &) = delete;
    TargetRunner & operator=(const TargetRunner &) = delete;

    // The capture whose evaluation callback the context was created with, for the lazy
    // head (it may also be the feature capture). Null turns the lazy head off.
    void set_head_capture(CallbackCapture * capture);
    // Around the engine's llama_decode: arm the cut before a decode of n rows that all
    // output logits (false: the lazy head cannot run, decode as usual), and note after it
    // whether the graph was cut; lazy_logits(row) then, rows in the order the verify needs them.
    bool arm_lazy_head(int32_t n);
    void end_lazy_head(bool armed, int32_t n);
    bool last_decode_lazy() const { return last_lazy_; }
    const float * lazy_logits(int32_t row);

    // Why the lazy head cannot run here ("" while it can, or has not been tried).
    const std::string & lazy_head_error() const { return head_error_; }
    // Rows whose head ran lazily, and the seconds it took, since creation.
    int64_t lazy_head_rows() const { return lazy_rows_total_; }
    int64_t lazy_head_rows_read() const { return lazy_rows_read_total_; }  // by the verifies (groups: fewer)
    double lazy_head_seconds() const { return lazy_seconds_; }
    // Rows per head product: 1 (one at a time), or a group of LazyHead::MAX_ROWS where the group is
    // expected to cost less than the rows the verifies read one by one: where reading the weight,
    // not the arithmetic, bounds a product (an F32 head on a CPU: 8 rows cost 2.2 one-row products),
    // once verifies read more rows than that. The first lazy decode with enough fresh rows times a
    // one-row product and a group (once); the rows read per verify are a running mean.
    // head_rows(): the last decode's choice (0: none yet). set_head_rows(n > 0) fixes it (tests);
    // 0 chooses again.
    int32_t head_rows() const { return head_rows_; }
    void set_head_rows(int32_t n);
    int32_t forced_head_rows() const { return forced_head_rows_; }

    // Features of the last decode's rows rows[0..n), n x (n_layers * n_embd) floats, appended to
    // out (the drafter's feed: one copy).
    void append_features(const int32_t * rows, int32_t n, std::vector<float> & out) const;
    int32_t feature_width() const { return static_cast<int32_t>(layers_.size()) * n_embd_; }

    void claim();    // make the context capture exactly this runner's layers (before each request)
    // Whether the next decodes' rows go to the drafter: a plain step whose rows the drafter need
    // not see skips our copy of them (and, on the callback path, the capture's). The taps stay
    // set either way (target_runner.cpp says why).
    void set_feeding(bool on);
    bool feeding() const { return feeding_; }
    void release();  // stop capturing layer inputs (call while the context is alive)

    CapturePath capture_path() const { return path_; }
    const std::vector<int32_t> & feature_layers() const { return layers_; }
    // true when a captured layer exists only for rows that output logits (the last
    // layer's output on the callback path): every row must then ask for logits
    bool outputs_all_rows() const { return outputs_all_rows_; }
    const std::string & arch() const { return arch_; }

    int32_t n_ctx() const { return n_ctx_; }
    int32_t n_batch() const { return n_batch_; }
    int32_t n_vocab() const { return n_vocab_; }
    int32_t n_embd() const { return n_embd_; }
    int32_t n_layer() const { return n_layer_; }
    const llama_vocab * vocab() const { return vocab_; }
    llama_context * ctx() const { return ctx_; }

  private:
    llama_context * ctx_;
    const llama_vocab * vocab_;
    std::vector<int32_t> layers_;
    std::string arch_;
    CapturePath path_ = CapturePath::Tap;
    CallbackCapture * capture_ = nullptr;  // set on the callback path
    bool outputs_all_rows_ = false;  // the last layer's output exists only for rows that output logits
    int32_t n_ctx_, n_batch_, n_vocab_, n_embd_, n_layer_;

    bool lazy_head_ready();
    void run_head(int32_t row, int32_t rows);  // rows row..row+rows-1 of the last decode
    void time_head(int32_t row);
    int32_t group_rows(int32_t row);

    CallbackCapture * head_capture_ = nullptr;
    std::unique_ptr<LazyHead> head_;
    std::string head_error_;
    bool last_lazy_ = false;                 // the last decode stopped before the head
    int32_t lazy_n_ = 0;                     // its rows
    std::vector<float> lazy_logits_;         // lazy_n_ x n_vocab_ (or more), row j valid once lazy_done_[j]
    std::vector<uint8_t> lazy_done_;
    bool feeding_ = true;
    int64_t lazy_rows_total_ = 0, lazy_rows_read_total_ = 0;
    double lazy_seconds_ = 0;
    std::vector<uint8_t> lazy_read_;  // rows of the last decode the verify read
    int32_t head_rows_ = 0, forced_head_rows_ = 0;
    double one_row_s_ = 0.0, group_s_ = 0.0;  // a one-row product and a MAX_ROWS group (0: not timed)
    double rows_read_ = 1.0;                  // per lazy decode, a running mean
};

// The checks both engines make before pairing a drafter with a target: hidden size and
// vocabulary equal to the target's, and a drafter cache of at least ctx_rows rows (the
// context a sequence can reach; ctx_what names it in the error).
void check_drafter_fits(const Drafter & drafter, const TargetRunner & target, uint32_t ctx_rows,
                        const std::string & ctx_what);

}  // namespace pdf2
