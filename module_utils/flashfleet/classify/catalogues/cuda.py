"""The CUDA layer's own failure codes: the runtime's cudaError_t (every value of CUDA 13.0's
driver_types.h, with the message cudaGetErrorString returns), cuBLAS's cublasStatus_t and cuDNN's
cudnnStatus_t (cuDNN 9's codes, and the cuDNN 8 names that 9 dropped).

Sources: CUDA Runtime API, enum cudaError (driver_types.h, CUDA 13.0; 12.x has the same values
less 721 cudaErrorTensorMemoryLeak and the 91x graph/resource codes); the messages are
libcudart.so.13's own cudaGetErrorString, read from the library. cuBLAS: cublas_api.h,
cublasStatus_t (CUDA 12.x/13). cuDNN: cudnn_graph.h, cudnnStatus_t (cuDNN 9.x; cuDNN 8.x's
cudnn_ops_infer.h for the older names). 13.1's cudaErrorStreamDetached (917) is left out: its
message could not be read from a 13.1 runtime here.

torch prints a runtime error by its message (`torch.AcceleratorError: CUDA error: an illegal
memory access was encountered`, `RuntimeError: CUDA error: misaligned address`; at initialisation
`... Error 802: system not yet initialized`), NCCL as `Cuda failure 'out of memory'`, Triton as
`Triton Error [CUDA]: ...` and CuPy as `cudaErrorIllegalAddress: ...`: an entry's pattern finds its
message behind one of those prefixes, or its enum name anywhere (torch's "Search for
`cudaErrorIllegalAddress' ..." line). Its key is the message torch prints.

A GPU fault seen by the program (illegal address, assert, launch failure, ECC, NVLink) only
explains the crash: a hardware Xid in the kernel log at the same time outranks it (the Xid names
the GPU to drain); without one it is the program's own bug."""

from __future__ import annotations

import re

from .entry import Entry

SOURCE = "CUDA Runtime API, cudaError_t (driver_types.h) and cudaGetErrorString, CUDA 13.0 (12.x alike)"
CUBLAS_SOURCE = "cuBLAS, cublasStatus_t (cublas_api.h), CUDA 12.x/13"
CUDNN_SOURCE = "cuDNN, cudnnStatus_t (cudnn_graph.h, cuDNN 9.x; cudnn_ops_infer.h, cuDNN 8.x)"

_XID = "; a hardware Xid at the same time outranks it"

