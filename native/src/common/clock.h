// The one clock the native code times its work with: a monotonic clock, and the seconds since a
// point of it.
#pragma once

#include <chrono>

namespace pdf2 {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace pdf2
