// The C API's opaque pdf2_drafter handle, shared by the drafter and engine entry points.
#pragma once

#include "drafter/drafter.h"

#include <memory>

struct pdf2_drafter {
    std::unique_ptr<pdf2::Drafter> impl;
};