# What each kind of runtime error means for a run: (verdict, action, meaning).
GROUPS = {
    "oom": ("cuda-oom", "fix-config", "GPU memory ran out for an allocation outside torch's caching allocator (a "
            "library's workspace or handle, NCCL's buffers): lower the batch or sequence length, or free the GPU of "
            "other processes"),
    "driver_old": ("driver-too-old", "fix-driver", "the NVIDIA driver is older than the CUDA runtime the venv ships: "
                   "upgrade the driver (or pin a torch built for an older CUDA)"),
    "no_gpu": ("gpu-unavailable", "fix-driver", "CUDA could not reach a usable GPU on this host (driver not loaded, "
               "device nodes missing, a stub libcuda found first): repair the driver"),
    "busy": ("gpu-unavailable", "reset-gpu", "the GPU is held by another process (compute mode Exclusive_Process) or "
             "stuck: stop that process or reset the GPU"),
    "mismatch": ("driver-mismatch", "fix-driver", "the user-space driver does not match the loaded kernel module (an "
                 "upgrade without a reboot): reboot or reload the driver"),
    "fabric": ("gpu-unavailable", "fix-driver", "CUDA is not ready on an NVSwitch system: start nvidia-fabricmanager "
               "(its version matching the driver)"),
    "compat": ("driver-too-old", "fix-driver", "CUDA forward compatibility was tried on a GPU that does not support it: "
               "install a driver new enough for the runtime"),
    "ecc": ("crash", "reset-gpu", "the GPU hit an uncorrectable ECC memory error (hardware): drain and reset the GPU "
            "(look for Xid 48/94/95 in the kernel log)"),
    "nvlink": ("crash", "reset-gpu", "an uncorrectable NVLink error hit the running kernels (hardware): drain and reset "
               "the GPU (look for Xid 74 or 144-150 in the kernel log)"),
    "contained": ("crash", "restart-app", "a contained error (an illegal peer access over NVLink or a hardware error) "
                  "poisoned the process: restart it, and check the kernel log for Xid 94/137"),
    "fault": ("crash", "investigate", "a kernel faulted on the GPU, usually the program's bug (an index out of range, "
              "a bad pointer): re-run with CUDA_LAUNCH_BLOCKING=1 to find the op" + _XID),
    "timeout": ("crash", "investigate", "a kernel ran past the display watchdog's limit and was killed: run on a GPU "
                "without a display attached, or split the kernel" + _XID),
    "resources": ("crash", "investigate", "a kernel asked for more registers, threads or shared memory than the GPU has "
                  "(a custom or JIT kernel tuned for another GPU): lower its block size or pin kernels built for this GPU"),
    "image": ("crash", "fix-venv", "the venv's kernels were not built for this GPU's architecture (or the binary is "
              "damaged): install builds of torch and its extensions that include this GPU's sm_ arch"),
    "ptx": ("driver-too-old", "fix-driver", "the PTX was produced by a newer toolkit than the driver can compile: "
            "upgrade the driver"),
    "jitlib": ("crash", "fix-driver", "the driver's PTX JIT library (libnvidia-ptxjitcompiler) is missing: install the "
               "full driver user space (in a container, the compute capability of the NVIDIA runtime)"),
    "jitoff": ("crash", "fix-config", "PTX JIT is disabled (CUDA_DISABLE_PTX_JIT) and no prebuilt kernel fits this "
               "GPU: unset it, or install kernels built for the GPU"),
    "ordinal": ("crash", "fix-config", "the run asked for a GPU that does not exist here (CUDA_VISIBLE_DEVICES, "
                "LOCAL_RANK or the device index is beyond the host's GPUs): fix the run's GPU list"),
    "exclusive": ("gpu-unavailable", "fix-config", "the GPU is in exclusive-thread compute mode and another thread "
                  "holds it: set the compute mode to default (nvidia-smi -c 0)"),
    "peer": ("crash", "fix-config", "the two GPUs cannot reach each other's memory (no P2P path between them): place "
             "the ranks on GPUs with a peer path, or disable P2P (NCCL_P2P_DISABLE=1)"),
    "mps": ("gpu-unavailable", "fix-config", "the MPS control daemon or server failed or refused the client: check "
            "nvidia-cuda-mps-control on the host, or run without MPS"),
    "capture": ("crash", "investigate", "an operation not allowed during CUDA graph capture broke the capture "
                "(torch.compile mode=reduce-overhead, CUDA graphs): fix the captured code or disable graphs"),
    "unknown": ("crash", "investigate", "CUDA reported an error it cannot name, often the shadow of a GPU or driver "
                "fault" + _XID),
    "unloading": ("crash", "investigate", "CUDA was called while the process was shutting down: a symptom of an "
                  "earlier error, which is the cause"),
    "context": ("crash", "investigate", "the CUDA context was destroyed or never made current (after a fork, or after "
                "an earlier fatal error): look for the first error"),
    "osfail": ("crash", "investigate", "an operating-system call inside CUDA failed (IPC, shared memory, a sandbox "
               "restriction): check the unit's sandboxing and /dev/shm"),
    "cdp": ("crash", "investigate", "a kernel uses CUDA Dynamic Parallelism in a way this setup does not support "
            "(depth, pending launches, MPS, device-side sync): a library bug or an unsupported build"),
    "api": ("crash", "investigate", "a CUDA call was rejected (a misuse in the program or a library it calls, not the "
            "GPU's fault): read the traceback for the op"),
}

# A few codes say more than their group does.
NOTES = {
    3: "; in a DataLoader worker or a subprocess forked after CUDA was initialised this is the program's bug "
       "(use the spawn start method), not the host's",
    34: "; the CUDA driver found is the toolkit's stub (libcuda.so from a stubs directory on LD_LIBRARY_PATH)",
    102: "; the vGPU has no valid Grid licence",
    401: "; NCCL's cuMem allocator (NCCL_CUMEM_ENABLE) and NVLS multicast binding fail this way where the driver or "
         "the container forbids them",
    801: "; NCCL's NVLS (NVLink SHARP) setup fails this way where multicast is unsupported (NCCL_NVLS_ENABLE=0)",
    999: "; at initialisation (cuInit) it means the driver state of the host (nvidia_uvm not loaded, a driver "
         "upgraded without a reboot)",
}

