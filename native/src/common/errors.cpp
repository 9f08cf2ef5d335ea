#include "common/errors.h"

#include <cstdlib>
#include <cstring>

namespace pdf2 {

static thread_local std::string g_last_error;

void set_last_error(const std::string & msg) { g_last_error = msg; }
void clear_last_error() { g_last_error.clear(); }

char * dup_string(const std::string & s) {
    char * out = static_cast<char *>(std::malloc(s.size() + 1));
    if (out == nullptr) {
        throw std::bad_alloc();
    }
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
    return out;
}

}  // namespace pdf2

extern "C" const char * pdf2_last_error(void) { return pdf2::g_last_error.c_str(); }

extern "C" void pdf2_free_string(char * s) { std::free(s); }
