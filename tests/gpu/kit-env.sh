# shellcheck shell=bash
# tests/gpu/kit-env.sh: points CMake, pkg-config and the dynamic loader at
# the kit that tests/gpu/kit makes, for tests/gpu/run.sh and
# tests/gpu/bare-check.  Sourced, never executed; nothing is unpacked into /.
#
# fb_kit_env KIT DEST: copies the kit to DEST (once per kit: DEST's MANIFEST
# must be KIT's) and unpacks its gzipped files there, so that KIT itself stays
# as small as it travels; then exports
#   PKG_CONFIG_PATH, PKG_CONFIG_LIBDIR  the kit's .pc directories, and only
#                                       those, so that nothing else mixes in
#   PKG_CONFIG                          the kit's pkgconf (FB_KIT_PKG_CONFIG too)
#   CMAKE_PREFIX_PATH                   DEST/usr first (find_package(PostgreSQL))
#   LD_LIBRARY_PATH                     DEST/ld-gaps first: links to the kit's
#                                       libraries whose sonames the machine's
#                                       loader does not know (ldconfig -p)
# The loader gets only the gaps, never a copy of a library the machine has:
# python3, PyTorch and the CUDA tools then load the machine's own (newer)
# libraries as they would without the kit.  Programs built against the kit
# find their direct libraries through the run path CMake gives them.
# FB_KIT_DIR is set to DEST.  Returns 1 with a message on stderr when KIT is
# not a kit or DEST cannot be made.
fb_kit_env() {
    local src=$1 kit=$2 usr lib gz f name have stem shorter
    if [[ ! -f $src/MANIFEST || ! -x $src/usr/bin/pkgconf ]]; then
        echo "error: no complete kit at $src (make it with tests/gpu/kit on a Debian 12 machine)" >&2
        return 1
    fi
    if ! cmp -s "$src/MANIFEST" "$kit/MANIFEST"; then
        rm -rf -- "$kit"
        if ! { mkdir -p "$kit" && cp -a "$src/." "$kit/"; }; then
            echo "error: could not copy the kit to $kit" >&2
            return 1
        fi
    fi
    kit=$(cd "$kit" && pwd)
    usr=$kit/usr
    lib=$usr/lib/x86_64-linux-gnu
    while IFS= read -r gz; do
        [[ -e ${gz%.gz} ]] && continue
        if ! { gzip -dc "$gz" >"${gz%.gz}.part" && mv "${gz%.gz}.part" "${gz%.gz}"; }; then
            echo "error: could not unpack $gz" >&2
            return 1
        fi
    done < <(find "$kit/usr" -name '*.gz' -path '*/lib/*')

    # Sonames the machine's loader already resolves.
    have=" $(ldconfig -p 2>/dev/null | awk 'NR > 1 { print $1 }' | sort -u | tr '\n' ' ') "
    rm -rf -- "$kit/ld-gaps"
    mkdir -p "$kit/ld-gaps"
    # A library's soname is its shortest versioned name (libz.so.1, not
    # libz.so.1.2.13): a name is skipped when a shorter one of the same file
    # family is there too.
    while IFS= read -r f; do
        name=${f##*/}
        [[ $have == *" $name "* ]] && continue
        stem=$name shorter=0
        while [[ $stem == *.so.*.* ]]; do
            stem=${stem%.*}
            [[ -e ${f%/*}/$stem ]] && shorter=1
        done
        ((shorter)) || ln -sfn "$f" "$kit/ld-gaps/$name"
    done < <(find "$lib" \( -type f -o -type l \) -name 'lib*.so.[0-9]*' | sort)
    FB_KIT_GAPS=$(find "$kit/ld-gaps" -mindepth 1 -printf '%f ' | sed 's/ $//')

    FB_KIT_PKG_CONFIG=$usr/bin/pkgconf
    export PKG_CONFIG=$FB_KIT_PKG_CONFIG
    export PKG_CONFIG_PATH=$lib/pkgconfig:$lib/openblas-pthread/pkgconfig
    export PKG_CONFIG_LIBDIR=$PKG_CONFIG_PATH
    export CMAKE_PREFIX_PATH=$usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
    export LD_LIBRARY_PATH=$kit/ld-gaps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    FB_KIT_DIR=$kit
}

# fb_kit_check: after fb_kit_env, every library of the kit must load with
# everything it needs (the machine's libraries or the gaps), and the pkg-config
# modules CMakeLists.txt asks for must be there.  Prints what is missing and
# returns 1; prints one line and returns 0 when nothing is.
fb_kit_check() {
    local f out bad=0 m n=0
    while IFS= read -r f; do
        n=$((n + 1))
        out=$(ldd "$f" 2>&1 | grep -E 'not found|version .* not found' || true)
        if [[ -n $out ]]; then
            echo "  ${f#"$FB_KIT_DIR"/}: $out" >&2
            bad=1
        fi
    done < <(find "$FB_KIT_DIR/usr" -type f \( -name 'lib*.so.[0-9]*' -o -name pkgconf \) | sort)
    for m in jansson libmicrohttpd libzmq libzstd libsodium openblas zlib libpq; do
        "$FB_KIT_PKG_CONFIG" --exists "$m" || {
            echo "  pkg-config module $m: not found in the kit" >&2
            bad=1
        }
    done
    if ((bad)); then
        echo "error: the kit does not fit this machine (above); make it again with tests/gpu/kit" >&2
        return 1
    fi
    echo "kit: $n libraries load; from the kit for the loader: ${FB_KIT_GAPS:-none}"
}