# How libraries print a runtime error's message in front of it.
_PREFIX = (r"(?:CUDA (?:driver )?error: |Triton Error \[CUDA\]: |Cuda failure (?:\d+ )?'|\bError \d+: |cudaError\w+: "
           r"|cuda runtime error \(\d+\) : )")  # the last: torch before 1.0 (THCudaCheck)

# torch's own words for two codes, beside the runtime's message.
_TORCH_WORDS = {
    100: r"No CUDA GPUs are available",
    35: r"The NVIDIA driver on your system is too old \(found version \d+\)",
}

# (number, name without the cudaError prefix, cudaGetErrorString, group)
ERRORS = (
    (1, "InvalidValue", "invalid argument", "api"),
    (2, "MemoryAllocation", "out of memory", "oom"),
    (3, "InitializationError", "initialization error", "no_gpu"),
    (4, "CudartUnloading", "driver shutting down", "unloading"),
    (5, "ProfilerDisabled", "profiler disabled while using external profiling tool", "api"),
    (6, "ProfilerNotInitialized", "profiler not initialized: call cudaProfilerInitialize()", "api"),
    (7, "ProfilerAlreadyStarted", "profiler already started", "api"),
    (8, "ProfilerAlreadyStopped", "profiler already stopped", "api"),
    (9, "InvalidConfiguration", "invalid configuration argument", "api"),
    (12, "InvalidPitchValue", "invalid pitch argument", "api"),
    (13, "InvalidSymbol", "invalid device symbol", "api"),
    (16, "InvalidHostPointer", "invalid host pointer", "api"),
    (17, "InvalidDevicePointer", "invalid device pointer", "api"),
    (18, "InvalidTexture", "invalid texture reference", "api"),
    (19, "InvalidTextureBinding", "texture is not bound to a pointer", "api"),
    (20, "InvalidChannelDescriptor", "invalid channel descriptor", "api"),
    (21, "InvalidMemcpyDirection", "invalid copy direction for memcpy", "api"),
    (22, "AddressOfConstant", "invalid address of constant", "api"),
    (23, "TextureFetchFailed", "fetch from texture failed", "api"),
    (24, "TextureNotBound", "cannot fetch from a texture that is not bound", "api"),
    (25, "SynchronizationError", "incorrect use of __syncthreads()", "api"),
    (26, "InvalidFilterSetting", "linear filtering not supported for non-float type", "api"),
    (27, "InvalidNormSetting", "read as normalized float not supported for data type", "api"),
    (28, "MixedDeviceExecution", "device emulation mode and device execution mode cannot be mixed", "api"),
    (31, "NotYetImplemented", "feature not yet implemented", "api"),
    (32, "MemoryValueTooLarge", "memory size or pointer value too large to fit in 32 bit", "api"),
    (34, "StubLibrary", "CUDA driver is a stub library", "no_gpu"),
    (35, "InsufficientDriver", "CUDA driver version is insufficient for CUDA runtime version", "driver_old"),
    (36, "CallRequiresNewerDriver", "API call is not supported in the installed CUDA driver", "driver_old"),
    (37, "InvalidSurface", "invalid surface reference", "api"),
    (43, "DuplicateVariableName", "duplicate global variable looked up by string name", "api"),
    (44, "DuplicateTextureName", "duplicate texture looked up by string name", "api"),
    (45, "DuplicateSurfaceName", "duplicate surface looked up by string name", "api"),
    (46, "DevicesUnavailable", "CUDA-capable device(s) is/are busy or unavailable", "busy"),
    (49, "IncompatibleDriverContext", "incompatible driver context", "api"),
    (52, "MissingConfiguration", "__global__ function call is not configured", "api"),
    (53, "PriorLaunchFailure", "unspecified launch failure in prior launch", "fault"),
    (65, "LaunchMaxDepthExceeded", "launch would exceed maximum depth of nested launches", "cdp"),
    (66, "LaunchFileScopedTex",
     "launch failed because kernel uses unsupported, file-scoped textures (texture objects are supported)", "api"),
    (67, "LaunchFileScopedSurf",
     "launch failed because kernel uses unsupported, file-scoped surfaces (surface objects are supported)", "api"),
    (68, "SyncDepthExceeded",
     "cudaDeviceSynchronize failed because caller's grid depth exceeds cudaLimitDevRuntimeSyncDepth", "cdp"),
    (69, "LaunchPendingCountExceeded",
     "launch failed because launch would exceed cudaLimitDevRuntimePendingLaunchCount", "cdp"),
    (98, "InvalidDeviceFunction", "invalid device function", "image"),
    (100, "NoDevice", "no CUDA-capable device is detected", "no_gpu"),
    (101, "InvalidDevice", "invalid device ordinal", "ordinal"),
    (102, "DeviceNotLicensed", "device doesn't have valid Grid license", "no_gpu"),
    (103, "SoftwareValidityNotEstablished", "integrity checks failed", "no_gpu"),
    (127, "StartupFailure", "startup failure in cuda runtime", "no_gpu"),
    (200, "InvalidKernelImage", "device kernel image is invalid", "image"),
    (201, "DeviceUninitialized", "invalid device context", "context"),
    (205, "MapBufferObjectFailed", "mapping of buffer object failed", "api"),
    (206, "UnmapBufferObjectFailed", "unmapping of buffer object failed", "api"),
    (207, "ArrayIsMapped", "array is mapped", "api"),
    (208, "AlreadyMapped", "resource already mapped", "api"),
    (209, "NoKernelImageForDevice", "no kernel image is available for execution on the device", "image"),
    (210, "AlreadyAcquired", "resource already acquired", "api"),
    (211, "NotMapped", "resource not mapped", "api"),
    (212, "NotMappedAsArray", "resource not mapped as array", "api"),
    (213, "NotMappedAsPointer", "resource not mapped as pointer", "api"),
    (214, "ECCUncorrectable", "uncorrectable ECC error encountered", "ecc"),
    (215, "UnsupportedLimit", "limit is not supported on this architecture", "api"),
    (216, "DeviceAlreadyInUse", "exclusive-thread device already in use by a different thread", "exclusive"),
    (217, "PeerAccessUnsupported", "peer access is not supported between these two devices", "peer"),
    (218, "InvalidPtx", "a PTX JIT compilation failed", "image"),
    (219, "InvalidGraphicsContext", "invalid OpenGL or DirectX context", "api"),
    (220, "NvlinkUncorrectable", "uncorrectable NVLink error detected during the execution", "nvlink"),
    (221, "JitCompilerNotFound", "PTX JIT compiler library not found", "jitlib"),
    (222, "UnsupportedPtxVersion", "the provided PTX was compiled with an unsupported toolchain.", "ptx"),
    (223, "JitCompilationDisabled", "PTX JIT compilation was disabled", "jitoff"),
    (224, "UnsupportedExecAffinity", "the provided execution affinity is not supported", "api"),
    (225, "UnsupportedDevSideSync", "the provided PTX contains unsupported call to cudaDeviceSynchronize", "cdp"),
    (226, "Contained", "Invalid access of peer GPU memory over nvlink or a hardware error", "contained"),
    (300, "InvalidSource", "device kernel image is invalid", "image"),
    (301, "FileNotFound", "file not found", "api"),
    (302, "SharedObjectSymbolNotFound", "shared object symbol not found", "api"),
    (303, "SharedObjectInitFailed", "shared object initialization failed", "api"),
    (304, "OperatingSystem", "OS call failed or operation not supported on this OS", "osfail"),
    (400, "InvalidResourceHandle", "invalid resource handle", "api"),
    (401, "IllegalState", "the operation cannot be performed in the present state", "api"),
    (402, "LossyQuery", "attempted introspection would be semantically lossy", "api"),
    (500, "SymbolNotFound", "named symbol not found", "api"),
    (600, "NotReady", "device not ready", "api"),
    (700, "IllegalAddress", "an illegal memory access was encountered", "fault"),
    (701, "LaunchOutOfResources", "too many resources requested for launch", "resources"),
    (702, "LaunchTimeout", "the launch timed out and was terminated", "timeout"),
    (703, "LaunchIncompatibleTexturing", "launch uses incompatible texturing mode", "api"),
    (704, "PeerAccessAlreadyEnabled", "peer access is already enabled", "api"),
    (705, "PeerAccessNotEnabled", "peer access has not been enabled", "api"),
    (708, "SetOnActiveProcess", "cannot set while device is active in this process", "api"),
    (709, "ContextIsDestroyed", "context is destroyed", "context"),
    (710, "Assert", "device-side assert triggered", "fault"),
    (711, "TooManyPeers", "peer mapping resources exhausted", "api"),
    (712, "HostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped", "api"),
    (713, "HostMemoryNotRegistered", "pointer does not correspond to a registered memory region", "api"),
    (714, "HardwareStackError", "hardware stack error", "fault"),
    (715, "IllegalInstruction", "an illegal instruction was encountered", "fault"),
    (716, "MisalignedAddress", "misaligned address", "fault"),
    (717, "InvalidAddressSpace", "operation not supported on global/shared address space", "fault"),
    (718, "InvalidPc", "invalid program counter", "fault"),
    (719, "LaunchFailure", "unspecified launch failure", "fault"),
    (720, "CooperativeLaunchTooLarge", "too many blocks in cooperative launch", "api"),
    (721, "TensorMemoryLeak", "tensor memory not completely freed", "fault"),
    (800, "NotPermitted", "operation not permitted", "api"),
    (801, "NotSupported", "operation not supported", "api"),
    (802, "SystemNotReady", "system not yet initialized", "fabric"),
    (803, "SystemDriverMismatch", "system has unsupported display driver / cuda driver combination", "mismatch"),
    (804, "CompatNotSupportedOnDevice", "forward compatibility was attempted on non supported HW", "compat"),
    (805, "MpsConnectionFailed", "MPS client failed to connect to the MPS control daemon or the MPS server", "mps"),
    (806, "MpsRpcFailure", "the remote procedural call between the MPS server and the MPS client failed", "mps"),
    (807, "MpsServerNotReady", "MPS server is not ready to accept new MPS client requests", "mps"),
    (808, "MpsMaxClientsReached", "the hardware resources required to create MPS client have been exhausted", "mps"),
    (809, "MpsMaxConnectionsReached",
     "the hardware resources required to support device connections have been exhausted", "mps"),
    (810, "MpsClientTerminated", "the MPS client has been terminated by the server", "mps"),
    (811, "CdpNotSupported",
     "is using CUDA Dynamic Parallelism, but the current configuration, like MPS, does not support it", "cdp"),
    (812, "CdpVersionMismatch",
     "unsupported interaction between different versions of CUDA Dynamic Parallelism", "cdp"),
    (900, "StreamCaptureUnsupported", "operation not permitted when stream is capturing", "capture"),
    (901, "StreamCaptureInvalidated", "operation failed due to a previous error during capture", "capture"),
    (902, "StreamCaptureMerge", "operation would result in a merge of separate capture sequences", "capture"),
    (903, "StreamCaptureUnmatched", "capture was not ended in the same stream as it began", "capture"),
    (904, "StreamCaptureUnjoined", "capturing stream has unjoined work", "capture"),
    (905, "StreamCaptureIsolation", "dependency created on uncaptured work in another stream", "capture"),
    (906, "StreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream", "capture"),
    (907, "CapturedEvent", "operation not permitted on an event last recorded in a capturing stream", "capture"),
    (908, "StreamCaptureWrongThread",
     "attempt to terminate a thread-local capture sequence from another thread", "capture"),
    (909, "Timeout", "wait operation timed out", "api"),
    (910, "GraphExecUpdateFailure",
     "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update", "api"),
    (911, "ExternalDevice", "an async error has occured in external entity outside of CUDA", "api"),
    (912, "InvalidClusterSize", "a kernel launch error has occurred due to cluster misconfiguration", "api"),
    (913, "FunctionNotLoaded",
     "the function handle is not loaded when calling an API that requires a loaded function", "api"),
    (914, "InvalidResourceType",
     "one or more resources passed in are not valid resource types for the operation", "api"),
    (915, "InvalidResourceConfiguration",
     "one or more resources are insufficient or non-applicable for the operation", "api"),
    (999, "Unknown", "unknown error", "unknown"),
)

