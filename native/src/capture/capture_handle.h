// The C API's opaque pdf2_capture handle, shared by the capture and engine entry points.
#pragma once

#include "capture/feature_capture_callback.h"

struct pdf2_capture {
    pdf2::CallbackCapture impl;
};

inline pdf2::CallbackCapture * capture_impl(pdf2_capture * c) { return &c->impl; }
