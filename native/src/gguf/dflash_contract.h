// The dflash GGUF contract (shared doc section 3): which keys and tensors a
// drafter file must carry, with which ggml shapes and types. Checked on the
// gguf metadata alone, before any weight is read or any ggml op is built, so
// that nothing a file contains can reach a GGML_ASSERT.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct gguf_context;

namespace pdf2 {

struct DrafterHParams {
    int version = 1;  // 1 = DFlash, 2 = DFlash2 (has selector_hidden.weight)

    uint32_t n_layer = 0;
    uint32_t n_embd = 0;
    uint32_t n_ff = 0;
    uint32_t n_head = 0;
    uint32_t n_head_kv = 0;
    uint32_t head_dim = 0;  // attention.key_length == attention.value_length
    uint32_t n_vocab = 0;
    uint32_t n_vocab_draft = 0;  // rows of the draft head (d2t length, else n_vocab)
    uint32_t n_ctx_train = 0;
    float rms_eps = 0.0f;
    float rope_freq_base = 0.0f;

    uint32_t block_size = 0;
    int32_t mask_token_id = -1;
    std::vector<int32_t> target_layers;  // target layer INPUT indices (HF id + 1)

    uint32_t conv_kernel_size = 0;
    uint32_t conv_group_size = 0;
    uint32_t selector_rank = 0;
    uint32_t selector_top_k = 0;

    bool causal = false;
    uint32_t sliding_window = 0;
    std::vector<bool> sliding_window_pattern;  // per layer; empty = all layers
    float logit_scale = 0.0f;    // 0 = unset
    float logit_softcap = 0.0f;  // 0 = unset
    float embedding_scale = 0.0f;  // 0 = unset

    bool has_token_embd = false;
    bool has_output = false;
    bool has_d2t = false;

    std::string name;
    uint64_t file_size = 0;
    int64_t n_tensors = 0;
    uint64_t n_params = 0;
};

// Reads the hyperparameters and checks every key and tensor (names, shapes,
// types, data inside the file). Throws pdf2::Error naming the problem.
DrafterHParams check_dflash_contract(const gguf_context * gguf, uint64_t file_size);

// Opens path with the gguf C API (metadata only) and runs check_dflash_contract.
DrafterHParams inspect_drafter_file(const std::string & path);

std::string hparams_to_json(const DrafterHParams & hp);

}  // namespace pdf2