_INIT_GROUPS = {"driver_old", "no_gpu", "mismatch", "fabric", "compat"}


def _sample(number: int, name: str, message: str, group: str) -> str:
    if number == 300:  # its message is 200's: torch's next line names it
        return (f"Search for `cudaError{name}' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
                f"group__CUDART__TYPES.html for more information.")
    if group in _INIT_GROUPS:
        return ("RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before "
                f"calling NumCudaDevices() that might have already set an error? Error {number}: {message}")
    if group == "fault":
        return f"torch.AcceleratorError: CUDA error: {message}"
    return f"RuntimeError: CUDA error: {message}"


def _runtime(number: int, name: str, message: str, group: str) -> Entry:
    verdict, action, meaning = GROUPS[group]
    spellings = [rf"\bcudaError{name}\b"]
    if number != 300:
        # the message alone, not a longer message it begins ("unspecified launch failure in prior launch")
        # (old torch goes on with " at FILE:LINE")
        spellings.append(_PREFIX + re.escape(message) + r"(?![ \t]+(?!at\b)[a-z])")
    if number in _TORCH_WORDS:
        spellings.append(_TORCH_WORDS[number])
    return Entry("cuda", f"cudaError{name}", re.compile("|".join(spellings)),
                 f"cudaError{name} ({message}): {meaning}{NOTES.get(number, '')}", verdict, action, SOURCE,
                 _sample(number, name, message, group), number=number,
                 key=f"cudaError{name}" if number == 300 else message, extra={"group": group})


