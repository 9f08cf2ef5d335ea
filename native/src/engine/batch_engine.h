// BatchEngine: the draft-verify loop for several requests at once (continuous
// batching, as llama-server does it). Each slot is its own llama.cpp sequence
// (seq_id = slot index) in ONE target context that this engine creates, with
// its own drafter (K/V cache), sampler and draft-length policy. One step
// drafts a block for every decoding slot, verifies all their blocks in a
// single llama_decode (each slot with the rules of the single-request
// SpecEngine), then prefills a chunk of any newly started prompt. A slot
// started between two steps joins at the next one.
#pragma once

#include "engine/draft_length.h"
#include "drafter/drafter.h"
#include "capture/feature_capture_callback.h"
#include "engine/target_runner.h"
#include "engine/target_sampling.h"

#include <llama.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pdf2 {

struct BatchEngineOptions {
    int n_slots = 1;
    int32_t n_ctx_slot = 4096;  // context of each slot (the KV cache holds n_slots x this)
    int n_threads = 0;          // one-row decodes; <= 0: llama.cpp's default
    int n_threads_batch = 0;    // larger decodes; <= 0: llama.cpp's default
    int flash_attn = -1;        // -1 auto, 0 off, 1 on
    int n_max = -1;             // drafts per block: -1 = adaptive, 0 = plain decoding
    int walk = -1;              // WalkMode, or -1 = sample when the target samples, else greedy
    int q_top_k = 16;           // DFlash1: support of the draft distribution when sampling
};

// Engine-wide counters since creation (the server turns them into metrics).
struct BatchStats {
    int64_t n_steps = 0;         // target decodes
    int64_t n_rows = 0;          // batch rows in them (filler rows included)
    int64_t n_filler_rows = 0;   // rows decoded only to keep a verify batch one ubatch (add_filler_rows)
    int64_t n_prompt = 0;        // prompt tokens prefilled
    int64_t n_prompt_reused = 0; // prompt tokens whose K/V a slot already held
    int64_t n_generated = 0;     // tokens committed (first tokens included)
    int64_t n_drafts = 0;        // drafted blocks verified
    int64_t n_draft_tokens = 0;  // drafted tokens verified
    int64_t n_accepted = 0;      // ... of which accepted
    std::vector<int64_t> accepted_per_pos;  // accepted at block position 1..max_draft
    double draft_s = 0, decode_s = 0, inject_s = 0;
    // per-phase breakdown of step() (seconds): inject_s (feature copies + drafter
    // inject graphs), propose_s (drafter propose graphs + read-back), walk_s,
    // verify_decode_s / prefill_decode_s (the target decodes: decode_s is their sum),
    // verify_logic_s (logit rows, acceptance, rollback), graph_setup_s (drafter
    // graph builds/allocations, taken out of inject/propose), step_s (all of step()).
    double propose_s = 0, walk_s = 0, verify_decode_s = 0, prefill_decode_s = 0, verify_logic_s = 0;
    double graph_setup_s = 0, step_s = 0;
    int64_t n_graph_builds = 0;
};

class BatchEngine {
  public:
    // model: the target (it must outlive the engine). drafters: one per slot
    // (each with its own cache), or empty for plain decoding (n_max = 0).
    BatchEngine(llama_model * model, const std::vector<Drafter *> & drafters, const BatchEngineOptions & opts);
    ~BatchEngine();
    BatchEngine(const BatchEngine &) = delete;
    BatchEngine & operator=(const BatchEngine &) = delete;

    int n_slots() const { return static_cast<int>(slots_.size()); }
    int max_draft() const { return max_draft_; }
    int32_t n_ctx_slot() const { return opts_.n_ctx_slot; }
    llama_context * ctx() const { return ctx_.get(); }

    void set_costs(const std::vector<double> & verify_s, const std::vector<double> & draft_s);
    // Times target decodes of B = 1..max_draft+1 rows and drafter blocks of
    // n = 1..max_draft drafts on a slot that has finished its prefill.
    void measure_costs(int slot, int reps, std::vector<double> & verify_s, std::vector<double> & draft_s);

