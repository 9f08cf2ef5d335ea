"""ggml devices: which one a device string selects, and ggml RPC servers as devices.

    resolve_device("auto")                     # "CUDA0" / "Metal" / "RPC0"..., else "CPU"
    add_rpc_servers("10.0.0.2:50052,10.0.0.3:50052")   # -> ["RPC0", "RPC1"]

RPC servers are registered the way llama-server's --rpc registers them, so a
llama_cpp.Llama created afterwards with n_gpu_layers > 0 splits its layers
across them (llama.cpp's own RPC backend), and a Drafter can be placed on one
by name. An RPC server executes whatever its clients send: never expose one
beyond a trusted network.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from . import _native
from ._native import lib


class DeviceError(_native.NativeError, ValueError):
    """Unknown device name, malformed or unreachable RPC server, or no RPC backend."""


def resolve_device(name: str | None = "auto") -> str:
    """The ggml device name a device string selects: None/"auto" = the first
    GPU-type device ggml offers, else "CPU"; otherwise a device name
    (case-insensitive). Raises DeviceError listing the devices for an unknown name."""
    ptr = lib.pdf2_device_resolve(b"auto" if name is None else name.encode())
    try:
        return _native.take_string(ptr, "resolve_device")
    except _native.NativeError as e:
        raise DeviceError(str(e)) from None


def rpc_endpoints(servers: str | Sequence[str]) -> list[str]:
    """"HOST:PORT[,HOST:PORT...]" or a list of them, as a list."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    return [s.strip() for s in items if s.strip()]


def add_rpc_servers(servers: str | Sequence[str]) -> list[str]:
    """Registers ggml RPC servers as ggml devices (idempotent per endpoint) and
    returns their device names. Every endpoint is checked (HOST:PORT syntax, a
    TCP connection) before any is registered; raises DeviceError otherwise."""
    endpoints = rpc_endpoints(servers)
    if not endpoints:
        raise DeviceError("no RPC server given (expected HOST:PORT[,HOST:PORT...])")
    ptr = lib.pdf2_rpc_add_servers_json(",".join(endpoints).encode())
    try:
        return list(json.loads(_native.take_string(ptr, "add_rpc_servers")))
    except _native.NativeError as e:
        raise DeviceError(str(e)) from None
