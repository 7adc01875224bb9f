"""The Python exception classes a training stack raises that carry a diagnosis by themselves: a venv
that does not import, host memory, the file the run reads, a signal, a corrupt model or data file,
the distributed rendezvous, torch's own out-of-memory and DataLoader errors.

Sources: the Python 3.11 standard library documentation (Built-in Exceptions; json; pickle), the
glibc dynamic loader's messages (dlopen: "cannot open shared object file", "undefined symbol",
"version `GLIBCXX_3.4.32' not found"), safetensors 0.4-0.8 (SafetensorError and its header
messages), PyTorch 2.x (torch.OutOfMemoryError, torch.distributed's DistStoreError and
DistNetworkError as c10d's TCPStore words them, torch.distributed.elastic's rendezvous errors and
ChildFailedError, torch.utils.data's DataLoader worker errors, torch.serialization).

The OSError subclasses are listed only as Python raises them without an errno (`raise
FileNotFoundError("...")`): a line with `[Errno N]` is the errno catalogue's, which is searched
after this one; extra["errno"] names the errno each class stands for, and its verdict and action
are that errno's."""

from __future__ import annotations

import re

from .entry import Entry

PY = "Python 3.11 Built-in Exceptions (docs.python.org/3/library/exceptions.html)"
LD = "glibc ld.so (dlopen/dlerror messages), as Python's ImportError quotes them"
TORCH = "PyTorch 2.x"
DIST = "PyTorch 2.x torch.distributed (c10d TCPStore, torch/distributed/elastic)"

_CKPT = "/srv/runs/v2/checkpoints/step-300"
_SO = "/srv/venv/lib/python3.11/site-packages/flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so"


def _e(name: str, pattern: str, meaning: str, verdict: str, action: str, source: str, sample: str,
       key: str = "", **extra) -> Entry:
    if not key and name not in sample:  # quote the words of the line its pattern finds
        key = re.search(pattern, sample).group(0).strip(" :")
    return Entry("python", name, re.compile(pattern), meaning, verdict, action, source, sample, key=key, extra=extra)


# An exception's class at the start of its line (after a launcher's `[rank3]: ` prefix) or after a space.
_AT = r"(?:^|[\s:\].])"  # a class name alone or module-qualified (numpy.core._exceptions.MemoryError)

