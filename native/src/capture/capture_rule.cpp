#include "capture/capture_rule.h"

#include "common/json_writer.h"

namespace pdf2 {

namespace {

struct TapArch {
    const char * name;
    bool last_layer_output;  // graph also records t_layer_inp[n_layer]
};

// Architectures whose graph records layer inputs (res->t_layer_inp in
// src/models/*.cpp of the pinned llama.cpp). Asking any other graph for them
// aborts inside llama_decode, so they are only ever asked through this table.
// nemotron_h_moe, hunyuan-dense, lfm2moe and llama-embed reuse the graph of
// nemotron_h, hunyuan_vl, lfm2 and llama (tools/audit_layer_outputs.py lists them).
const TapArch TAP_ARCHS[] = {
    {"llama", false},      {"qwen3", false},       {"qwen3moe", false},     {"qwen3next", false},
    {"qwen35", false},     {"qwen35moe", false},   {"qwen4exp", false},     {"gemma4", false},
    {"muse-glimmer", false}, {"deepseek4", true},  {"nemotron_h", true},    {"nemotron_h_moe", true},
    {"bailingmoe3", false}, {"hunyuan_vl", false}, {"gpt-oss", false},      {"lfm2", false},
    {"minimax-01", false}, {"minimax-m2", false},  {"mimo2", true},         {"nanbeige", false},
    {"hunyuan-dense", false}, {"lfm2moe", false},  {"llama-embed", false},
};

const TapArch * find_tap(const std::string & arch) {
    for (const TapArch & a : TAP_ARCHS) {
        if (arch == a.name) {
            return &a;
        }
    }
    return nullptr;
}

}  // namespace

const char * capture_path_name(CapturePath p) { return p == CapturePath::Tap ? "tap" : "callback"; }

CapturePath capture_path(const std::string & arch) {
    return find_tap(arch) != nullptr ? CapturePath::Tap : CapturePath::Callback;
}

int32_t min_feature_layer() { return 1; }

int32_t max_feature_layer(const std::string & arch, int32_t n_layer, CapturePath path) {
    if (path == CapturePath::Callback) {
        return n_layer;  // l_out-(n_layer-1): the last layer's output
    }
    const TapArch * a = find_tap(arch);
    return a != nullptr && a->last_layer_output ? n_layer : n_layer - 1;
}

std::string capture_rule_json(const std::string & arch, int32_t n_layer) {
    const CapturePath path = capture_path(arch);
    JsonWriter w;
    w.begin_object();
    w.field("arch", arch);
    w.field("path", capture_path_name(path));
    w.field("n_layer", static_cast<int64_t>(n_layer));
    w.field("min_layer", static_cast<int64_t>(min_feature_layer()));
    w.field("max_layer", static_cast<int64_t>(max_feature_layer(arch, n_layer, path)));
    w.key("max_layer_by_path").begin_object();
    if (path == CapturePath::Tap) {
        w.field("tap", static_cast<int64_t>(max_feature_layer(arch, n_layer, CapturePath::Tap)));
    }
    w.field("callback", static_cast<int64_t>(max_feature_layer(arch, n_layer, CapturePath::Callback)));
    w.end_object();
    w.key("tap_archs").begin_array();
    for (const TapArch & a : TAP_ARCHS) {
        w.value(a.name);
    }
    w.end_array();
    w.end_object();
    return w.str();
}

}  // namespace pdf2
