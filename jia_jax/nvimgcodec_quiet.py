"""nvImageCodec imported quietly: only its JPEG extensions, its log at errors only.

When imported, nvImageCodec loads every extension module of its package's `extensions` folder.
Where the CUDA libraries of the JPEG 2000 and TIFF extensions are missing (the `[gpu]` extra
installs neither: the trainer decodes JPEGs only), each prints a red `[ERROR]` and an install
hint, and each decoder then warns that decoding a region with interpolated chroma "may produce
wrong results" (the GPU path checks its region decode against Pillow at start-up instead:
jia_jax/gpu_decode.py). Every training process printed those lines, which read like a failure.
nvImageCodec reads both settings when it is imported, from the environment: set them before
then, as `jia_jax.main` does before JAX starts.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Mapping

# Where nvImageCodec loads its extension modules from (every module in the folder).
EXTENSIONS = "NVIMGCODEC_EXTENSIONS_PATH"
# Its Python module's log level: 1 prints errors only (2 adds warnings, ...).
VERBOSITY = ("PYNVIMGCODEC_VERBOSITY", "1")
# The extension modules that decode JPEGs: nvJPEG's (the GPU backends) and libjpeg-turbo's (the
# CPU backend), e.g. libnvjpeg_ext.so.0.9.0; not libnvjpeg2k_ext, JPEG 2000's.
_JPEG_MODULES = ("libnvjpeg_ext.", "libjpeg_turbo_ext.")


def package_folder() -> str | None:
    """nvImageCodec's installed package folder (found without importing it), or None."""
    try:
        spec = importlib.util.find_spec("nvidia.nvimgcodec")
    except ModuleNotFoundError:  # no `nvidia` namespace package at all
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def jpeg_modules(package: str) -> list[str]:
    """The paths of the JPEG extension modules in `package`'s `extensions` folder; [] where it
    has none of them (another layout), so that the library keeps its own default."""
    folder = os.path.join(package, "extensions")
    if not os.path.isdir(folder):
        return []
    names = sorted(n for n in os.listdir(folder) if n.startswith(_JPEG_MODULES))
    return [os.path.join(folder, n) for n in names]


def linked_folder(modules: list[str]) -> str:
    """A new folder of this user's own that links to `modules`, removed when this process exits
    (nvImageCodec loads the modules when it is imported; they stay loaded after)."""
    folder = tempfile.mkdtemp(prefix="jia_jax-nvimgcodec-")
    for path in modules:
        os.symlink(path, os.path.join(folder, os.path.basename(path)))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def environment(decode: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` before nvImageCodec is imported in a process that may
    decode on the GPU (`data.decode` is not "cpu" and nvImageCodec is installed): its JPEG
    extensions only (a folder of links, `linked_folder`) and its log at errors. A variable the
    user set is kept."""
    package = package_folder()
    if decode == "cpu" or package is None:
        return {}
    added = {}
    name, value = VERBOSITY
    if name not in environ:
        added[name] = value
    modules = jpeg_modules(package)
    if EXTENSIONS not in environ and modules:
        added[EXTENSIONS] = linked_folder(modules)
    return added
