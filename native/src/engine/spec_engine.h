// SpecEngine: the draft-verify loop (shared doc §4) over a target llama_context
// made by llama-cpp-python and our Drafter. One step drafts a block, verifies
// it in one target decode, commits the accepted prefix plus the bonus token,
// rolls the target cache back, and feeds the committed rows to the drafter.
#pragma once

#include "engine/draft_length.h"
#include "drafter/drafter.h"
#include "engine/target_runner.h"
#include "engine/target_sampling.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace pdf2 {

struct EngineOptions {
    int n_max = -1;  // drafts per block: -1 = adaptive, 0 = plain decoding
    int walk = -1;   // WalkMode, or -1 = sample when the target samples, else greedy
    int q_top_k = 16;  // DFlash1: support of the draft distribution when sampling
};

struct EngineStats {
    int64_t n_prompt = 0;
    int64_t n_generated = 0;  // tokens handed out, the first (from prefill) included
    int64_t n_steps = 0;      // target forwards after prefill
    int64_t n_spec_steps = 0; // ... of which verified a drafted block
    std::vector<int64_t> drafted;   // per block position 1..block_size-1
    std::vector<int64_t> accepted;
    std::vector<int64_t> n_max_used;  // histogram over 0..block_size-1
    double prefill_s = 0, draft_s = 0, verify_s = 0, inject_s = 0;
    // Where a request's time goes (seconds; they partition step() and begin()):
    // prefill_s (target prompt decode, without feature copies), inject_s (feature
    // copies + drafter inject graphs), propose_s (drafter propose graph + read-back),
    // walk_s (selector walk + draft distributions), verify_decode_s (the target's
    // llama_decode of [anchor, drafts]), verify_logic_s (logit rows, acceptance,
    // cache rollback), graph_setup_s (drafter graph builds/allocations, taken out
    // of inject/propose), step_other_s (the rest of step(): bookkeeping).
    double propose_s = 0, walk_s = 0, verify_decode_s = 0, verify_logic_s = 0, graph_setup_s = 0;
    double step_s = 0;  // all of step()
};

class SpecEngine {
  public:
    // capture: the context's CallbackCapture when its features come through the callback path.
    SpecEngine(llama_context * target, Drafter * drafter, const EngineOptions & opts,
               CallbackCapture * capture = nullptr);

    void set_costs(const std::vector<double> & verify_s, const std::vector<double> & draft_s);
    // Times target decodes of B = 1..max_draft+1 tokens and drafter blocks of n = 1..max_draft
    // drafts at the current position (after begin()); restores the state.
    void measure_costs(int reps, std::vector<double> & verify_s, std::vector<double> & draft_s);

    // Prefills the prompt (target + drafter) and returns the first generated token.
    llama_token begin(const std::vector<llama_token> & prompt, const SamplingParams & sampling);
    // One draft-verify step: appends the committed tokens to out and returns how
    // many (>= 1); 0 when the context is full.
    // max_new > 0: the caller wants at most max_new more tokens, so the step
    // drafts at most max_new - 1 (upstream caps its drafts the same way; rows
    // verified past the end would be thrown away). <= 0: no cap.
    int step(std::vector<llama_token> & out, int max_new = 0);

    // The target context was created with this capture's evaluation callback:
    // verify decodes stop before the LM head, which then runs only for the rows
    // the verify reaches (lazy_head.h). Null: every verify row's logits, as usual.
    void set_head_capture(CallbackCapture * capture);

    // Hands the target context back as it was (no layer-input capture).
    void release_target() { target_.release(); }

    int max_draft() const { return max_draft_; }
    // Lowers max_draft (before costs are set): exact mode keeps verify batches
    // below the sizes where ggml switches the target's matmul kernels.
    void cap_draft(int max_draft);
    int32_t position() const { return pos_; }
    const EngineStats & stats() const { return stats_; }
    std::string stats_json() const;

  private:
    int choose_n_draft();
    void reset_stats();
    // Committed rows are queued on the host and handed to the drafter in one
    // batch right before it drafts: runs of plain steps (adaptive mode) then
    // cost a memcpy per token instead of a drafter graph per token.
    void queue_rows(int32_t row0, int32_t n, int32_t pos0);
    void flush_rows();

    TargetRunner target_;
    Drafter * drafter_;  // may be null: plain decoding only
    EngineOptions opts_;
    int max_draft_ = 0;
    bool feed_drafter_ = false;  // inject committed rows (false for fixed plain decoding)
    DraftLengthPolicy policy_;
    std::unique_ptr<TargetSampler> sampler_;
    EngineStats stats_;
    int32_t pos_ = 0;
    llama_token anchor_ = -1;
    bool started_ = false;
    std::vector<float> queued_features_;
    std::vector<int32_t> queued_positions_;
    std::vector<float> feat_;
    std::vector<llama_token> batch_;
    double in_begin_s_ = 0;  // the inject + graph setup seconds spent in begin() (outside step())
    uint64_t graph_builds0_ = 0;    // the drafter's build count when the request began
    bool lazy_head_ = false;
    int64_t head_rows0_ = 0;        // lazily computed head rows when the request began
};

}  // namespace pdf2
