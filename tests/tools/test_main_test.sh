#!/usr/bin/env bash
# The test programs' main (tests/support/test_main.cpp): --file=PATH runs only the tests that
# PATH defines, --gtest_filter narrows them further, and a PATH the program does not hold is an
# error, never an empty pass. Usage: test_main_test.sh ORDO_TESTS SOURCE_ROOT
set -uo pipefail
exe=$1
src=$2
fail() { echo "test_main_test: $*" >&2; exit 1; }

# Tests as gtest lists them: "Suite.Name" per test.
listed() {
    "$exe" "$@" --gtest_list_tests | awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }'
}

file=comm/address_test.cpp
want=$(grep -cE '^TEST(_F)?\(' "$src/tests/$file")
[ "$want" -gt 1 ] || fail "no tests found in $file"

got=$(listed --file=$file) || fail "--file=$file failed"
[ "$(echo "$got" | wc -l)" -eq "$want" ] ||
    fail "--file=$file lists $(echo "$got" | wc -l) tests, the file defines $want: $got"
for t in $got; do
    grep -qE "^TEST(_F)?\(${t%%.*}, ${t#*.}\)" "$src/tests/$file" ||
        fail "--file=$file lists $t, which the file does not define"
done

all=$("$exe" --gtest_list_tests | grep -c '^  ')
[ "$all" -gt "$want" ] || fail "without --file only $all tests are listed"

one=$(listed --file=$file --gtest_filter=Address.TcpIpv6InBrackets)
[ "$one" = "Address.TcpIpv6InBrackets" ] || fail "--gtest_filter within --file: $one"

none=$(listed --file=$file --gtest_filter=-*) || fail "a filter that leaves all out failed"
[ -z "$none" ] || fail "a filter that leaves all out still lists: $none"

outside=$(listed --file=$file --gtest_filter=Codec.*)
[ -z "$outside" ] || fail "a filter naming another file's tests lists: $outside"

"$exe" --file=no/such_test.cpp >/dev/null 2>&1
[ $? -eq 2 ] || fail "--file=no/such_test.cpp did not exit with status 2"

echo "test_main_test: --file lists the $want tests of $file alone; filters narrow them"
