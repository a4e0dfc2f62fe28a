"""Only where setuptools builds: outside the source tree. Everything else is in pyproject.toml.

`pip install .` and `pip wheel .` build in the source tree (pip's in-tree builds), and setuptools
would leave `build/` (build/lib, build/bdist.*) and `hybrid_nvfp4.egg-info/` there. build/lib is
never cleaned: a module removed or renamed in the source stayed in it and went into the next wheel.
A fresh temporary directory per build instead, removed when the build process exits.
"""

import atexit
import shutil
import tempfile

from setuptools import setup

BUILD_BASE = tempfile.mkdtemp(prefix="hybrid-nvfp4-build-")
atexit.register(shutil.rmtree, BUILD_BASE, ignore_errors=True)

setup(options={"build": {"build_base": BUILD_BASE}, "egg_info": {"egg_base": BUILD_BASE}})
