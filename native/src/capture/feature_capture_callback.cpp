#include "capture/feature_capture_callback.h"

#include "common/errors.h"

#include <ggml-backend.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace pdf2 {

namespace {

const char L_OUT[] = "l_out-";
const char RESULT_NORM[] = "result_norm";
const char RESULT_OUTPUT[] = "result_output";

}  // namespace

bool CallbackCapture::eval_callback(ggml_tensor * t, bool ask, void * user_data) {
    auto * self = static_cast<CallbackCapture *>(user_data);
    if (self == nullptr) {
        return !ask;  // nothing wanted; after a computed node, always let the graph go on
    }
    const bool is_norm = self->cutting_ && std::strcmp(t->name, RESULT_NORM) == 0;
    if (ask) {
        if (!self->head_seen_ && std::strcmp(t->name, RESULT_OUTPUT) == 0) {
            self->learn_head(t);
        }
        if (!self->armed_) {
            return is_norm;
        }
        ++self->n_asked_;
        return is_norm || self->slot_of_output(t->name) >= 0;
    }
    if (self->armed_) {
        const int32_t slot = self->slot_of_output(t->name);
        if (slot >= 0) {
            try {
                self->copy(slot, t);
            } catch (const std::exception & e) {  // never unwind through ggml's C code
                self->problem_[static_cast<size_t>(slot)] = e.what();
            }
        }
    }
    if (is_norm) {
        // false stops the graph here: the head (result_output) is not computed
        return !self->copy_hidden(t);
    }
    return true;
}

void CallbackCapture::learn_head(const ggml_tensor * t) {
    head_seen_ = true;
    const ggml_tensor * w = t->src[0];
    const ggml_tensor * h = t->src[1];
    head_usable_ = t->op == GGML_OP_MUL_MAT && t->type == GGML_TYPE_F32 && w != nullptr && h != nullptr &&
                   std::strcmp(h->name, RESULT_NORM) == 0 && w->buffer != nullptr && w->ne[2] == 1 && w->ne[3] == 1 &&
                   ggml_is_contiguous(w);
    head_weight_ = head_usable_ ? w : nullptr;
}

void CallbackCapture::cut_head(int32_t n_embd, int32_t n_rows) {
    cutting_ = true;
    cut_done_ = false;
    cut_embd_ = n_embd;
    cut_rows_ = n_rows;
    hidden_.resize(static_cast<size_t>(n_embd) * static_cast<size_t>(n_rows));
}

bool CallbackCapture::end_cut() {
    cutting_ = false;
    return cut_done_;
}

bool CallbackCapture::copy_hidden(const ggml_tensor * t) {
    // only a tensor of the expected shape is cut at; anything else runs to the end (llama's logits stay valid)
    if (t->type != GGML_TYPE_F32 || t->ne[0] != cut_embd_ || t->ne[1] != cut_rows_ || t->ne[2] != 1 ||
        t->ne[3] != 1 || !ggml_is_contiguous(t) || t->data == nullptr) {
        return false;
    }
    ggml_backend_tensor_get(t, hidden_.data(), 0, hidden_.size() * sizeof(float));
    cut_done_ = true;
    return true;
}

int32_t CallbackCapture::slot_of_output(const char * name) const {
    if (std::strncmp(name, L_OUT, sizeof(L_OUT) - 1) != 0) {
        return -1;
    }
    const char * digits = name + sizeof(L_OUT) - 1;
    char * end = nullptr;
    const long il = std::strtol(digits, &end, 10);
    if (end == digits || *end != '\0' || il < 0 || il >= static_cast<long>(slot_by_output_.size())) {
        return -1;
    }
    return slot_by_output_[static_cast<size_t>(il)];
}

