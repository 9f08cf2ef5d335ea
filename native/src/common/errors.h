// Error plumbing for the C API: C++ code throws pdf2::Error, the C boundary
// catches everything and stores the message per thread.
#pragma once

#include <stdexcept>
#include <string>

namespace pdf2 {

// A user-facing failure (bad file, bad argument, full cache...). The message
// is shown to Python users as is, so it names the offending key/tensor/value.
struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void set_last_error(const std::string & msg);
void clear_last_error();

// Runs fn and turns any exception into a stored message; returns fallback then.
template <typename T, typename Fn>
T guarded(T fallback, Fn && fn) noexcept {
    try {
        clear_last_error();
        return fn();
    } catch (const std::exception & e) {
        set_last_error(e.what());
    } catch (...) {
        set_last_error("unknown native error");
    }
    return fallback;
}

// The object behind a C API handle (a struct that owns it in `impl`), or an Error
// naming the handle when it is NULL: every entry point checks before it touches one.
template <typename Handle>
auto & handle_impl(Handle * h, const char * what) {
    if (h == nullptr || !h->impl) {
        throw Error(std::string(what) + " handle is NULL");
    }
    return *h->impl;
}

// Copies s into a malloc'd C string for the caller to free with pdf2_free_string.
char * dup_string(const std::string & s);

}  // namespace pdf2
