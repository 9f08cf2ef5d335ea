// Upstream llama.cpp functions that live in the staging header src/llama-ext.h,
// which llama-cpp-python does not install. They have C++ linkage: declaring
// them here with the same signatures links against the mangled symbols that
// libllama exports.
#pragma once

#include <llama.h>

#include <cstdint>

// Capture the INPUT of target layer `lid` (= output of layer lid-1) for every token of a batch.
void llama_set_embeddings_layer_inp(llama_context * ctx, uint32_t lid, bool value);
// Rows for every token of the last batch, n_embd floats each; nullptr when not captured.
float * llama_get_embeddings_layer_inp(llama_context * ctx, uint32_t lid);
