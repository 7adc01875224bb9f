"""A trainer stand-in that reports READY, prints a step, then dies in native code: libstdc++
throws a std::runtime_error that nothing catches, so the C++ runtime prints
`terminate called after throwing an instance of 'std::runtime_error'` and `what(): ...` and
aborts (SIGABRT), as a CUDA or NCCL extension's uncaught exception does."""

import ctypes
import os
import socket
import time

# sd_notify(READY=1) by hand: the unit is Type=notify and NotifyAccess=all.
address = os.environ["NOTIFY_SOCKET"]
address = "\0" + address[1:] if address.startswith("@") else address
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
    sock.connect(address)
    sock.sendall(b"READY=1\nSTATUS=step 1")
print("step 1 | loss 2.5000", flush=True)
time.sleep(2)
# std::__throw_runtime_error(const char*) of libstdc++ itself: a real C++ throw, no handler above it.
throw = ctypes.CDLL("libstdc++.so.6")._ZSt21__throw_runtime_errorPKc
throw(b"fault injected: an extension's C++ exception that nothing catches")
