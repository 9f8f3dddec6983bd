"""tinyvllm: `pip install -e .` after `python tools/build_kernels.py`."""

from setuptools import find_packages, setup

setup(
    name="tinyvllm",
    version="0.9.0",
    packages=find_packages(include=["tinyvllm*"]),
    package_data={"tinyvllm": ["_kernels.so"]},
    python_requires=">=3.10",
)
