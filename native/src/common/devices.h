// ggml device selection by name ("auto" = first GPU-type device, else CPU) and
// registration of ggml RPC servers as devices, with the checks ggml itself
// would abort on (an unreachable endpoint) done first.
#pragma once

#include <ggml-backend.h>

#include <string>
#include <vector>

namespace pdf2 {

// "" or "auto": the first GPU/iGPU device ggml offers, else the CPU; otherwise a
// device name, case-insensitive ("CPU", "CUDA0", "RPC0"). Throws Error listing
// the available devices for an unknown name.
ggml_backend_dev_t find_device(const std::string & name);

// "cpu", "gpu", "igpu", "accel" or "other": how native_info() and error messages name a device type
const char * device_type_name(enum ggml_backend_dev_type t);

// Sets the thread count of a CPU backend (through its registry: ggml-cpu's
// setter is not linked directly); a no-op for other backends.
void set_cpu_threads(ggml_backend_t backend, int n_threads);

// "CPU, RPC0 (gpu), ..." for error messages
std::string device_list();

// Registers every HOST:PORT of a comma list with ggml's RPC backend (as
// llama-server's --rpc does) and returns the names of the devices they add;
// endpoints registered before are not added again. Throws Error when the build
// has no RPC backend, an endpoint is malformed or nothing listens there.
std::vector<std::string> add_rpc_servers(const std::string & endpoints);

}  // namespace pdf2
