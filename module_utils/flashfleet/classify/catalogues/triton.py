"""Triton's and TorchInductor's compile failures: the exceptions torch.compile raises when a graph
cannot be lowered or a kernel cannot be built, and the toolchain messages behind them (a C compiler
for Triton's launcher, the Python headers, libcuda for the linker, ptxas for the GPU).

Sources: Triton 3.x (triton/compiler/errors.py, triton/runtime/errors.py, triton/runtime/build.py,
triton/backends/nvidia/compiler.py and driver.py, triton/knobs.py); PyTorch 2.x torch/_dynamo/exc.py
and torch/_inductor/exc.py; ptxas's and GNU ld's own messages.

A missing tool is a toolchain-error (fix-toolchain); a kernel too big for this GPU is the run's
configuration (fix-config); a compiler's failure on the program's own code is a crash to read
(investigate)."""

from __future__ import annotations

import re

from .entry import Entry

TRITON = "Triton 3.x (triton/compiler/errors.py, triton/runtime/errors.py, triton/runtime/build.py, backends/nvidia)"
DYNAMO = "PyTorch 2.x torch/_dynamo/exc.py"
INDUCTOR = "PyTorch 2.x torch/_inductor/exc.py"
TOOLS = "ptxas / GNU ld / gcc diagnostics, as Triton's and Inductor's builds print them"


def _e(name: str, pattern: str, meaning: str, verdict: str, action: str, source: str, sample: str,
       key: str = "") -> Entry:
    if not key and name not in sample:  # quote the words of the line its pattern finds
        key = re.search(pattern, sample).group(0).strip(" :")
    return Entry("triton", name, re.compile(pattern), meaning, verdict, action, source, sample, key=key)