# cuBLAS: (status, number, verdict, action, meaning). torch prints `CUDA error: <STATUS> when calling
# `cublasGemmEx(...)``; a handle that cannot be created (cublasCreate) almost always means no GPU
# memory was left for it.
CUBLAS = (
    ("NOT_INITIALIZED", 1, "cuda-oom", "fix-config", "cuBLAS could not create its handle, nearly always because the "
     "GPU had no memory left for it (else a broken CUDA setup): lower the run's memory use"),
    ("ALLOC_FAILED", 3, "cuda-oom", "fix-config", "cuBLAS could not allocate its workspace on the GPU: lower the run's "
     "memory use"),
    ("INVALID_VALUE", 7, "crash", "investigate", "a cuBLAS call got an invalid argument (a shape, stride or a size "
     "beyond 32-bit limits): read the op in the traceback"),
    ("ARCH_MISMATCH", 8, "crash", "fix-venv", "the cuBLAS feature asked for needs a newer GPU architecture (a dtype "
     "or tensor-core mode this GPU lacks): use a dtype the GPU supports or a matching build"),
    ("MAPPING_ERROR", 11, "crash", "investigate", "cuBLAS could not access GPU memory (a texture binding failed)"),
    ("EXECUTION_FAILED", 13, "crash", "investigate", "a cuBLAS kernel failed to run on the GPU, usually after an "
     "earlier fault (an illegal access)" + _XID),
    ("INTERNAL_ERROR", 14, "crash", "investigate", "cuBLAS failed inside (often an earlier asynchronous CUDA error, or "
     "memory short for a workspace): look for the first error"),
    ("NOT_SUPPORTED", 15, "crash", "investigate", "the requested cuBLAS operation or dtype combination is not "
     "supported on this GPU or cuBLAS version"),
    ("LICENSE_ERROR", 16, "crash", "investigate", "cuBLAS found no valid licence for a feature it needs"),
)

