// Which target layers a drafter may read, and how pydflash2 reads them.
//
// Two capture paths exist. "tap": llama.cpp's own layer-input extraction
// (llama_set_embeddings_layer_inp), which only the architectures whose graph
// records res->t_layer_inp support. "callback": the graph evaluation callback
// (llama_context_params.cb_eval) observing the per-layer outputs every model
// builder names `l_out-<il>`; it works on any architecture but needs a context
// created with the callback. This file is the ONE table both C++ and Python
// (through pdf2_capture_rule_json) use.
#pragma once

#include <cstdint>
#include <string>

namespace pdf2 {

enum class CapturePath { Tap, Callback };

const char * capture_path_name(CapturePath p);

// Tap where upstream records layer inputs for this architecture, callback elsewhere.
CapturePath capture_path(const std::string & arch);

// Range of dflash.target_layers values (layer INPUT indices) that `path` can
// capture on an `arch` target with n_layer layers: [1, max]. Input 0 (the token
// embeddings) is outside the dflash contract; input n_layer (the last layer's
// output) only where the path gives it.
int32_t min_feature_layer();
int32_t max_feature_layer(const std::string & arch, int32_t n_layer, CapturePath path);

// JSON object {"arch", "path", "n_layer", "min_layer", "max_layer" (path in use),
// "max_layer_by_path": {"tap" (only where taps exist), "callback"}, "tap_archs"}.
std::string capture_rule_json(const std::string & arch, int32_t n_layer);

}  // namespace pdf2