ENTRIES = (
    # --- the venv: what does not import
    _e("ModuleNotFoundError", _AT + r"ModuleNotFoundError: No module named ",
       "a package the run imports is not installed in the venv: re-sync the venv from the lock", "crash", "fix-venv",
       PY, "ModuleNotFoundError: No module named 'flash_attn'"),
    _e("ImportError-cannot-import-name", r"ImportError: cannot import name ",
       "an installed package lacks a name the code imports: its version drifted from the lock (or the code "
       "expects another one): re-sync the venv", "crash", "fix-venv", PY,
       "ImportError: cannot import name 'is_torch_greater_or_equal' from 'transformers.utils' "
       "(/srv/venv/lib/python3.11/site-packages/transformers/utils/__init__.py)"),
    _e("GLIBCXX-not-found", r"version `(?:GLIBCXX|CXXABI)_[\d.]+' not found",
       "a compiled extension needs a newer libstdc++ than the one loaded (an old system libstdc++ ahead of the "
       "venv's, or a wheel built on a newer OS): re-sync the venv or install a matching build", "crash", "fix-venv",
       LD, f"ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by "
       f"{_SO})"),
    _e("GLIBC-not-found", r"version `GLIBC_[\d.]+' not found",
       "a compiled extension was built for a newer glibc than this host's OS has: install a build for this OS "
       "(manylinux) or upgrade the host", "crash", "fix-venv", LD,
       f"ImportError: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.34' not found (required by {_SO})"),
    _e("undefined-symbol", r"undefined symbol: ",
       "a compiled extension was built against another torch, CUDA or Python than the venv's: rebuild or reinstall "
       "it for the installed torch (re-sync the venv)", "crash", "fix-venv", LD,
       f"ImportError: {_SO}: undefined symbol: _ZN3c104cuda9SetDeviceEab"),
    # libcuda and libnvidia-ml come with the driver, not the venv
    _e("driver-library-missing", r"lib(?:cuda|nvidia-ml)\.so(?:\.1)?: cannot open shared object file",
       "the NVIDIA driver's user-space library is missing on this host (or hidden from the unit): install or repair "
       "the driver", "gpu-unavailable", "fix-driver", LD,
       "OSError: libcuda.so.1: cannot open shared object file: No such file or directory"),
    _e("shared-object-missing", r"(?<!libcuda\.so)(?<!libcuda\.so\.1)(?<!libnvidia-ml\.so)(?<!libnvidia-ml\.so\.1)"
       r": cannot open shared object file",
       "a shared library an extension needs is missing from the venv or the loader's path (a CUDA library wheel "
       "not installed, LD_LIBRARY_PATH changed): re-sync the venv", "crash", "fix-venv", LD,
       "ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory"),

    # --- memory and the interpreter
    _e("MemoryError", _AT + r"MemoryError\b(?!: CUDA)",
       "the host refused the process memory (the unit's MemoryMax or the machine ran out without the OOM killer "
       "acting): lower DataLoader workers, prefetch or batch, or raise the unit's memory", "crash", "fix-config", PY,
       "MemoryError: Unable to allocate 11.2 GiB for an array with shape (3000000000,) and data type float32"),
    _e("DefaultCPUAllocator", r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)",
       "torch could not allocate host memory for a tensor: the host or the unit's memory limit ran out; lower "
       "host-side batch or prefetch, or raise the unit's memory", "crash", "fix-config", TORCH,
       "RuntimeError: [enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: "
       "you tried to allocate 34359738368 bytes. Error code 12 (Cannot allocate memory)"),
    _e("RecursionError", _AT + r"RecursionError: maximum recursion depth exceeded",
       "Python's recursion limit was hit: a recursive structure (a deeply nested config or model, a cycle) in "
       "the program", "crash", "investigate", PY, "RecursionError: maximum recursion depth exceeded while calling a "
       "Python object"),
    _e("KeyboardInterrupt", _AT + r"KeyboardInterrupt\b",
       "the process got SIGINT (Ctrl-C, or a stop that sends SIGINT): someone or something outside the run stopped "
       "it; start it again to resume from the newest checkpoint", "killed-by-signal", "rerun", PY,
       "KeyboardInterrupt", signal="SIGINT"),
    _e("torch.OutOfMemoryError", r"torch\.(?:cuda\.)?OutOfMemoryError|CUDA out of memory\. Tried to allocate",
       "torch's caching allocator found no GPU memory for a tensor: lower the batch, sequence length or model "
       "footprint, or free the GPU of other processes", "cuda-oom", "fix-config", TORCH,
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
       "79.19 GiB of which 1.06 GiB is free.", key="CUDA out of memory"),

    # --- files the run reads, raised by Python code without an errno (errno lines: the errno catalogue)
    _e("PermissionError", _AT + r"PermissionError: (?!\[Errno)",
       "the unit's user may not read or write a path the run uses (the message names it): fix its ownership, mode "
       "or the unit's ReadWritePaths=", "crash", "fix-config", PY,
       f"PermissionError: cannot write checkpoint to {_CKPT}", errno="EACCES"),
    _e("FileNotFoundError", _AT + r"FileNotFoundError: (?!\[Errno)",
       "a path the run needs does not exist (a wrong path in the run's configuration, or a file not staged)",
       "crash", "investigate", PY, f"FileNotFoundError: no checkpoint found in {_CKPT}", errno="ENOENT"),
    _e("FileExistsError", _AT + r"FileExistsError: (?!\[Errno)",
       "a path the run creates already exists (an output left by an earlier run)", "crash", "fix-config", PY,
       f"FileExistsError: output directory {_CKPT} already exists", errno="EEXIST"),
    _e("IsADirectoryError", _AT + r"IsADirectoryError: (?!\[Errno)",
       "a path the run uses as a file is a directory", "crash", "fix-config", PY,
       f"IsADirectoryError: expected a file, got the directory {_CKPT}", errno="EISDIR"),
    _e("NotADirectoryError", _AT + r"NotADirectoryError: (?!\[Errno)",
       "a path the run uses as a directory is a file", "crash", "fix-config", PY,
       f"NotADirectoryError: expected a directory, got the file {_CKPT}", errno="ENOTDIR"),
    _e("ConnectionRefusedError", _AT + r"ConnectionRefusedError: (?!\[Errno)",
       "a server the run needs refused the connection (not up, or a firewall): check it and the network",
       "crash", "check-network", PY, "ConnectionRefusedError: the rendezvous master at node1:29500 refused the "
       "connection", errno="ECONNREFUSED"),
    _e("ConnectionResetError", _AT + r"ConnectionResetError: (?!\[Errno)",
       "the other end reset the connection (it crashed, or the network dropped it)", "crash", "check-network", PY,
       "ConnectionResetError: Connection lost while reading the response", errno="ECONNRESET"),
    _e("ConnectionAbortedError", _AT + r"ConnectionAbortedError: (?!\[Errno)",
       "a connection was aborted on this side (a timeout or a network fault)", "crash", "check-network", PY,
       "ConnectionAbortedError: the connection to the store was aborted", errno="ECONNABORTED"),
    _e("BrokenPipeError", _AT + r"BrokenPipeError: (?!\[Errno)",
       "the reader of a pipe or socket went away (a worker or a peer that died first is the cause)", "crash",
       "investigate", PY, "BrokenPipeError: the DataLoader worker's result queue is closed", errno="EPIPE"),
    _e("TimeoutError", _AT + r"(?<![.\w])TimeoutError: (?!\[Errno)",
       "an operation the run waited on timed out (a server, a lock, a peer): the message names it", "crash",
       "check-network", PY, "TimeoutError: timed out waiting for the checkpoint lock", errno="ETIMEDOUT"),

    # --- corrupt or wrong data and configuration
    _e("SafetensorError-header-too-large", r"SafetensorError: .*(?:HeaderTooLarge|header too large)",
       "a .safetensors file's header is garbage (a Git LFS pointer or another format saved as .safetensors): stage "
       "the model again", "crash", "restage", "safetensors 0.4-0.8 (SafetensorError)",
       "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge",
       key="Error while deserializing header"),
    _e("SafetensorError-truncated", r"SafetensorError: .*(?:MetadataIncompleteBuffer|incomplete metadata, file not "
       r"fully covered)",
       "a .safetensors file is shorter than its header says (a download or copy cut short): stage the model again",
       "crash", "restage", "safetensors 0.4-0.8 (SafetensorError)",
       "safetensors_rust.SafetensorError: Error while deserializing header: MetadataIncompleteBuffer",
       key="Error while deserializing header"),
    _e("SafetensorError", r"SafetensorError: (?!.*(?:HeaderTooLarge|header too large|MetadataIncompleteBuffer|"
       r"incomplete metadata, file not fully covered))",
       "safetensors could not read a model file (corrupt, truncated, or not what its name says): stage it again",
       "crash", "restage", "safetensors 0.4-0.8 (SafetensorError)",
       "safetensors_rust.SafetensorError: Error while deserializing header: InvalidHeaderDeserialization"),
    _e("UnpicklingError-invalid-load-key", r"UnpicklingError: invalid load key",
       "a checkpoint read with torch.load is not a pickle/zip at all (a Git LFS pointer, an HTML error page, a "
       "truncated file): stage or copy it again", "crash", "restage", "Python 3.11 pickle; PyTorch torch.serialization",
       "_pickle.UnpicklingError: invalid load key, 'v'."),
    _e("PytorchStreamReader", r"PytorchStreamReader failed reading",
       "a torch checkpoint (a zip) is truncated or corrupt: the newest one was cut short, or the copy is broken; use "
       "an older checkpoint or stage it again", "crash", "restage", "PyTorch 2.x torch.serialization (caffe2 "
       "inline_container.cc)",
       "RuntimeError: PytorchStreamReader failed reading zip archive: failed finding central directory"),
    _e("EOFError-ran-out-of-input", r"EOFError: Ran out of input",
       "a pickled file (a cache, a checkpoint, a DataLoader worker's message) ended early: it is empty or truncated",
       "crash", "restage", "Python 3.11 pickle", "EOFError: Ran out of input"),
    _e("JSONDecodeError", r"JSONDecodeError: ",
       "a JSON file the run reads (a config, tokenizer or index file) is malformed or empty: fix or regenerate it",
       "crash", "fix-config", "Python 3.11 json (json.JSONDecodeError)",
       "json.decoder.JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
    _e("UnicodeDecodeError", _AT + r"UnicodeDecodeError: '[\w-]+' codec can't decode",
       "a text file the run reads is not in the expected encoding (binary, compressed, or another encoding): the "
       "data file is corrupt or not what its name says; stage it again", "crash", "restage", PY,
       "UnicodeDecodeError: 'utf-8' codec can't decode byte 0x8b in position 1: invalid start byte"),

    # --- torch's DataLoader workers
    _e("DataLoader-worker-killed", r"DataLoader worker \(pid\(?s?\)? ?[\d, ]+\)? is killed by signal: Killed",
       "a DataLoader worker was SIGKILLed, nearly always by the OOM killer: host memory ran out; lower workers, "
       "prefetch or batch, or raise the unit's memory", "crash", "fix-config", "PyTorch 2.x torch.utils.data",
       "RuntimeError: DataLoader worker (pid 48377) is killed by signal: Killed. "),
    _e("DataLoader-worker-bus-error", r"DataLoader worker \(pid\(?s?\)? ?[\d, ]+\)? is killed by signal: Bus error",
       "a DataLoader worker died of SIGBUS writing shared memory: /dev/shm is full or too small; enlarge or free it",
       "disk-full", "free-disk", "PyTorch 2.x torch.utils.data",
       "RuntimeError: DataLoader worker (pid 48377) is killed by signal: Bus error. It is possible that dataloader's "
       "workers are out of shared memory. Please try to raise your shared memory limit."),
    _e("DataLoader-worker-exited", r"DataLoader worker \(pid\(?s?\)? ?[\d, ]+\)? exited unexpectedly",
       "a DataLoader worker died without a Python error (a native crash or a signal): its own lines earlier, or "
       "the kernel log, say why", "crash", "investigate", "PyTorch 2.x torch.utils.data",
       "RuntimeError: DataLoader worker (pid(s) 48377, 48378) exited unexpectedly"),

    # --- the distributed rendezvous
    _e("DistStoreError-wait-timeout", r"DistStoreError: .*(?:wait timeout after|Timed out after \d+ seconds waiting)",
       "the ranks did not all reach the rendezvous store in time: a rank did not start or died, or cannot reach the "
       "master; check the other hosts and the network", "crash", "check-network", DIST,
       "torch.distributed.DistStoreError: wait timeout after 600000ms, keys: /default_pg/0//cuda//0"),
    _e("DistStoreError", r"DistStoreError: (?!.*(?:wait timeout after|Timed out after \d+ seconds waiting))",
       "the distributed rendezvous store failed: its message names how", "crash", "check-network", DIST,
       "torch.distributed.DistStoreError: Socket Timeout"),
    _e("DistNetworkError-connect-timeout", r"The client socket has timed out after \S+ while trying to connect to",
       "a rank could not reach the rendezvous master (MASTER_ADDR:MASTER_PORT): the master is not up, or the network "
       "or a firewall blocks it", "crash", "check-network", DIST,
       "torch.distributed.DistNetworkError: The client socket has timed out after 1800000ms while trying to "
       "connect to (node1, 29500)."),
    _e("DistNetworkError-recv-closed", r"Failed to recv, got 0 bytes\. Connection was likely closed",
       "the rendezvous store's server (the master rank) went away: diagnose the master's host first", "crash",
       "diagnose-peer", DIST,
       "torch.distributed.DistNetworkError: Failed to recv, got 0 bytes. Connection was likely closed. Did the "
       "remote server shutdown or crash?"),
    _e("DistNetworkError-listen", r"The server socket has failed to (?:listen on any local network address|bind)",
       "the master could not listen on its rendezvous port (taken by another run or a leftover process): give each "
       "run its own port or stop the other", "crash", "fix-config", DIST,
       "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network address. "
       "port: 29500, useIpv6: 0, code: -98, name: EADDRINUSE, message: address already in use"),
    _e("RendezvousTimeoutError", r"\bRendezvousTimeoutError\b",
       "torchrun's rendezvous did not gather its nodes in time: a node did not start or cannot reach the rendezvous "
       "endpoint", "crash", "check-network", DIST,
       "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"),
    _e("RendezvousConnectionError", r"\bRendezvousConnectionError\b",
       "torchrun could not reach its rendezvous backend (the c10d store on the endpoint host)", "crash",
       "check-network", DIST,
       "torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection to the C10d store has "
       "failed. See inner exception for details."),
    _e("RendezvousClosedError", r"\bRendezvousClosedError\b",
       "the rendezvous was closed by another node (its agent finished or failed): that node explains the end",
       "peer-failure", "diagnose-peer", DIST, "torch.distributed.elastic.rendezvous.api.RendezvousClosedError"),
    # torchrun's agent on a signal: it stops its workers with the same signal and exits
    _e("death-signal", r"Received \d+ death signal, shutting down workers|SignalException: Process \d+ got signal",
       "the launcher (torchrun's agent) received a signal from outside the run and stopped its workers: find who "
       "sent it", "killed-by-signal", "rerun", DIST,
       "torch.distributed.elastic.agent.server.api:Received 15 death signal, shutting down workers",
       key="death signal"),
    _e("state_dict-mismatch", r"Error\(s\) in loading state_dict for",
       "a checkpoint of another shape or architecture was loaded into the model (a wrong resume or init-from path, "
       "or a model configuration that changed since it was saved)", "crash", "fix-config", TORCH,
       "RuntimeError: Error(s) in loading state_dict for DFlashDrafter:", key="Error(s) in loading state_dict"),
    _e("ChildFailedError", r"\bChildFailedError\b",
       "torchrun reports that a worker process failed; the root cause (rank, exit code or signal, its error) is in "
       "the lines that follow", "crash", "investigate", "PyTorch 2.x torch.distributed.elastic.multiprocessing.errors",
       "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: "),
)