# cuDNN: (status, number, verdict, action, meaning). Numbers are cuDNN 9's; the names cuDNN 9 dropped
# carry cuDNN 8's number. torch prints `cuDNN error: <STATUS>`.
CUDNN = (
    ("NOT_INITIALIZED", 1001, "cuda-oom", "fix-config", "cuDNN could not create its handle, nearly always because the "
     "GPU had no memory left for it (else a cuDNN and driver mismatch): lower the run's memory use"),
    ("SUBLIBRARY_VERSION_MISMATCH", 1002, "crash", "fix-venv", "cuDNN's sub-libraries come from different releases: "
     "re-sync the venv"),
    ("SERIALIZATION_VERSION_MISMATCH", 1003, "crash", "fix-venv", "a serialized cuDNN plan was made by another cuDNN "
     "version: clear the plan cache or re-sync the venv"),
    ("DEPRECATED", 1004, "crash", "investigate", "a cuDNN feature removed from this version was used"),
    ("LICENSE_ERROR", 1005, "crash", "investigate", "cuDNN found no valid licence for a feature it needs"),
    ("RUNTIME_IN_PROGRESS", 1006, "crash", "investigate", "a cuDNN runtime check was still running when queried"),
    ("RUNTIME_FP_OVERFLOW", 1007, "crash", "investigate", "cuDNN detected a floating-point overflow in a kernel: the "
     "run's values exploded (check the loss and learning rate)"),
    ("SUBLIBRARY_LOADING_FAILED", 1008, "crash", "fix-venv", "a cuDNN sub-library (libcudnn_*.so) could not be "
     "loaded: re-sync the venv"),
    ("BAD_PARAM", 2000, "crash", "investigate", "a cuDNN call got an invalid parameter (shapes, strides, dtypes)"),
    ("INVALID_VALUE", 2001, "crash", "investigate", "a cuDNN call got an invalid value (cuDNN 8's name, 5 there)"),
    ("BAD_PARAM_NULL_POINTER", 2002, "crash", "investigate", "a null pointer was passed to cuDNN"),
    ("BAD_PARAM_MISALIGNED_POINTER", 2003, "crash", "investigate", "a misaligned pointer was passed to cuDNN"),
    ("BAD_PARAM_NOT_FINALIZED", 2004, "crash", "investigate", "a cuDNN descriptor was used before it was finalized"),
    ("BAD_PARAM_OUT_OF_BOUND", 2005, "crash", "investigate", "a cuDNN parameter is out of bounds"),
    ("BAD_PARAM_SIZE_INSUFFICIENT", 2006, "crash", "investigate", "a buffer given to cuDNN is too small"),
    ("BAD_PARAM_STREAM_MISMATCH", 2007, "crash", "investigate", "cuDNN was given a CUDA stream it cannot use"),
    ("BAD_PARAM_SHAPE_MISMATCH", 2008, "crash", "investigate", "tensor shapes given to cuDNN do not agree"),
    ("BAD_PARAM_DUPLICATED_ENTRIES", 2009, "crash", "investigate", "a cuDNN graph has duplicated entries"),
    ("BAD_PARAM_ATTRIBUTE_TYPE", 2010, "crash", "investigate", "a cuDNN attribute has the wrong type"),
    ("BAD_PARAM_CUDA_GRAPH_MISMATCH", 2011, "crash", "investigate", "a CUDA graph given to cuDNN does not match its plan"),
    ("BAD_PARAM_DESCRIPTOR_TYPE", 2012, "crash", "investigate", "a cuDNN descriptor has the wrong type"),
    ("NOT_SUPPORTED", 3000, "crash", "investigate", "cuDNN has no kernel for this operation, shape or dtype here: "
     "change the op's configuration or fall back (torch.backends.cudnn.enabled=False)"),
    ("NOT_SUPPORTED_GRAPH_PATTERN", 3001, "crash", "investigate", "cuDNN does not support this fused graph pattern"),
    ("NOT_SUPPORTED_SHAPE", 3002, "crash", "investigate", "cuDNN does not support this tensor shape"),
    ("NOT_SUPPORTED_DATA_TYPE", 3003, "crash", "investigate", "cuDNN does not support this data type here"),
    ("NOT_SUPPORTED_LAYOUT", 3004, "crash", "investigate", "cuDNN does not support this memory layout"),
    ("NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER", 3005, "driver-too-old", "fix-driver", "the NVIDIA driver is too old "
     "for this cuDNN: upgrade the driver"),
    ("NOT_SUPPORTED_INCOMPATIBLE_CUDART", 3006, "crash", "fix-venv", "cuDNN and the CUDA runtime in the venv do not "
     "match: re-sync the venv"),
    ("NOT_SUPPORTED_ARCH_MISMATCH", 3007, "crash", "fix-venv", "this cuDNN does not support the GPU's architecture: "
     "install a cuDNN that does"),
    ("NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING", 3008, "crash", "fix-venv", "a library cuDNN needs at run time "
     "(NVRTC, cuBLAS) is missing: re-sync the venv"),
    ("NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE", 3009, "crash", "fix-venv", "a cuDNN sub-library is not installed: "
     "re-sync the venv"),
    ("NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT", 3010, "crash", "investigate", "the cuDNN kernel needs more shared "
     "memory than the GPU has"),
    ("NOT_SUPPORTED_PADDING", 3011, "crash", "investigate", "cuDNN does not support this padding mode"),
    ("NOT_SUPPORTED_BAD_LAUNCH_PARAM", 3012, "crash", "investigate", "cuDNN could not launch with these parameters"),
    ("NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API", 3013, "crash", "investigate", "cuDNN's native CUDA graph API is not "
     "supported for this plan"),
    ("INTERNAL_ERROR", 4000, "crash", "investigate", "cuDNN failed inside (often an earlier asynchronous CUDA error): "
     "look for the first error" + _XID),
    ("INTERNAL_ERROR_COMPILATION_FAILED", 4001, "crash", "investigate", "cuDNN's runtime kernel compilation (NVRTC) "
     "failed"),
    ("INTERNAL_ERROR_UNEXPECTED_VALUE", 4002, "crash", "investigate", "cuDNN met an unexpected internal value"),
    ("INTERNAL_ERROR_HOST_ALLOCATION_FAILED", 4003, "crash", "fix-config", "cuDNN could not allocate host memory: "
     "the host or the unit's memory limit ran out"),
    ("INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED", 4004, "cuda-oom", "fix-config", "cuDNN could not allocate GPU memory "
     "for its workspace: lower the run's memory use"),
    ("INTERNAL_ERROR_BAD_LAUNCH_PARAM", 4005, "crash", "investigate", "cuDNN computed launch parameters the GPU "
     "rejected"),
    ("INTERNAL_ERROR_TEXTURE_CREATION_FAILED", 4006, "crash", "investigate", "cuDNN could not create a texture"),
    ("EXECUTION_FAILED", 5000, "crash", "investigate", "a cuDNN kernel failed to run on the GPU, usually after an "
     "earlier fault" + _XID),
    ("EXECUTION_FAILED_CUDA_DRIVER", 5001, "crash", "investigate", "a CUDA driver call inside cuDNN failed" + _XID),
    ("EXECUTION_FAILED_CUBLAS", 5002, "crash", "investigate", "a cuBLAS call inside cuDNN failed" + _XID),
    ("EXECUTION_FAILED_CUDART", 5003, "crash", "investigate", "a CUDA runtime call inside cuDNN failed" + _XID),
    ("EXECUTION_FAILED_CURAND", 5004, "crash", "investigate", "a cuRAND call inside cuDNN failed"),
    # cuDNN 8 only
    ("ALLOC_FAILED", 2, "cuda-oom", "fix-config", "cuDNN 8 could not allocate GPU memory: lower the run's memory use"),
    ("ARCH_MISMATCH", 6, "crash", "fix-venv", "cuDNN 8 does not support the GPU's architecture: install a cuDNN that "
     "does"),
    ("MAPPING_ERROR", 7, "crash", "investigate", "cuDNN 8 could not access GPU memory (a texture binding failed)"),
    ("RUNTIME_PREREQUISITE_MISSING", 11, "crash", "fix-venv", "a library cuDNN 8 needs at run time is missing: "
     "re-sync the venv"),
    ("VERSION_MISMATCH", 14, "crash", "fix-venv", "cuDNN 8's sub-libraries come from different releases: re-sync the "
     "venv"),
)