    // Queues a prompt on an idle slot; it is prefilled by the next step(s),
    // from the first token where it differs from what the slot holds (the
    // previous request's prompt and answer: a shared system prompt is reused,
    // as llama-server and llama-cpp-python reuse it).
    void start(int slot, const std::vector<llama_token> & prompt, const SamplingParams & sampling);
    // Frees a slot for the next request; a no-op on an idle slot. Its K/V
    // rows stay for prefix reuse.
    void stop(int slot);
    // Rows of the slot's last prompt that start() reused (not prefilled).
    int32_t n_reused(int slot) { return slot_at(slot).n_reused; }
    // Rows of `prompt` that start() on this idle slot would reuse (what it holds
    // from its last request): a scheduler gives a request the slot that holds most.
    int32_t cached_prefix(int slot, const std::vector<llama_token> & prompt);

    // One target decode for all busy slots. counts[s]: tokens committed for
    // slot s (0 = none this step, -1 = its context is full), written to
    // tokens[s * (max_draft+1) ...]. Returns the rows decoded (0 = all idle).
    int step(std::vector<int32_t> & counts, std::vector<llama_token> & tokens);

    const BatchStats & stats() const { return stats_; }
    std::string stats_json() const;

  private:
    enum class State { Idle, Prefill, Decode, Full };

    struct Slot {
        State state = State::Idle;
        Drafter * drafter = nullptr;
        std::vector<llama_token> prompt;
        // tokens at positions 0.. whose K/V the slot's sequence holds (and its
        // drafter, cached or queued); kept after stop() so that the next
        // request on the slot prefills only what differs from its prompt
        std::vector<llama_token> history;
        int32_t n_prefilled = 0;
        int32_t n_reused = 0;
        int32_t pos = 0;  // next position to decode
        llama_token anchor = -1;
        std::unique_ptr<TargetSampler> sampler;
        DraftLengthPolicy policy{0};
        std::vector<float> queued_features;  // committed rows not yet injected into the drafter
        std::vector<int32_t> queued_positions;
        // this step
        std::vector<llama_token> drafts;
        std::vector<SparseDist> q;
        int32_t row0 = 0, n_rows = 0;
    };

    struct ContextDeleter {
        void operator()(llama_context * c) const { llama_free(c); }
    };

    int choose_n_draft(Slot & s);
    int batch_draft_length(const std::vector<size_t> & decoding) const;
    void draft(Slot & s, int n);
    void queue_rows(Slot & s, int32_t row0, int32_t n, int32_t pos0);
    int32_t reuse_prefix(Slot & s, int slot, const std::vector<llama_token> & prompt);
    void flush_rows(Slot & s);
    void add_row(llama_token token, int32_t pos, int seq, bool logits);
    // n rows for sequence seq after what it holds, when its stream has room: see step()
    void add_filler_rows(int seq, int n);
    void remove_filler_rows();
    void decode_batch(bool prefill, bool lazy_head = false);  // prefill: a prompt chunk (else verify rows)
    void finish_decode(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens);
    void finish_prefill(int idx, Slot & s, std::vector<int32_t> & counts, std::vector<llama_token> & tokens);
    Slot & slot_at(int slot);
    // &capture_ when the target's features need the evaluation callback (no taps), else null
    CallbackCapture * capture_for(const llama_model * model, const std::vector<int32_t> & layers);

    BatchEngineOptions opts_;
    CallbackCapture capture_;  // the context's cb_eval user data: declared before ctx_, so it outlives it
    std::unique_ptr<llama_context, ContextDeleter> ctx_;  // declared before target_: freed after it
    TargetRunner target_;
    std::vector<Slot> slots_;
    int max_draft_ = 0;
    bool feed_drafters_ = false;
    llama_batch batch_;
    int32_t batch_cap_ = 0;
    // filler rows need sequences whose K/V can be cut back (not recurrent or hybrid memory)
    bool fill_gaps_ = false;
    std::vector<std::pair<int, int32_t>> fillers_;  // this decode's filler rows: sequence, first position
    int prefill_cursor_ = 0;  // round-robin start for prompt chunks
    unsigned probe_turn_ = 0;  // round-robin choice of the slot that probes
    BatchStats stats_;
    std::vector<double> costs_verify_, costs_draft_;  // reapplied to each new request's policy
    // acceptance seen over all requests: a new request starts from it, not
    // from the optimistic prior (short requests would end before it settled)
    DraftLengthPolicy shared_policy_{0};
    std::vector<float> feat_;
};

}  // namespace pdf2
