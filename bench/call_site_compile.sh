#!/usr/bin/env bash
# How long a call site takes to compile: the README's hello world (examples/hello.cpp: connect,
# a stub, one call; <ordo/client.hpp>) and the same program on <ordo/ordo.hpp>, each compiled at
# -O2 with the flags of an installed ordo.pc (pkg-config --cflags ordo), 3 times; prints the
# medians. Usage: bench/call_site_compile.sh PKG_CONFIG_DIR (where ordo.pc was installed).
# .ci/run runs it after installing ordo under a DESTDIR, so that the figure is watched.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
export PKG_CONFIG_PATH=$1
cflags=$(pkg-config --cflags ordo)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$here/examples/hello.cpp" "$work/client.cpp"
sed 's|#include <ordo/client.hpp>|#include <ordo/ordo.hpp>|' "$here/examples/hello.cpp" >"$work/full.cpp"
median() {  # median FILE: seconds to compile it, the median of 3 runs
    for _ in 1 2 3; do
        /usr/bin/time -f %e -o "$work/t" g++ -std=c++20 -O2 -c "$1" $cflags -o "$work/o.o"
        cat "$work/t"
    done | sort -n | sed -n 2p
}
echo "call site compile (hello world, g++ -O2, median of 3): <ordo/client.hpp> $(median "$work/client.cpp") s," \
    "<ordo/ordo.hpp> $(median "$work/full.cpp") s"
