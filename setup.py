"""Build hook for the one compiled part, the optional F32/BF16/F16 statistics kernel (the rest is in pyproject.toml).

``_forensics_tensor_kernels`` (parsers/_tensor_native.c) is built where a C compiler is found; where it is not (or the
build fails) the install goes on without it and :mod:`parsers._tensor_kernels` uses its numpy/numkong path (the same
statistics, docs/formats.md#streaming-reduction). It is a top-level module so that it is found also when ``parsers``
is imported from a source checkout (the tests run from one). In a checkout: ``python setup.py build_ext --inplace``.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("_forensics_tensor_kernels", ["parsers/_tensor_native.c"], optional=True,
                             extra_compile_args=["-O3"])])
