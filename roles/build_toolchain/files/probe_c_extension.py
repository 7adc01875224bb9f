"""Compile and import a C extension the way Triton's JIT builds its launcher.

Run with the interpreter under test. Triton finds a C compiler (CC, else cc/gcc/clang on PATH) and
compiles a small module against sysconfig's include directory; a missing compiler or a missing
Python.h is exactly what broke the first launch in incidents.md. Prints one line: "ok ..." or
"missing: <what>" (exit 1), so the role can name the fix.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

SOURCE = r"""
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "flashfleet_probe", NULL, -1, methods};
PyMODINIT_FUNC PyInit_flashfleet_probe(void) { return PyModule_Create(&module); }
"""


def main() -> int:
    version = "{}.{}".format(*sys.version_info[:2])
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        print("missing: compiler (no CC, cc, gcc or clang on PATH)")
        return 1
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        print(f"missing: headers for python{version} (no Python.h in {include})")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(SOURCE)
        out = os.path.join(tmp, "flashfleet_probe" + sysconfig.get_config_var("EXT_SUFFIX"))
        build = subprocess.run([cc, "-O1", "-shared", "-fPIC", f"-I{include}", src, "-o", out],
                               capture_output=True, text=True)
        if build.returncode != 0:
            print(f"missing: a working compile with {cc}: {build.stderr.strip().splitlines()[-1:]}")
            return 1
        spec = importlib.util.spec_from_file_location("flashfleet_probe", out)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if mod.answer() != 42:
            print("missing: a working extension (it imported but returned the wrong value)")
            return 1
    print(f"ok: {cc} built and imported a C extension against python{version} headers ({include})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