ENTRIES = (
    # --- Triton's exceptions
    _e("CompilationError", r"triton\.compiler\.errors\.CompilationError\b",
       "Triton could not compile a kernel's source (the line and column are in the message): a bug in the kernel "
       "or a construct this Triton does not support; pin the Triton the kernel was written for",
       "crash", "investigate", TRITON, "triton.compiler.errors.CompilationError: at 32:21:"),
    _e("CompileTimeAssertionFailure", r"\bCompileTimeAssertionFailure\b",
       "a kernel's static assertion (tl.static_assert) failed at compile time: the shapes or block sizes the run "
       "passed do not fit the kernel", "crash", "fix-config", TRITON,
       "triton.compiler.errors.CompileTimeAssertionFailure: at 14:4:"),
    _e("UnsupportedLanguageConstruct", r"\bUnsupportedLanguageConstruct\b",
       "a kernel uses Python this Triton cannot compile: the kernel and the installed Triton do not match",
       "crash", "fix-venv", TRITON, "triton.compiler.errors.UnsupportedLanguageConstruct: at 8:8:"),
    _e("OutOfResources-shared-memory", r"OutOfResources\b.*out of resource: shared memory|"
       r"out of resource: shared memory, Required: \d+",
       "a Triton kernel's configuration needs more shared memory than this GPU has (a config tuned for a bigger "
       "GPU, or block sizes/num_stages too large for these shapes): lower them, or let autotuning pick",
       "crash", "investigate", TRITON,
       "triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 262144, Hardware limit: "
       "232448. Reducing block sizes or `num_stages` may help.", key="out of resource: shared memory"),
    _e("OutOfResources", r"out of resource: (?!shared memory)\w",
       "a Triton kernel's configuration needs more of a GPU resource (registers, threads) than this GPU has: "
       "lower its block sizes or num_warps", "crash", "investigate", TRITON,
       "triton.runtime.errors.OutOfResources: out of resource: threads, Required: 2048, Hardware limit: 1024. "
       "Reducing block sizes or `num_stages` may help."),
    _e("PTXASError", r"\bPTXASError\b|PTXAS error: ",
       "ptxas failed on the PTX Triton generated (an internal codegen error or a ptxas crash): a Triton bug for this "
       "kernel and GPU; try another Triton release or disable the kernel", "crash", "investigate", TRITON,
       "triton.runtime.errors.PTXASError: PTXAS error: Internal Triton PTX codegen error"),
    _e("ptxas-CalledProcessError", r"CalledProcessError: Command '\[?'[^']*ptxas'.*returned non-zero exit status",
       "ptxas (run by an older Triton as a subprocess) failed on the generated PTX: a Triton codegen bug for this "
       "kernel and GPU, or a ptxas too old for it", "crash", "investigate", TRITON,
       "subprocess.CalledProcessError: Command '['/opt/venv/lib/python3.11/site-packages/triton/backends/nvidia/"
       "bin/ptxas', '-lineinfo', '-v', '--gpu-name=sm_90a', '/tmp/tmpa1b2c3.ptx', '-o', '/tmp/tmpa1b2c3.ptx.o']' "
       "returned non-zero exit status 255.", key="CalledProcessError"),
    _e("ptxas-gpu-name", r"ptxas fatal\s*: Value '[^']+' is not defined for option 'gpu-name'",
       "ptxas does not know this GPU's architecture: the CUDA toolkit (or Triton's bundled ptxas) is too old for "
       "the GPU; point TRITON_PTXAS_PATH at a newer ptxas or upgrade Triton", "toolchain-error", "fix-toolchain",
       TOOLS, "ptxas fatal   : Value 'sm_120a' is not defined for option 'gpu-name'"),
    _e("ptxas-missing", r"RuntimeError: Cannot find ptxas\b|Cannot find ptxas",
       "Triton cannot find ptxas (its bundled copy missing, or TRITON_PTXAS_PATH wrong)", "toolchain-error",
       "fix-toolchain", "Triton 3.x (triton/knobs.py)", "RuntimeError: Cannot find ptxas"),
    _e("no-c-compiler", r"Failed to find C compiler",
       "Triton found no C compiler to build its kernel launcher: install gcc (or set CC)", "toolchain-error",
       "fix-toolchain", TRITON,
       "RuntimeError: Failed to find C compiler. Please specify via CC environment variable or set "
       "triton.knobs.build.impl."),
    _e("no-cxx-compiler", r"Failed to find C\+\+ compiler",
       "Triton found no C++ compiler: install g++ (or set CXX)", "toolchain-error", "fix-toolchain", TRITON,
       "RuntimeError: Failed to find C++ compiler. Please specify via CXX environment variable or set "
       "triton.knobs.build.impl."),
    _e("Python.h", r"Python\.h: No such file or directory|'Python\.h' file not found|include file 'Python\.h' not found",
       "the kernel launcher cannot be built because the Python headers of the venv's interpreter are missing: "
       "install them (python3-dev)", "toolchain-error", "fix-toolchain", TOOLS,
       "/tmp/tmpq3v1x2yz/main.c:5:10: fatal error: Python.h: No such file or directory"),
    _e("cannot-find-lcuda", r"cannot find -lcuda\b",
       "the linker cannot find libcuda.so for Triton's launcher: the driver's unversioned libcuda.so link is missing "
       "from the library path (or TRITON_LIBCUDA_PATH is wrong)", "toolchain-error", "fix-toolchain", TOOLS,
       "/usr/bin/ld: cannot find -lcuda: No such file or directory"),
    _e("libcuda-not-found", r"libcuda\.so cannot found",
       "Triton cannot find the driver's libcuda.so.1 in the linker cache: the NVIDIA driver's user space is not "
       "installed or ldconfig has not been run", "gpu-unavailable", "fix-driver", "Triton 3.x (backends/nvidia/driver.py)",
       "AssertionError: libcuda.so cannot found!"),

    # --- torch.compile: Dynamo and Inductor
    _e("BackendCompilerFailed", r"BackendCompilerFailed\b",
       "torch.compile's backend failed while compiling a graph; the inner exception on the same line names why "
       "(a toolchain error, a lowering bug): fix that, or run without torch.compile", "crash", "investigate", DYNAMO,
       "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:"),
    _e("InductorError", r"\bInductorError\b",
       "TorchInductor failed while compiling a graph; the inner exception named on the line is the cause", "crash",
       "investigate", INDUCTOR, "torch._inductor.exc.InductorError: AssertionError: "),
    _e("LoweringException", r"\bLoweringException\b",
       "TorchInductor could not lower an operator (target and arguments follow): an Inductor bug or an op it "
       "does not support; pin another torch or run the model without torch.compile", "crash", "investigate",
       INDUCTOR, "torch._inductor.exc.LoweringException: AssertionError: target: aten.index_put_.default"),
    _e("missing-lowering", r"\bMissingOperatorWith(?:out)?Decomp\b",
       "TorchInductor has no lowering or decomposition for an operator the model uses: an unsupported op for this "
       "torch", "crash", "investigate", INDUCTOR,
       "torch._inductor.exc.MissingOperatorWithoutDecomp: missing lowering"),
    _e("InvalidCxxCompiler", r"\bInvalidCxxCompiler\b|No working C\+\+ compiler found in",
       "TorchInductor found no working C++ compiler for its CPU kernels and wrappers: install g++ (or set "
       "torch._inductor.config.cpp.cxx)", "toolchain-error", "fix-toolchain", INDUCTOR,
       "torch._inductor.exc.InvalidCxxCompiler: No working C++ compiler found in torch._inductor.config.cpp.cxx: "
       "(None, 'g++')"),
    _e("CppCompileError", r"\bCppCompileError\b",
       "the C++ that TorchInductor generated did not compile; the compiler output follows (a missing header is a "
       "toolchain gap, anything else an Inductor bug)", "crash", "investigate", INDUCTOR,
       "torch._inductor.exc.CppCompileError: C++ compile error"),
    _e("CUDACompileError", r"\bCUDACompileError\b",
       "nvcc failed on CUDA code TorchInductor generated (CUTLASS templates): the CUDA toolkit or the template does "
       "not fit this GPU", "crash", "investigate", INDUCTOR, "torch._inductor.exc.CUDACompileError: C++ compile error"),
    _e("TritonMissing", r"Cannot find a working triton installation",
       "torch.compile needs Triton for GPU kernels and the venv has none (or one too old): re-sync the venv",
       "crash", "fix-venv", INDUCTOR,
       "torch._inductor.exc.TritonMissing: Cannot find a working triton installation. Either the package is not "
       "installed or it is too old."),
    _e("GPUTooOldForTriton", r"which is too old to be supported by the triton GPU compiler",
       "the GPU is older than Triton supports (compute capability below 7.0): run without torch.compile on it",
       "crash", "fix-config", INDUCTOR,
       "torch._inductor.exc.GPUTooOldForTriton: Found Tesla P100-PCIE-16GB which is too old to be supported by the "
       "triton GPU compiler, which is used as the backend. Triton only supports devices of CUDA Capability >= 7.0, "
       "but your device is of CUDA capability 6.0"),
    _e("Unsupported", r"torch\._dynamo\.exc\.Unsupported\b",
       "Dynamo cannot trace a construct in the model and the compile requires a full graph (fullgraph=True): change "
       "the code or allow graph breaks", "crash", "investigate", DYNAMO,
       "torch._dynamo.exc.Unsupported: Data-dependent branching"),
    _e("FailOnRecompileLimitHit", r"\bFailOnRecompileLimitHit\b",
       "a compiled function was recompiled more often than torch._dynamo.config.recompile_limit and the run is set "
       "to fail then: shapes or inputs vary too much (mark them dynamic, or raise the limit)", "crash", "fix-config",
       DYNAMO, "torch._dynamo.exc.FailOnRecompileLimitHit: Hard failure due to fullgraph=True"),
)
