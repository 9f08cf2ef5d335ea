// DrafterModel: a dflash drafter GGUF loaded into ggml backend buffers, plus
// the target's token embedding / output head wrapped in place over an mmap of
// the target GGUF. Owns the compute backends (the chosen device + the CPU).
#pragma once

#include "gguf/dflash_contract.h"

#include <ggml-backend.h>
#include <ggml.h>

#include <cstddef>
#include <string>
#include <vector>

namespace pdf2 {

struct DrafterLayer {
    ggml_tensor * attn_norm = nullptr;
    ggml_tensor * wq = nullptr;
    ggml_tensor * wk = nullptr;
    ggml_tensor * wv = nullptr;
    ggml_tensor * wo = nullptr;
    ggml_tensor * q_norm = nullptr;
    ggml_tensor * k_norm = nullptr;
    ggml_tensor * ffn_norm = nullptr;
    ggml_tensor * ffn_gate = nullptr;
    ggml_tensor * ffn_up = nullptr;
    ggml_tensor * ffn_down = nullptr;
    // DFlash2 local convolution
    ggml_tensor * attn_conv_base = nullptr;
    ggml_tensor * attn_conv_proj = nullptr;
    ggml_tensor * ffn_conv_base = nullptr;
    ggml_tensor * ffn_conv_proj = nullptr;
};

struct ModelOptions {
    std::string device;  // ggml device name (e.g. "CPU", "CUDA0"); "" / "auto" = first GPU, else CPU
    int n_threads = 0;   // CPU threads; <= 0 = hardware concurrency
};

class DrafterModel {
  public:
    DrafterModel(const std::string & drafter_path, const std::string & target_path, const ModelOptions & opts);
    ~DrafterModel();
    DrafterModel(const DrafterModel &) = delete;
    DrafterModel & operator=(const DrafterModel &) = delete;

    const DrafterHParams & hparams() const { return hp_; }
    bool is_v2() const { return hp_.version == 2; }

    // weights
    ggml_tensor * fc = nullptr;
    ggml_tensor * enc_norm = nullptr;  // hidden_norm
    ggml_tensor * out_norm = nullptr;  // final norm
    ggml_tensor * tok_embd = nullptr;  // drafter's own, else the target's
    ggml_tensor * output = nullptr;    // drafter's own, else the target's (tied: token_embd)
    ggml_tensor * d2t = nullptr;
    ggml_tensor * d2t_ids = nullptr;  // d2t as I32 [1, V_draft] (get_rows reads I32): draft row -> target id
    ggml_tensor * sel_hidden = nullptr;
    ggml_tensor * sel_pred = nullptr;
    ggml_tensor * sel_succ = nullptr;
    std::vector<DrafterLayer> layers;

    ggml_backend_dev_t device() const { return dev_; }
    const std::string & device_name() const { return device_name_; }
    ggml_backend_t backend() const { return backend_; }          // the chosen device
    ggml_backend_t backend_cpu() const { return backend_cpu_; }  // always present (sched needs it last)
    bool device_is_cpu() const { return backend_ == backend_cpu_; }
    int n_threads() const { return n_threads_; }
    // the contexts holding every weight tensor (drafter, target host, target device)
    std::vector<ggml_context *> weight_contexts() const {
        return {ctx_drafter_, ctx_target_, ctx_target_dev_, ctx_d2t_ids_};
    }
    bool target_head_mapped() const { return target_mapped_; }  // some target tensors wrap the mmap in place

  private:
    void init_backends(const ModelOptions & opts);
    void load_drafter(const std::string & path);
    void load_target(const std::string & path);
    void make_d2t_ids();
    void release();

    DrafterHParams hp_;
    ggml_backend_dev_t dev_ = nullptr;
    std::string device_name_;
    ggml_backend_t backend_ = nullptr;
    ggml_backend_t backend_cpu_ = nullptr;
    int n_threads_ = 1;

    ggml_context * ctx_drafter_ = nullptr;
    ggml_backend_buffer_t buf_drafter_ = nullptr;
    ggml_context * ctx_target_ = nullptr;
    ggml_backend_buffer_t buf_target_ = nullptr;      // host tensors wrapping the mapping
    ggml_context * ctx_target_dev_ = nullptr;
    ggml_backend_buffer_t buf_target_dev_ = nullptr;  // tensors copied to the device
    ggml_context * ctx_d2t_ids_ = nullptr;
    ggml_backend_buffer_t buf_d2t_ids_ = nullptr;
    void * map_addr_ = nullptr;
    size_t map_size_ = 0;
    bool target_mapped_ = false;
};

}  // namespace pdf2
