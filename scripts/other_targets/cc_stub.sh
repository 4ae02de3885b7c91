#!/usr/bin/env bash
# A C compiler for `cargo check` of Apple targets without Apple's SDK: each
# compile (`-c … -o OUT`) becomes an empty object, every other call goes to
# clang. Only for type-checking: nothing built with it is linked or run.
out=""
compile=0
prev=""
for a in "$@"; do
    [ "$a" = "-c" ] && compile=1
    [ "$prev" = "-o" ] && out="$a"
    prev="$a"
done
if [ "$compile" = 1 ] && [ -n "$out" ]; then
    exec clang -c -x c /dev/null -o "$out"
fi
exec clang "$@"
