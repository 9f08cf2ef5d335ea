#include "common/devices.h"

#include "common/errors.h"

#include <llama.h>

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fcntl.h>

namespace pdf2 {

namespace {

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
}

std::string trim(const std::string & s) {
    const auto b = s.find_first_not_of(" \t");
    if (b == std::string::npos) return "";
    return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

bool is_gpu(ggml_backend_dev_t d) {
    const auto t = ggml_backend_dev_type(d);
    return t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU;
}

// "HOST:PORT" split the way ggml-rpc parses it (first colon), validated here
// because ggml aborts on a malformed endpoint
void parse_endpoint(const std::string & ep, std::string & host, std::string & port) {
    const auto colon = ep.find(':');
    if (colon == std::string::npos || colon == 0 || ep.find(':', colon + 1) != std::string::npos) {
        throw Error("RPC server '" + ep + "' is not HOST:PORT (e.g. 127.0.0.1:50052)");
    }
    host = ep.substr(0, colon);
    port = ep.substr(colon + 1);
    const bool digits = !port.empty() && port.size() <= 5 &&
                        std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c); });
    if (!digits || std::stoi(port) < 1 || std::stoi(port) > 65535) {
        throw Error("RPC server '" + ep + "': port must be a number in [1, 65535]");
    }
}

// true when a TCP connection to host:port opens within timeout_ms; ggml-rpc
// aborts the process when it cannot connect, so this is asked first
bool tcp_reachable(const std::string & host, const std::string & port, int timeout_ms, std::string & why) {
    addrinfo hints{};
    hints.ai_family = AF_INET;  // ggml-rpc connects over IPv4
    hints.ai_socktype = SOCK_STREAM;
    addrinfo * res = nullptr;
    const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (rc != 0) {
        why = gai_strerror(rc);
        return false;
    }
    bool ok = false;
    for (addrinfo * a = res; a != nullptr && !ok; a = a->ai_next) {
        const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
        int r = connect(fd, a->ai_addr, a->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            pollfd p{fd, POLLOUT, 0};
            r = poll(&p, 1, timeout_ms) == 1 ? 0 : -1;
            if (r == 0) {
                int err = 0;
                socklen_t len = sizeof(err);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err != 0) {
                    errno = err;
                    r = -1;
                }
            } else {
                errno = ETIMEDOUT;
            }
        }
        if (r == 0) {
            ok = true;
        } else {
            why = std::strerror(errno);
        }
        close(fd);
    }
    freeaddrinfo(res);
    return ok;
}

bool reg_is_registered(ggml_backend_reg_t reg) {
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        if (ggml_backend_reg_get(i) == reg) return true;
    }
    return false;
}

}  // namespace

const char * device_type_name(enum ggml_backend_dev_type t) {
    switch (t) {
        case GGML_BACKEND_DEVICE_TYPE_CPU: return "cpu";
        case GGML_BACKEND_DEVICE_TYPE_GPU: return "gpu";
        case GGML_BACKEND_DEVICE_TYPE_IGPU: return "igpu";
        case GGML_BACKEND_DEVICE_TYPE_ACCEL: return "accel";
        default: return "other";
    }
}

void set_cpu_threads(ggml_backend_t backend, int n_threads) {
    ggml_backend_dev_t dev = ggml_backend_get_device(backend);
    if (dev == nullptr || ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU || n_threads <= 0) {
        return;
    }
    auto set_threads = reinterpret_cast<ggml_backend_set_n_threads_t>(
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev), "ggml_backend_set_n_threads"));
    if (set_threads) {
        set_threads(backend, n_threads);
    }
}

std::string device_list() {
    std::string out;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        out += (out.empty() ? "" : ", ") + std::string(ggml_backend_dev_name(d)) + " (" +
               device_type_name(ggml_backend_dev_type(d)) + ")";
    }
    return out;
}

ggml_backend_dev_t find_device(const std::string & name) {
    llama_backend_init();  // registers the backends the way llama.cpp does
    const std::string want = lower(trim(name));
    ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu == nullptr) {
        throw Error("this ggml build has no CPU backend");
    }
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        if (want.empty() || want == "auto") {
            if (is_gpu(d)) return d;
        } else if (lower(ggml_backend_dev_name(d)) == want) {
            return d;
        }
    }
    if (want.empty() || want == "auto" || want == "cpu") {
        return cpu;
    }
    throw Error("unknown device '" + name + "'; this ggml offers: " + device_list() +
                " (or 'auto': the first GPU, else the CPU)");
}

std::vector<std::string> add_rpc_servers(const std::string & endpoints) {
    llama_backend_init();
    ggml_backend_reg_t rpc = ggml_backend_reg_by_name("RPC");
    if (rpc == nullptr) {
        throw Error("this llama-cpp-python has no RPC backend: rebuild it with CMAKE_ARGS=\"-DGGML_RPC=ON\"");
    }
    using add_server_t = ggml_backend_reg_t (*)(const char * endpoint);
    auto add_server = reinterpret_cast<add_server_t>(ggml_backend_reg_get_proc_address(rpc, "ggml_backend_rpc_add_server"));
    if (add_server == nullptr) {
        throw Error("the RPC backend of this ggml offers no ggml_backend_rpc_add_server");
    }
    // every endpoint is checked before any is registered
    std::vector<std::string> list;
    size_t start = 0;
    while (start <= endpoints.size()) {
        const size_t comma = std::min(endpoints.find(',', start), endpoints.size());
        const std::string ep = trim(endpoints.substr(start, comma - start));
        if (!ep.empty()) list.push_back(ep);
        start = comma + 1;
    }
    if (list.empty()) {
        throw Error("no RPC server given (expected HOST:PORT[,HOST:PORT...])");
    }
    for (const std::string & ep : list) {
        std::string host, port, why;
        parse_endpoint(ep, host, port);
        if (!tcp_reachable(host, port, 5000, why)) {
            throw Error("RPC server " + ep + " is not reachable (" + why + "); start it with ggml's rpc-server");
        }
    }
    std::vector<std::string> names;
    for (const std::string & ep : list) {
        ggml_backend_reg_t reg = add_server(ep.c_str());
        if (reg == nullptr) {
            throw Error("RPC server " + ep + " offers no device");
        }
        if (!reg_is_registered(reg)) {
            ggml_backend_register(reg);
        }
        for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
            names.emplace_back(ggml_backend_dev_name(ggml_backend_reg_dev_get(reg, i)));
        }
    }
    return names;
}

}  // namespace pdf2

#include "common/json_writer.h"

#include "pydflash2.h"

extern "C" char * pdf2_device_resolve(const char * name) {
    return pdf2::guarded<char *>(nullptr, [&] {
        return pdf2::dup_string(ggml_backend_dev_name(pdf2::find_device(name ? name : "")));
    });
}

extern "C" char * pdf2_rpc_add_servers_json(const char * endpoints) {
    return pdf2::guarded<char *>(nullptr, [&] {
        const std::vector<std::string> names = pdf2::add_rpc_servers(endpoints ? endpoints : "");
        pdf2::JsonWriter w;
        w.begin_array();
        for (const std::string & n : names) w.value(n);
        w.end_array();
        return pdf2::dup_string(w.str());
    });
}
