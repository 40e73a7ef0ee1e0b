#!/usr/bin/env bash
# The Python package as pip users get it (pyproject.toml, meson-python):
#  1. `python3 -m venv v && v/bin/pip install .` from this checkout, then `import ordo` and a
#     call in that bare venv; the same in a `--system-site-packages` venv (where Debian's Dask
#     is); neither leaves a file in the checkout;
#  2. `python3 -m build --wheel`, the wheel installed into a second bare venv, the same checks,
#     and what the wheel must hold: the version, the type stubs, py.typed, Dask's entry points.
# Needs python3-venv, python3-build, python3-mesonpy and patchelf (README.md's test command).
# Usage: python_wheel_test.sh [WORK_DIR]; WORK_DIR (default: a temporary one) is removed after.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Debian's interpreter, which the README's apt command installs: python3 on PATH may be
# another (pyenv's, here).
py=/usr/bin/python3
work=${1:-$(mktemp -d /tmp/ordo-wheel.XXXXXX)}
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
version=$(sed -n "s/^  version : '\(.*\)',$/\1/p" meson.build)

check() {  # $1: a venv's python
    (cd "$work" && "$1" - "$version" <<'PY'
import asyncio, importlib.metadata as md, pathlib, sys
import ordo
assert "msgpack" not in sys.modules, "the package needs no msgpack module"
pkg = pathlib.Path(ordo.__file__).parent
assert pathlib.Path(sys.prefix) in pkg.parents, f"ordo from {pkg}, not from the venv"
assert md.version("ordo") == sys.argv[1], md.version("ordo")
assert ordo.__version__ == sys.argv[1], ordo.__version__
for f in ("__init__.pyi", "py.typed", "dask.py"):
    assert (pkg / f).is_file(), f"{f} is not in the package"
eps = {e.name: e.value for e in md.entry_points(group="distributed.comm.backends")}
assert eps.get("ordo") == "ordo.dask:OrdoBackend", eps
assert eps.get("ordo+resume") == "ordo.dask:OrdoResumeBackend", eps

async def main():
    srv = ordo.Server()

    @srv.method
    async def inc(x: int) -> int:
        return x + 1

    url = await srv.listen("tcp://127.0.0.1:0")
    async with await ordo.connect(url) as ch:
        assert await ch.inc(41) == 42
    await srv.stop()

asyncio.run(main())
print("ordo", md.version("ordo"), "imports and calls from", pkg)
PY
    )
}

# The build leaves nothing in the checkout (meson-python's native file).
had_native=$([ -e .mesonpy-native-file.ini ] && echo yes || echo no)
left_nothing() {
    if [ "$had_native" = no ] && [ -e .mesonpy-native-file.ini ]; then
        echo "python wheel: the build left .mesonpy-native-file.ini in the checkout" >&2
        exit 1
    fi
}

echo "python wheel: python3 -m venv v && v/bin/pip install ."
"$py" -m venv "$work/v"
"$work/v/bin/pip" install --no-input --disable-pip-version-check -q .
check "$work/v/bin/python"
left_nothing

# Where Dask users are: Debian's python3-distributed in a venv that sees the system's packages.
echo "python wheel: python3 -m venv --system-site-packages s && s/bin/pip install ."
"$py" -m venv --system-site-packages "$work/s"
"$work/s/bin/pip" install --no-input --disable-pip-version-check -q .
check "$work/s/bin/python"
left_nothing

echo "python wheel: python3 -m build --wheel, installed into a clean venv"
"$py" -m build --wheel --outdir "$work/dist" . >"$work/build.log" 2>&1 || {
    tail -40 "$work/build.log"
    exit 1
}
wheel=$(ls "$work"/dist/ordo-"$version"-*.whl)
# The package and its metadata, nothing else (no headers, libraries or tools: -Dwheel=true).
others=$("$py" - "$wheel" "$version" <<'PY'
import re, sys, zipfile
v = re.escape(sys.argv[2])
ok = re.compile(rf"(ordo/|ordo-{v}\.dist-info/|ordo-{v}\.data/(purelib|platlib)/ordo/)")
print(" ".join(n for n in zipfile.ZipFile(sys.argv[1]).namelist() if not ok.match(n)))
PY
)
if [ -n "$others" ]; then
    echo "python wheel: files outside the package: $others" >&2
    exit 1
fi
"$py" -m venv "$work/w"
"$work/w/bin/pip" install --no-input --disable-pip-version-check -q "$wheel"
check "$work/w/bin/python"
echo "python wheel: ok ($(basename "$wheel"), $(du -k "$wheel" | cut -f1) KiB)"
