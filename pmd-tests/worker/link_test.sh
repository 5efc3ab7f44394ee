#!/bin/sh
# A trainer links the installed worker library through pkg-config alone:
# install the library, its headers and mercury-worker.pc into a temporary
# root, then compile and run a C and a C++ program against them.
#   link_test.sh BUILD_DIR SOURCE_DIR
set -eu
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=$tmp/root
meson install -C "$build" --destdir "$root" --no-rebuild --tags worker,devel --quiet
pc=$(find "$root" -name mercury-worker.pc)
[ -n "$pc" ] || { echo "mercury-worker.pc was not installed"; exit 1; }
export PKG_CONFIG_PATH="$(dirname "$pc")"
export PKG_CONFIG_SYSROOT_DIR="$root"
cflags=$(pkg-config --cflags mercury-worker)
libs=$(pkg-config --libs mercury-worker)
libdir=$(dirname "$(dirname "$pc")")  # <libdir>/pkgconfig/mercury-worker.pc
echo "pkg-config: $cflags $libs"
cc -std=c11 -Wall -Wextra -Werror "$src/trainer.c" $cflags $libs -o "$tmp/trainer_c"
c++ -std=c++20 -Wall -Wextra -Werror "$src/trainer.cpp" $cflags $libs -o "$tmp/trainer_cpp"
MERCURY_JOB=/nonexistent/env-job.yaml LD_LIBRARY_PATH="$libdir" "$tmp/trainer_c"
LD_LIBRARY_PATH="$libdir" "$tmp/trainer_cpp"
