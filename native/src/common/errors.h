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

// Copies s into a malloc'd C string for the caller to free with pdf2_free_string.
char * dup_string(const std::string & s);

}  // namespace pdf2
