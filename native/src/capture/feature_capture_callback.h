// CallbackCapture: drafter features read through llama.cpp's graph evaluation
// callback (llama_context_params.cb_eval), for targets whose architecture has
// no layer-input taps. Every model builder names its per-layer output
// `l_out-<il>`; the input of layer L (what dflash.target_layers asks for) is
// the output of layer L-1. While armed, the callback asks the scheduler for
// exactly those tensors (nothing else gets synchronised) and copies their rows
// to host memory right after they are computed.
//
// The capture is installed when the context is created (cb_eval_user_data =
// this object) and must outlive the context's last decode. It observes
// nothing until armed, so the context also serves plain decoding.
//
// The same callback serves the lazy LM head (engine/lazy_head.h): every graph
// llama.cpp builds ends in `result_norm` (the final hidden states) and
// `result_output` (the head). The callback learns from any full decode whether
// the head is one plain mul_mat(output, result_norm), and which weight it
// reads. With the head cut on, a decode stops right after result_norm, whose
// rows are copied here: the verify then runs the head only for the rows it
// reaches instead of every drafted row.
#pragma once

#include <ggml.h>

#include <cstdint>
#include <string>
#include <vector>

namespace pdf2 {

class CallbackCapture {
  public:
    // The function to put in llama_context_params.cb_eval (user data: this object).
    static bool eval_callback(ggml_tensor * t, bool ask, void * user_data);

    // Before a decode: capture the inputs of `layers` (>= 1) for n_rows tokens of n_embd floats.
    void arm(const std::vector<int32_t> & layers, int32_t n_embd, int32_t n_rows);
    void disarm();

    // After the decode: throws pdf2::Error naming the first layer whose input
    // was not observed (the graph names no `l_out-<L-1>`) or had an unexpected shape.
    void check_complete(const std::string & arch) const;

    // Rows of layer input `layer` (one of the armed layers) from the last decode: n_rows x n_embd.
    const float * rows(int32_t layer) const;
    bool armed() const { return armed_; }

    // Lazy head. head_weight(): the head's weight once a full decode showed
    // result_output = mul_mat(weight, result_norm); null while unknown, or for
    // good when the graph's head is anything else (scaled, soft-capped, biased).
    const ggml_tensor * head_weight() const { return head_usable_ ? head_weight_ : nullptr; }
    // Before a decode whose n_rows rows all output logits: stop after result_norm.
    void cut_head(int32_t n_embd, int32_t n_rows);
    // After that decode: true when the graph was cut (result_norm's rows are in hidden()).
    bool end_cut();
    const float * hidden() const { return hidden_.data(); }
    int64_t n_floats() const { return static_cast<int64_t>(n_rows_) * n_embd_; }  // per layer

  private:
    int32_t slot_of_output(const char * name) const;  // index into layers_ for `l_out-<il>`, or -1
    void copy(int32_t slot, const ggml_tensor * t);

    bool armed_ = false;
    std::vector<int32_t> layers_;        // layer inputs asked for
    std::vector<int32_t> slot_by_output_;  // [il] -> slot whose layer input is l_out-<il>, or -1
    std::vector<std::vector<float>> data_;  // per slot: n_rows x n_embd
    std::vector<uint8_t> seen_;
    std::vector<std::string> problem_;   // per slot: why the observed tensor was unusable
    int64_t n_asked_ = 0;                // nodes the scheduler showed since arm(): 0 = callback not installed
    int32_t n_embd_ = 0;
    int32_t n_rows_ = 0;

    void learn_head(const ggml_tensor * t);
    bool copy_hidden(const ggml_tensor * t);
    const ggml_tensor * head_weight_ = nullptr;
    bool head_usable_ = false;
    bool head_seen_ = false;  // a result_output was shown: head_usable_ is final
    bool cutting_ = false;
    bool cut_done_ = false;
    int32_t cut_embd_ = 0;
    int32_t cut_rows_ = 0;
    std::vector<float> hidden_;  // cut_rows_ x cut_embd_
};

}  // namespace pdf2
