// C entry points of the feature-capture rule and the callback capture.
#include "capture/capture_handle.h"
#include "capture/capture_rule.h"
#include "common/errors.h"

#include "pydflash2.h"

#include <cstring>
#include <string>
#include <vector>

namespace {

// cb_eval_user_data is the pdf2_capture handle itself
bool capture_eval(ggml_tensor * t, bool ask, void * user_data) {
    auto * c = static_cast<pdf2_capture *>(user_data);
    return pdf2::CallbackCapture::eval_callback(t, ask, c != nullptr ? capture_impl(c) : nullptr);
}

const pdf2::CallbackCapture & get(const pdf2_capture * c) {
    if (c == nullptr) {
        throw pdf2::Error("capture handle is NULL");
    }
    return c->impl;
}

}  // namespace

extern "C" char * pdf2_capture_rule_json(const char * arch, int32_t n_layer) {
    return pdf2::guarded<char *>(nullptr, [&] {
        if (arch == nullptr || n_layer < 1) {
            throw pdf2::Error("capture rule needs an architecture name and n_layer >= 1");
        }
        return pdf2::dup_string(pdf2::capture_rule_json(arch, n_layer));
    });
}

extern "C" pdf2_capture * pdf2_capture_new(void) {
    return pdf2::guarded<pdf2_capture *>(nullptr, [] { return new pdf2_capture(); });
}

extern "C" void pdf2_capture_free(pdf2_capture * c) { delete c; }

extern "C" void * pdf2_capture_eval_callback(void) { return reinterpret_cast<void *>(&capture_eval); }

extern "C" int pdf2_capture_arm(pdf2_capture * c, const int32_t * layers, int32_t n_layers, int32_t n_embd,
                                int32_t n_rows) {
    return pdf2::guarded<int>(-1, [&] {
        get(c);
        if (layers == nullptr || n_layers < 1 || n_embd < 1 || n_rows < 1) {
            throw pdf2::Error("capture arm: need at least one layer, n_embd >= 1 and n_rows >= 1");
        }
        c->impl.arm(std::vector<int32_t>(layers, layers + n_layers), n_embd, n_rows);
        return 0;
    });
}

extern "C" int pdf2_capture_disarm(pdf2_capture * c) {
    return pdf2::guarded<int>(-1, [&] {
        get(c);
        c->impl.disarm();
        return 0;
    });
}

extern "C" int pdf2_capture_check(const pdf2_capture * c, const char * arch) {
    return pdf2::guarded<int>(-1, [&] {
        get(c).check_complete(arch != nullptr ? arch : "?");
        return 0;
    });
}

extern "C" int pdf2_capture_rows(const pdf2_capture * c, int32_t layer, float * out, int64_t n_floats) {
    return pdf2::guarded<int>(-1, [&] {
        const pdf2::CallbackCapture & cap = get(c);
        if (out == nullptr || n_floats != cap.n_floats()) {
            throw pdf2::Error("capture rows: the output buffer must hold n_rows * n_embd = " +
                              std::to_string(cap.n_floats()) + " floats");
        }
        const float * rows = cap.rows(layer);
        std::memcpy(out, rows, static_cast<size_t>(n_floats) * sizeof(float));
        return 0;
    });
}
