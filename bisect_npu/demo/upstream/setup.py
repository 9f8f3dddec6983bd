"""tinyvllm: `pip install -e .` compiles csrc/ into tinyvllm/_kernels.so during the install."""

import importlib.util
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CompileError

ROOT = Path(__file__).resolve().parent


class BuildKernels(build_ext):
    """The one extension, tinyvllm/_kernels.so, compiled by tools/build_kernels.py (plain C, no Python API)."""

    def get_ext_filename(self, fullname):
        return str(Path(*fullname.split("."))) + ".so"  # the name tinyvllm/kernels.py loads

    def build_extension(self, ext):
        spec = importlib.util.spec_from_file_location("build_kernels", ROOT / "tools" / "build_kernels.py")
        kernels = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernels)
        target = Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        if kernels.compile_kernels(target) != 0:
            raise CompileError(f"compiling {ext.name} from csrc/ failed")


setup(
    name="tinyvllm",
    version="0.9.0",
    packages=find_packages(include=["tinyvllm*"]),
    ext_modules=[Extension("tinyvllm._kernels", sources=sorted(str(p.relative_to(ROOT))
                                                               for p in (ROOT / "csrc").glob("*.c")))],
    cmdclass={"build_ext": BuildKernels},
    python_requires=">=3.10",
)
