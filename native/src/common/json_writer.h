// Minimal JSON object builder: the C API hands structured results to Python
// as JSON text, which keeps the C surface small and cffi-friendly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pdf2 {

class JsonWriter {
  public:
    JsonWriter & begin_object();
    JsonWriter & end_object();
    JsonWriter & begin_array();
    JsonWriter & end_array();
    JsonWriter & key(const std::string & k);
    JsonWriter & value(const std::string & v);
    JsonWriter & value(const char * v);
    JsonWriter & value(bool v);
    JsonWriter & value(int64_t v);
    JsonWriter & value(uint64_t v);
    JsonWriter & value(int v) { return value(static_cast<int64_t>(v)); }
    JsonWriter & value(uint32_t v) { return value(static_cast<uint64_t>(v)); }
    JsonWriter & value(double v);
    JsonWriter & null();

    template <typename T>
    JsonWriter & field(const std::string & k, const T & v) {
        key(k);
        return value(v);
    }

    // a key and the array of a vector's values
    template <typename T>
    JsonWriter & array_field(const std::string & k, const std::vector<T> & v) {
        key(k).begin_array();
        for (const T & x : v) value(x);
        return end_array();
    }

    const std::string & str() const { return out_; }

  private:
    void separate();
    std::string out_;
    std::vector<bool> first_;  // per open container: no element written yet
    bool after_key_ = false;
};

}  // namespace pdf2
