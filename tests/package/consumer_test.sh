#!/usr/bin/env bash
# ordo as its users get it. Installs ordo into a staging directory (DESTDIR), builds
# tests/package/consumer.cpp against that install four ways and runs each build:
#   - CMake, find_package(ordo) and ordo::ordo (CMAKE_PREFIX_PATH into the staging tree);
#   - CMake, pkg_check_modules with only ${ORDO_INCLUDE_DIRS}, ${ORDO_LIBRARY_DIRS} and
#     ${ORDO_LIBRARIES} (the pattern that once built cleanly and crashed);
#   - g++ and clang++ with `pkg-config --cflags --libs ordo` (PKG_CONFIG_PATH into the tree).
# Then checks that a C++17 build and an Asio header before ordo's each fail with ordo's one line.
#
#   tests/package/consumer_test.sh [BUILD_DIR]
#
# BUILD_DIR is a configured meson build of ordo to install from (.ci/run passes build, already
# built); without it, the script sets up and builds a library-only build of its own. Needs cmake,
# pkg-config and g++ (apt-get install -y cmake pkg-config g++); clang++ is used when installed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
work=$(mktemp -d)
fail() {
    echo "consumer_test: FAIL: $*" >&2
    echo "consumer_test: logs and builds kept in $work" >&2
    exit 1
}
# Each line says how long the script has run, to keep the CI step's time in view.
say() { echo "consumer_test: [${SECONDS} s] $*"; }

for tool in meson cmake pkg-config g++; do
    command -v "$tool" >/dev/null || fail "$tool not found (apt-get install -y cmake pkg-config g++)"
done

build=${1:-}
if [ -z "$build" ]; then
    build=$work/build
    say "no build directory given: a library-only build in $build"
    meson setup "$build" "$src" -Dbuildtype=release -Dtests=false -Dexamples=false \
        -Dbenchmarks=false >"$work/setup.log" 2>&1 || fail "meson setup: $(tail -20 "$work/setup.log")"
fi

stage=$work/stage
meson install -C "$build" --destdir "$stage" >"$work/install.log" 2>&1 ||
    fail "meson install: $(tail -20 "$work/install.log")"
read -r prefix libdir < <(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
opts = {o["name"]: o["value"] for o in json.load(sys.stdin)}
print(opts["prefix"], opts["libdir"])')
root=$stage$prefix
case $libdir in /*) libdir=$stage$libdir ;; *) libdir=$root/$libdir ;; esac
[ -f "$libdir/cmake/ordo/ordoConfig.cmake" ] || fail "no $libdir/cmake/ordo/ordoConfig.cmake"
[ -f "$libdir/cmake/ordo/ordoConfigVersion.cmake" ] || fail "no ordoConfigVersion.cmake"
[ -f "$libdir/pkgconfig/ordo.pc" ] || fail "no $libdir/pkgconfig/ordo.pc"
say "installed into $root"

# Runs one build of the consumer: it must print the call's result and exit 0.
run_consumer() {
    local what=$1 exe=$2 out
    out=$(LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" timeout 30 "$exe" 2>&1) ||
        fail "$what: the consumer failed (exit status $?): $out"
    [ "$out" = "hello, consumer" ] || fail "$what: the consumer printed '$out', not 'hello, consumer'"
    say "$what: OK ($out)"
}

# Both CMake builds must find the staged install, not one that may lie elsewhere on the machine.
log=$work/cmake-config.log
if CMAKE_PREFIX_PATH=$root cmake -S "$here" -B "$work/cmake-config" -DORDO_VIA=cmake >"$log" 2>&1 &&
    cmake --build "$work/cmake-config" >>"$log" 2>&1; then
    grep -q "ordo_DIR: $libdir/cmake/ordo" "$log" || fail "CMake found another ordo: $(grep ordo_DIR "$log")"
    run_consumer "CMake find_package(ordo)" "$work/cmake-config/consumer"
    if [ -f "$libdir/libordo-prometheus.a" ] || [ -f "$libdir/libordo-prometheus.so" ]; then
        [ -x "$work/cmake-config/metrics_consumer" ] || fail "ordo-prometheus is installed but CMake has no ordo::prometheus"
        out=$(timeout 30 "$work/cmake-config/metrics_consumer" 2>&1) ||
            fail "the ordo::prometheus consumer failed: $out"
        [[ "$out" =~ ^metrics\ on\ http://127\.0\.0\.1:[1-9][0-9]*/metrics$ ]] ||
            fail "the ordo::prometheus consumer printed '$out'"
        say "CMake ordo::prometheus: OK ($out)"
    fi