def _cublas(status: str, number: int, verdict: str, action: str, meaning: str) -> Entry:
    name = f"CUBLAS_STATUS_{status}"
    call = "cublasCreate(handle)" if status in ("NOT_INITIALIZED", "ALLOC_FAILED") else (
        "cublasGemmEx( handle, opa, opb, m, n, k, &falpha, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &fbeta, c, "
        "CUDA_R_16BF, ldc, compute_type, CUBLAS_GEMM_DEFAULT_TENSOR_OP)")
    return Entry("cublas", name, re.compile(rf"\b{name}\b"), f"{name}: {meaning}", verdict, action, CUBLAS_SOURCE,
                 f"RuntimeError: CUDA error: {name} when calling `{call}`", number=number)


def _cudnn(status: str, number: int, verdict: str, action: str, meaning: str) -> Entry:
    name = f"CUDNN_STATUS_{status}"
    return Entry("cudnn", name, re.compile(rf"\b{name}\b"), f"{name}: {meaning}", verdict, action, CUDNN_SOURCE,
                 f"RuntimeError: cuDNN error: {name}", number=number)


ENTRIES = (tuple(_runtime(*row) for row in ERRORS) + tuple(_cublas(*row) for row in CUBLAS)
           + tuple(_cudnn(*row) for row in CUDNN))
