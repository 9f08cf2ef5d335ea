#include "engine/target_runner.h"

#include "common/errors.h"
#include "common/llama_ext.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>

namespace pdf2 {

namespace {

// Which runner last set each context's taps (TargetRunner::claim): a runner that claims a context
// whose taps it set last, and nobody has set since, sets nothing (every set costs a reserve: below).
std::mutex claims_mutex;
std::unordered_map<const llama_context *, const TargetRunner *> & tap_owners() {
    static std::unordered_map<const llama_context *, const TargetRunner *> owners;
    return owners;
}

void forget_owner(const llama_context * ctx, const TargetRunner * runner) {
    const std::lock_guard<std::mutex> lock(claims_mutex);
    const auto it = tap_owners().find(ctx);
    if (it != tap_owners().end() && it->second == runner) tap_owners().erase(it);
}

}  // namespace

std::string model_arch(const llama_model * model) {
    char buf[128] = {0};
    if (llama_model_meta_val_str(model, "general.architecture", buf, sizeof(buf)) < 0) {
        return "";
    }
    return buf;
}

TargetRunner::TargetRunner(llama_context * ctx, const std::vector<int32_t> & feature_layers, CallbackCapture * capture)
    : ctx_(ctx), layers_(feature_layers) {
    if (ctx_ == nullptr) {
        throw Error("target context is NULL");
    }
    const llama_model * model = llama_get_model(ctx_);
    vocab_ = llama_model_get_vocab(model);
    n_ctx_ = static_cast<int32_t>(llama_n_ctx(ctx_));
    n_batch_ = static_cast<int32_t>(std::min(llama_n_batch(ctx_), llama_n_ubatch(ctx_)));
    n_vocab_ = llama_vocab_n_tokens(vocab_);
    n_embd_ = llama_model_n_embd(model);
    n_layer_ = llama_model_n_layer(model);
    arch_ = model_arch(model);
    // a capture given means the context was made with our callback: use it (the caller
    // chose it, normally because the architecture has no taps; see capture_rule.h)
    path_ = capture != nullptr ? CapturePath::Callback : CapturePath::Tap;
    capture_ = capture;
    if (!layers_.empty() && path_ == CapturePath::Tap && pdf2::capture_path(arch_) != CapturePath::Tap) {
        throw Error("target architecture '" + arch_ +
                    "' does not expose layer inputs in this llama.cpp: its drafter features need a target context "
                    "created with pydflash2's capture callback (pydflash2.capture.capturing_context)");
    }
    const int32_t lo = min_feature_layer();
    const int32_t hi = max_feature_layer(arch_, n_layer_, path_);
    for (const int32_t lid : layers_) {
        if (lid < lo || lid > hi) {
            throw Error("drafter taps target layer input " + std::to_string(lid) + " but the " + arch_ + " target has " +
                        std::to_string(n_layer_) + " layers (capturable inputs through the " +
                        capture_path_name(path_) + " path: " + std::to_string(lo) + ".." + std::to_string(hi) + ")");
        }
        outputs_all_rows_ = outputs_all_rows_ || (path_ == CapturePath::Callback && lid == n_layer_);
    }
}

// The context may belong to the caller and be gone here (Python frees objects
// in any order at exit), so it is not touched: release() turns the capture off
// while the context is known to be alive.
TargetRunner::~TargetRunner() { forget_owner(ctx_, this); }

void TargetRunner::release() {
    forget_owner(ctx_, this);
    if (path_ == CapturePath::Callback) {
        capture_->disarm();
        return;
    }
    for (const int32_t lid : layers_) {
        llama_set_embeddings_layer_inp(ctx_, static_cast<uint32_t>(lid), false);
    }
}

// The taps stay set: every llama_set_embeddings_layer_inp call makes llama.cpp reserve its scheduler
// again before the next decode (a worst-case graph built and allocated, every cached graph dropped).
// Turning them off for a starved plain step and on for the next verify cost that verify 1.4x a plain
// step (SmolLM2, 2 threads); with them set, a plain step's extra is one copy of its feature rows.
// The flag only says whether the engine hands the rows to the drafter (BatchEngine::queue_rows);
// the callback is armed per decode from it (BatchEngine::decode_batch).
void TargetRunner::set_feeding(bool on) { feeding_ = on; }

void TargetRunner::claim() {
    feeding_ = true;
    if (pdf2::capture_path(arch_) != CapturePath::Tap) {
        return;  // this graph has no taps (asking it for one would abort); the callback is armed per decode
    }
    // Several engines may share one context (e.g. a benchmark interleaving
    // configurations): set every tap to what this runner needs (none on the callback path),
    // unless this runner set them last (each request of a Speculator claims its context again).
    const std::lock_guard<std::mutex> lock(claims_mutex);
    const TargetRunner *& owner = tap_owners()[ctx_];
    if (owner == this) return;
    owner = this;
    const int32_t top = max_feature_layer(arch_, n_layer_, CapturePath::Tap);
    for (int32_t lid = 0; lid <= top; ++lid) {
        const bool want =
            path_ == CapturePath::Tap && std::find(layers_.begin(), layers_.end(), lid) != layers_.end();
        llama_set_embeddings_layer_inp(ctx_, static_cast<uint32_t>(lid), want);
    }
}

void TargetRunner::set_head_capture(CallbackCapture * capture) {
    head_capture_ = capture;
    head_.reset();
    head_error_.clear();
}

// Builds the head's graph before the first cut, so that a head this build cannot
// run (a device without that matmul, an unexpected shape) leaves llama.cpp to
// compute the logits as usual instead of failing a verify.
bool TargetRunner::lazy_head_ready() {
    if (head_capture_ == nullptr || !head_error_.empty()) {
        return false;
    }
    const ggml_tensor * w = head_capture_->head_weight();
    if (w == nullptr) {
        return false;  // not learned yet (no full decode seen), or not a plain mul_mat
    }
    if (head_ && head_->weight() == w) {
        return true;
    }
    head_.reset();
    if (w->ne[0] != n_embd_ || w->ne[1] != n_vocab_) {
        head_error_ = "the head weight is not [n_embd, n_vocab]";
        return false;
    }
    try {
        head_ = std::make_unique<LazyHead>(w, llama_n_threads(ctx_));
    } catch (const Error & e) {
        head_error_ = e.what();
        return false;
    }
    return true;
}

bool TargetRunner::arm_lazy_head(int32_t n) {
    // a full decode must have shown that the head is one mul_mat (lazy_head_ready)
    const bool ok = lazy_head_ready();
    if (ok) {
        head_capture_->cut_head(n_embd_, n);
    }
    return ok;
}

void TargetRunner::end_lazy_head(bool armed, int32_t n) {
    if (!lazy_read_.empty()) {  // the verify of the decode before read this many rows
        const auto read = static_cast<double>(std::count(lazy_read_.begin(), lazy_read_.end(), uint8_t{1}));
        if (read > 0.0) rows_read_ = 0.9 * rows_read_ + 0.1 * read;
        lazy_read_.clear();
    }
    last_lazy_ = armed && head_capture_->end_cut();
    if (last_lazy_) {
        lazy_n_ = n;
        // grown, never shrunk: the head writes a row before it is read, and growing back after a
        // smaller batch zero-filled 200 KB a row (SmolLM2's vocabulary) that the head then overwrote
        const size_t need = static_cast<size_t>(n) * static_cast<size_t>(n_vocab_);
        if (lazy_logits_.size() < need) lazy_logits_.resize(need);
        lazy_done_.assign(static_cast<size_t>(n), 0);
        lazy_read_.assign(static_cast<size_t>(n), 0);
    }
}

void TargetRunner::set_head_rows(int32_t n) {
    if (n < 0 || n > LazyHead::MAX_ROWS) {
        throw Error("lazy head group must be in 0.." + std::to_string(LazyHead::MAX_ROWS) + " rows, got " +
                    std::to_string(n));
    }
    forced_head_rows_ = n;
}

const float * TargetRunner::lazy_logits(int32_t row) {
    if (!last_lazy_ || row < 0 || row >= lazy_n_) {
        throw Error("target produced no logits for row " + std::to_string(row));
    }
    if (!lazy_read_[static_cast<size_t>(row)]) {
        lazy_read_[static_cast<size_t>(row)] = 1;
        lazy_rows_read_total_ += 1;
    }
    if (!lazy_done_[static_cast<size_t>(row)]) run_head(row, group_rows(row));
    return lazy_logits_.data() + static_cast<size_t>(row) * static_cast<size_t>(n_vocab_);
}

// How many rows from `row` the next product computes: this one, or a group up to the next row
// already done (a tree's rows are read along its paths, not in order).
int32_t TargetRunner::group_rows(int32_t row) {
    if (forced_head_rows_ > 0) {
        head_rows_ = forced_head_rows_;
    } else {
        if (group_s_ <= 0.0) time_head(row);
        if (lazy_done_[static_cast<size_t>(row)]) return 0;  // the timing computed it
        head_rows_ = group_s_ > 0.0 && group_s_ < rows_read_ * one_row_s_ ? LazyHead::MAX_ROWS : 1;
    }
    int32_t rows = 1;
    while (rows < head_rows_ && row + rows < lazy_n_ && !lazy_done_[static_cast<size_t>(row + rows)]) ++rows;
    return rows;
}

void TargetRunner::run_head(int32_t row, int32_t rows) {
    if (rows <= 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    head_->logits(head_capture_->hidden() + static_cast<size_t>(row) * static_cast<size_t>(n_embd_), rows,
                  lazy_logits_.data() + static_cast<size_t>(row) * static_cast<size_t>(n_vocab_));
    lazy_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fill_n(lazy_done_.begin() + row, rows, uint8_t{1});
    lazy_rows_total_ += rows;
}

// Times a one-row product (the second of two: the first finds the weight cold) and a group of the
// rows after it, from a decode with enough fresh rows (else later), the group's time scaled to
// MAX_ROWS rows along the line through both. The rows computed are kept: only rows the verify
// may not read are spent, once.
void TargetRunner::time_head(int32_t row) {
    constexpr int32_t MIN_GROUP = 3;
    int32_t fresh = 0;
    while (row + fresh < lazy_n_ && fresh < 2 + LazyHead::MAX_ROWS && !lazy_done_[static_cast<size_t>(row + fresh)]) {
        ++fresh;
    }
    const int32_t group = fresh - 2;
    if (group < MIN_GROUP) return;
    const auto timed = [&](int32_t r, int32_t n) {  // run_head's own clock
        const double s0 = lazy_seconds_;
        run_head(r, n);
        return lazy_seconds_ - s0;
    };
    (void) timed(row, 1);
    const double one = timed(row + 1, 1);
    const double many = timed(row + 2, group);
    one_row_s_ = std::max(one, 1e-9);
    group_s_ = std::max(one_row_s_, one + (many - one) * (LazyHead::MAX_ROWS - 1) / static_cast<double>(group - 1));
}

void TargetRunner::append_features(const int32_t * rows, int32_t n, std::vector<float> & out) const {
    const size_t row_floats = static_cast<size_t>(n_embd_);
    std::vector<const float *> layer_rows(layers_.size());
    for (size_t k = 0; k < layers_.size(); ++k) {
        layer_rows[k] = path_ == CapturePath::Callback
                            ? capture_->rows(layers_[k])
                            : llama_get_embeddings_layer_inp(ctx_, static_cast<uint32_t>(layers_[k]));
        if (layer_rows[k] == nullptr) {
            throw Error("target layer input " + std::to_string(layers_[k]) +
                        " was not captured (is this target architecture supported by upstream's extraction?)");
        }
    }
    // appended in place (a resize first zero-filled the rows it then overwrote: both passes miss
    // the cache, which the verify's head products ran through after the decode wrote the rows)
    for (int32_t i = 0; i < n; ++i) {
        for (size_t k = 0; k < layers_.size(); ++k) {
            const float * src = layer_rows[k] + static_cast<size_t>(rows[i]) * row_floats;
            out.insert(out.end(), src, src + row_floats);
        }
    }
}

void check_drafter_fits(const Drafter & drafter, const TargetRunner & target, uint32_t ctx_rows,
                        const std::string & ctx_what) {
    const DrafterHParams & hp = drafter.hparams();
    if (static_cast<int32_t>(hp.n_embd) != target.n_embd()) {
        throw Error("drafter hidden size " + std::to_string(hp.n_embd) + " does not match the target's " +
                    std::to_string(target.n_embd()));
    }
    if (static_cast<int32_t>(hp.n_vocab) != target.n_vocab()) {
        throw Error("drafter vocabulary (" + std::to_string(hp.n_vocab) + ") does not match the target's (" +
                    std::to_string(target.n_vocab()) + ")");
    }
    if (drafter.cache().n_ctx() < ctx_rows) {
        throw Error("drafter cache (" + std::to_string(drafter.cache().n_ctx()) + " rows) is smaller than " +
                    ctx_what + " (" + std::to_string(ctx_rows) + ")");
    }
}

}  // namespace pdf2