else
    fail "CMake find_package(ordo) build: $(tail -40 "$log")"
fi

log=$work/cmake-pkg.log
if PKG_CONFIG_PATH=$libdir/pkgconfig cmake -S "$here" -B "$work/cmake-pkg" -DORDO_VIA=pkg-config \
        >"$log" 2>&1 && cmake --build "$work/cmake-pkg" >>"$log" 2>&1; then
    grep -q "ordo prefix: $libdir/pkgconfig" "$log" || fail "pkg-config found another ordo: $(grep 'ordo prefix' "$log")"
    run_consumer "CMake pkg_check_modules, include dirs and libraries only" "$work/cmake-pkg/consumer"
else
    fail "CMake pkg_check_modules build: $(tail -40 "$log")"
fi

export PKG_CONFIG_PATH=$libdir/pkgconfig
cflags=$(pkg-config --cflags ordo) || fail "pkg-config --cflags ordo"
libs=$(pkg-config --libs ordo) || fail "pkg-config --libs ordo"
case $cflags in *"-I$libdir/pkgconfig"*) ;; *) fail "pkg-config found another ordo: $cflags" ;; esac
for cxx in g++ clang++; do
    if ! command -v "$cxx" >/dev/null; then
        say "$cxx with pkg-config: skipped, $cxx is not installed"
        continue
    fi
    # shellcheck disable=SC2086 # the flags are words
    $cxx -std=c++20 "$here/consumer.cpp" -o "$work/consumer-$cxx" $cflags $libs >"$work/$cxx.log" 2>&1 ||
        fail "$cxx with pkg-config: $(tail -40 "$work/$cxx.log")"
    run_consumer "$cxx with pkg-config" "$work/consumer-$cxx"
done

# Forgetting C++20: the first error is ordo's, and it is the only one.
# shellcheck disable=SC2086
out=$(g++ -std=c++17 -fsyntax-only "$here/consumer.cpp" $cflags 2>&1) && fail "a C++17 build compiled"
first=$(grep -m1 'error' <<<"$out")
[[ "$first" == *'#error "ordo needs C++20 (-std=c++20)"'* ]] || fail "C++17: first error is not ordo's: $out"
[ "$(grep -c 'error:' <<<"$out")" -le 2 ] || fail "C++17: more errors than ordo's: $out"
say "C++17 build: OK, stops at $first"

# Asio read before ordo without ordo's defines would build and crash: it must not build.
out=$(printf '#include <asio/io_context.hpp>\n#include <ordo/ordo.hpp>\n' |
    g++ -std=c++20 -E -x c++ - -I"$root/include" -o /dev/null 2>&1) && fail "Asio before ordo compiled"
grep -q "an Asio header came before ordo's" <<<"$out" || fail "Asio before ordo: not ordo's error: $out"
say "Asio header before ordo's: OK, refused"

# The README's hello world on <ordo/client.hpp> alone builds and links against the install; how
# long it takes to compile is printed (bench/call_site_compile.sh), so that it is watched.
# shellcheck disable=SC2086
g++ -std=c++20 -O2 "$here/../../examples/hello.cpp" -o "$work/hello" $cflags $libs >"$work/hello.log" 2>&1 ||
    fail "hello world on ordo/client.hpp: $(tail -40 "$work/hello.log")"
say "hello world on ordo/client.hpp: builds and links"
say "$("$here/../../bench/call_site_compile.sh" "$libdir/pkgconfig")"

rm -rf "$work"
say "all passed"