void CallbackCapture::arm(const std::vector<int32_t> & layers, int32_t n_embd, int32_t n_rows) {
    const int32_t top = layers.empty() ? 0 : *std::max_element(layers.begin(), layers.end());
    layers_ = layers;
    n_embd_ = n_embd;
    n_rows_ = n_rows;
    slot_by_output_.assign(static_cast<size_t>(top), -1);
    data_.resize(layers.size());
    seen_.assign(layers.size(), 0);
    problem_.assign(layers.size(), std::string());
    n_asked_ = 0;
    for (size_t k = 0; k < layers.size(); ++k) {
        if (layers[k] < 1) {
            throw Error("callback capture: layer input " + std::to_string(layers[k]) + " is not a layer output");
        }
        slot_by_output_[static_cast<size_t>(layers[k] - 1)] = static_cast<int32_t>(k);
        data_[k].resize(static_cast<size_t>(n_rows) * static_cast<size_t>(n_embd));
    }
    armed_ = true;
}

void CallbackCapture::disarm() { armed_ = false; }

void CallbackCapture::copy(int32_t slot, const ggml_tensor * t) {
    std::string & problem = problem_[static_cast<size_t>(slot)];
    seen_[static_cast<size_t>(slot)] = 1;
    if (t->type != GGML_TYPE_F32 || t->ne[0] != n_embd_ || t->ne[1] != n_rows_ || t->ne[2] != 1 || t->ne[3] != 1 ||
        t->nb[0] != sizeof(float)) {
        problem = std::string("it is a ") + ggml_type_name(t->type) + " tensor of shape [" + std::to_string(t->ne[0]) +
                  ", " + std::to_string(t->ne[1]) + ", " + std::to_string(t->ne[2]) + ", " + std::to_string(t->ne[3]) +
                  "], expected f32 [" + std::to_string(n_embd_) + ", " + std::to_string(n_rows_) + "]";
        return;
    }
    const ggml_tensor * owner = t->view_src != nullptr ? t->view_src : t;
    if (owner->buffer == nullptr || t->data == nullptr) {
        problem = "it has no data after compute";
        return;
    }
    float * dst = data_[static_cast<size_t>(slot)].data();
    const size_t row_bytes = static_cast<size_t>(n_embd_) * sizeof(float);
    if (t->nb[1] == row_bytes) {
        ggml_backend_tensor_get(t, dst, 0, row_bytes * static_cast<size_t>(n_rows_));
    } else {
        for (int32_t i = 0; i < n_rows_; ++i) {
            ggml_backend_tensor_get(t, dst + static_cast<size_t>(i) * n_embd_, static_cast<size_t>(i) * t->nb[1],
                                    row_bytes);
        }
    }
    problem.clear();
}

void CallbackCapture::check_complete(const std::string & arch) const {
    if (n_asked_ == 0 && !layers_.empty()) {
        throw Error("the target context was not created with this capture's evaluation callback "
                    "(llama_context_params.cb_eval / cb_eval_user_data), so no layer output was observed");
    }
    for (size_t k = 0; k < layers_.size(); ++k) {
        const int32_t il = layers_[k] - 1;
        if (!seen_[k]) {
            throw Error("target architecture '" + arch + "' names no tensor 'l_out-" + std::to_string(il) +
                        "' in its llama.cpp graph, so the input of layer " + std::to_string(layers_[k]) +
                        " (the output of layer " + std::to_string(il) + ") cannot be captured for the drafter");
        }
        if (!problem_[k].empty()) {
            throw Error("target architecture '" + arch + "': tensor 'l_out-" + std::to_string(il) + "' (input of layer " +
                        std::to_string(layers_[k]) + ") cannot serve as drafter features: " + problem_[k]);
        }
    }
}

const float * CallbackCapture::rows(int32_t layer) const {
    for (size_t k = 0; k < layers_.size(); ++k) {
        if (layers_[k] == layer && seen_[k] && problem_[k].empty()) {
            return data_[k].data();
        }
    }
    throw Error("callback capture holds no rows for layer input " + std::to_string(layer));
}

}  // namespace pdf2
