#!/bin/sh
# scripts/test refuses bad arguments and knobs with a clear error, before it
# installs, builds or runs anything: each case must exit 1 with its message
# and print none of the first step's output ("packages:").
set -u
src=${FB_SOURCE_DIR:?FB_SOURCE_DIR is not set}
fails=0
# check NAME EXPECTED_MESSAGE ENV_ASSIGNMENT|- [ARGS...]
check() {
    name=$1 want=$2 assign=$3
    shift 3
    if [ "$assign" = - ]; then
        out=$(env -u FUSEBOX_TEST_LABEL -u FUSEBOX_TEST_CONTAINERS "$src/scripts/test" "$@" 2>&1)
    else
        out=$(env -u FUSEBOX_TEST_LABEL -u FUSEBOX_TEST_CONTAINERS "$assign" "$src/scripts/test" \
            "$@" 2>&1)
    fi
    rc=$?
    if [ "$rc" -ne 1 ] || ! printf '%s' "$out" | grep -qF "$want" ||
        printf '%s' "$out" | grep -q 'packages:'; then
        printf 'FAIL %s: exit %s, output:\n%s\n' "$name" "$rc" "$out"
        fails=$((fails + 1))
    else
        printf 'ok   %s\n' "$name"
    fi
}
check "unknown option" "unknown argument '--bogus'" - --bogus
check "an operand" "unknown argument 'build'" - build
check "containers knob not 0/1" "FUSEBOX_TEST_CONTAINERS must be 0 or 1, not 'yes'" \
    FUSEBOX_TEST_CONTAINERS=yes
check "label container without --containers" "runs only with --containers" \
    FUSEBOX_TEST_LABEL=container
check "label ^container\$ without --containers" "runs only with --containers" \
    'FUSEBOX_TEST_LABEL=^container$'
check "bad jobs still refused" "FUSEBOX_TEST_JOBS must be a positive integer" \
    FUSEBOX_TEST_JOBS=0 --containers
[ "$fails" -eq 0 ] || exit 1
echo "ok: scripts/test refuses every bad argument and knob"
