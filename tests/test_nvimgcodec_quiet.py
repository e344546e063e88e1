"""nvImageCodec's import environment: JPEG extensions only, errors only, the user's values kept."""

import os
import subprocess
import sys

import pytest

from jia_jax import nvimgcodec_quiet

# nvImageCodec 0.9's extension modules, as its wheel installs them.
_MODULES = (
    "libjpeg_turbo_ext.so.0.9.0", "libnvbmp_ext.so.0.9.0", "libnvjpeg2k_ext.so.0.9.0",
    "libnvjpeg_ext.so.0.9.0", "libnvpnm_ext.so.0.9.0", "libnvtiff_ext.so.0.9.0",
    "libopencv_ext.so.0.9.0", "libtiff_ext.so.0.9.0",
)


@pytest.fixture(name="package")
def _package(tmp_path, monkeypatch):
    package = tmp_path / "nvimgcodec"
    (package / "extensions").mkdir(parents=True)
    for name in _MODULES:
        (package / "extensions" / name).write_bytes(b"")
    monkeypatch.setattr(nvimgcodec_quiet, "package_folder", lambda: str(package))
    return package


@pytest.mark.parametrize("decode", ["auto", "gpu"])
def test_only_the_jpeg_extensions_are_loaded_and_only_errors_logged(package, decode):
    added = nvimgcodec_quiet.environment(decode, {})
    assert added["PYNVIMGCODEC_VERBOSITY"] == "1"
    folder = added["NVIMGCODEC_EXTENSIONS_PATH"]
    links = {name: os.path.realpath(os.path.join(folder, name)) for name in os.listdir(folder)}
    source = os.path.realpath(package / "extensions")
    # nvJPEG's (GPU) and libjpeg-turbo's (CPU) modules; not JPEG 2000's, whose name also starts
    # with libnvjpeg, nor TIFF's, whose missing libraries printed the errors.
    assert links == {
        "libnvjpeg_ext.so.0.9.0": os.path.join(source, "libnvjpeg_ext.so.0.9.0"),
        "libjpeg_turbo_ext.so.0.9.0": os.path.join(source, "libjpeg_turbo_ext.so.0.9.0"),
    }


def test_what_the_user_set_is_kept(package):  # pylint: disable=unused-argument
    environ = {"PYNVIMGCODEC_VERBOSITY": "3", "NVIMGCODEC_EXTENSIONS_PATH": "/opt/ext"}
    assert nvimgcodec_quiet.environment("auto", environ) == {}


def test_nothing_is_set_where_the_gpu_never_decodes(package):  # pylint: disable=unused-argument
    assert nvimgcodec_quiet.environment("cpu", {}) == {}


def test_nothing_is_set_without_the_library(monkeypatch):
    monkeypatch.setattr(nvimgcodec_quiet, "package_folder", lambda: None)
    assert nvimgcodec_quiet.environment("auto", {}) == {}


def test_another_layout_keeps_the_librarys_own_extensions(tmp_path, monkeypatch):
    """With no JPEG module found, an empty folder would leave nvImageCodec no decoder at all."""
    (tmp_path / "extensions").mkdir()
    (tmp_path / "extensions" / "libjpeg_decoder.so").write_bytes(b"")
    monkeypatch.setattr(nvimgcodec_quiet, "package_folder", lambda: str(tmp_path))
    assert nvimgcodec_quiet.environment("auto", {}) == {"PYNVIMGCODEC_VERBOSITY": "1"}


def test_the_folder_of_links_is_removed_when_the_process_exits(package):
    script = (
        "import sys; from jia_jax import nvimgcodec_quiet as q; "
        "folder = q.linked_folder(sys.argv[1:]); print(folder); "
        "assert len(__import__('os').listdir(folder)) == 2"
    )
    modules = [str(package / "extensions" / n) for n in _MODULES[:2]]
    done = subprocess.run(
        [sys.executable, "-c", script, *modules], capture_output=True, text=True, check=True
    )
    folder = done.stdout.strip()
    assert folder.startswith(os.path.join(os.path.dirname(folder), "jia_jax-nvimgcodec-"))
    assert not os.path.exists(folder)


def test_the_package_is_found_without_importing_it(tmp_path, monkeypatch):
    """Importing it loads every extension: finding it must not."""
    package = tmp_path / "nvidia" / "nvimgcodec"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nvidia", raising=False)
    assert nvimgcodec_quiet.package_folder() == str(package)
    assert "nvidia.nvimgcodec" not in sys.modules
