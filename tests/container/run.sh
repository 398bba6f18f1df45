#!/usr/bin/env bash
# tests/container/run.sh: the compose deployment of docker/, built and run.
#
# Builds the images of docker/ (server, CPU worker, PostgreSQL) with podman
# from a Debian 12 base image made from Debian's own packages (the one of
# tests/pristine/run.sh), runs docker/docker-compose.yml with podman-compose,
# does the first start's steps (keys, allow-list), runs the README's "Quick
# start with curl" against the stack, restarts the fuseboxd container while a
# second job trains (it completes exactly once), and brings the stack down and
# up again (the volumes keep the jobs, the keys and the models).
#
# The images are tagged with a hash of their inputs (the tree's files that git
# does not ignore, and the base image) and reused while it stays the same.
# The stack runs on the compose file's own network (a bridge; its names
# resolve through CNI's dnsname plugin); the builds use the host's network.
# The published ports are chosen free at start (FB_HTTP_PORT, FB_WORKER_PORT
# of the compose file), on 127.0.0.1.  compose-test.yml, written here, adds
# only the worker's test step hook.
#
# Needs root, podman, runc, the dnsname CNI plugin, debootstrap,
# podman-compose, git, curl and jq:
# `scripts/test --containers` installs them and runs this (label `container`).
# Knobs (environment):
#   FUSEBOX_CONTAINER_CACHE=DIR  containers.conf and the run logs (default /var/tmp/fusebox-container)
#   FUSEBOX_CONTAINER_KEEP=1     leave the stack and its volumes up afterwards (project name printed)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cache=${FUSEBOX_CONTAINER_CACHE:-/var/tmp/fusebox-container}
started=$SECONDS

say() { printf '\n==> [%4d s] %s\n' "$((SECONDS - started))" "$*"; }
die() {
    printf '\nFAILED: %s\n' "$*" >&2
    exit 1
}

((EUID == 0)) || die "run as root: podman here is rootful (scripts/test --containers)"
missing=()
for tool in podman runc debootstrap podman-compose git curl jq; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
[[ -x /usr/lib/cni/dnsname ]] || missing+=(golang-github-containernetworking-plugin-dnsname)
((${#missing[@]} == 0)) || die "missing: ${missing[*]} (scripts/test --containers installs them)"
mkdir -p "$cache/runs"

# Podman 4.3 here: runc (crun is not installed) and no default ulimits (the
# host's hard limits are lower than podman's defaults); for podman-compose's
# podman calls too, which take no flags for it.
export CONTAINERS_CONF=$cache/containers.conf
cat >"$CONTAINERS_CONF" <<'CONF'
[containers]
default_ulimits = []

[engine]
runtime = "runc"
CONF

say "base image debian:12-slim (tests/pristine/run.sh)"
FUSEBOX_PRISTINE_IMAGE_ONLY=1 "$root/tests/pristine/run.sh" >"$cache/base.log" 2>&1 ||
    { tail -n 20 "$cache/base.log" >&2; die "no base image (log: $cache/base.log)"; }
base_id=$(podman image inspect --format '{{.Id}}' debian:12-slim)

work=$(mktemp -d "$cache/run.XXXXXX")
project=fbct$$
ctr() { printf '%s_%s_1' "$project" "$1"; }
compose() { (cd "$work/ctx/docker" && podman-compose -p "$project" -f docker-compose.yml \
    -f compose-test.yml "$@") >>"$work/compose.log" 2>&1; }
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    local rc=$?
    if ((rc != 0)) && [[ -e $work/compose.log ]]; then
        for s in postgres fuseboxd worker-cpu; do
            printf '\n---- logs of %s (last 40 lines) ----\n' "$s" >&2
            podman logs --tail 40 "$(ctr "$s")" >&2 2>&1 || true
        done
        local kept
        kept=$cache/runs/$(date -u +%Y%m%dT%H%M%SZ)-$project-compose.log
        cp "$work/compose.log" "$kept" && echo "podman-compose's output: $kept" >&2
    fi
    if [[ ${FUSEBOX_CONTAINER_KEEP:-0} == 1 ]]; then
        echo "kept: project $project, files in $work"
        return
    fi
    # every container and volume of this run, whatever state it reached
    local ids
    mapfile -t ids < <(podman ps -aq --filter "name=^${project}_" 2>/dev/null || true)
    ((${#ids[@]} == 0)) || podman rm -f -t 5 "${ids[@]}" >/dev/null 2>&1 || true
    mapfile -t ids < <(podman volume ls -q --filter "name=^${project}_" 2>/dev/null || true)
    ((${#ids[@]} == 0)) || podman volume rm -f "${ids[@]}" >/dev/null 2>&1 || true
    podman network rm -f "${project}_default" >/dev/null 2>&1 || true
    rm -rf -- "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The build context: the tree's files that git does not ignore, as they are
# in the working tree (uncommitted edits count), in one tar whose hash is the
# images' tag.
say "build context"
(cd "$root" && git ls-files -z -co --exclude-standard) |
    while IFS= read -r -d '' f; do [[ -e $root/$f ]] && printf '%s\0' "$f"; done >"$work/files"
tar -C "$root" --null -T "$work/files" --sort=name --mtime=@0 --owner=0 --group=0 \
    --numeric-owner -cf "$work/ctx.tar"
mkdir "$work/ctx"
tar -C "$work/ctx" -xf "$work/ctx.tar"
tag=$({ echo "$base_id"; sha256sum <"$work/ctx.tar"; } | sha256sum | cut -c1-16)

# build_image NAME TAG DOCKERFILE [podman build flags...]: builds NAME:TAG
# unless it exists, then removes the other tags of NAME (the layers that they
# share with it stay, and so do the build stages' cached layers).
build_image() {
    local name=$1 tag=$2 file=$3 t0=$SECONDS old
    shift 3
    if podman image exists "$name:$tag"; then
        say "$name:$tag: reused (its inputs did not change)"
        return
    fi
    say "$name:$tag: podman build -f docker/$file"
    podman build --pull=never --network host "$@" -f "$work/ctx/docker/$file" -t "$name:$tag" \
        "$work/ctx" >"$cache/build-$name.log" 2>&1 ||
        { tail -n 30 "$cache/build-$name.log" >&2; die "podman build of $name failed (log: $cache/build-$name.log)"; }
    echo "built in $((SECONDS - t0)) s"
    for old in $(podman images --format '{{.Repository}}:{{.Tag}}' --filter "reference=$name"); do
        [[ $old == */$name:$tag || $old == "$name:$tag" ]] || podman rmi "$old" >/dev/null 2>&1 || true
    done
}
# npm in the build trusts what the host's npm trusts (NODE_EXTRA_CA_CERTS)
ca_args=()
if [[ -n ${NODE_EXTRA_CA_CERTS:-} && -r $NODE_EXTRA_CA_CERTS ]]; then
    ca_args=(-v "$NODE_EXTRA_CA_CERTS:/etc/fusebox-host-ca.crt:ro"
        --build-arg NODE_EXTRA_CA_CERTS=/etc/fusebox-host-ca.crt)
fi
build_image fusebox-postgres "$tag" Dockerfile.postgres
build_image fusebox-server "$tag" Dockerfile.server "${ca_args[@]}"
build_image fusebox-worker-cpu "$tag" Dockerfile.worker-cpu

# free_port: a TCP port nothing listens on now
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
FB_HTTP_PORT=$(free_port) FB_WORKER_PORT=$(free_port)
export FB_IMAGE_TAG=$tag FB_HTTP_PORT FB_WORKER_PORT
url=http://127.0.0.1:$FB_HTTP_PORT
mkdir -m 0777 "$work/hooks"
# The worker with the test step hook (docs/worker.md), so that a job is
# mid-training, held at a step, when fuseboxd restarts, however fast the
# machine is.
cat >"$work/ctx/docker/compose-test.yml" <<YAML
services:
  worker-cpu:
    environment:
      FUSEBOX_TEST_HOOKS: "1"
      FUSEBOX_WORKER_TEST_STEP_HOOK: /hooks
    volumes:
      - $work/hooks:/hooks
YAML

# wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds, once a second
wait_for() {
    local what=$1 limit=$2 i=0
    shift 2
    until "$@" >/dev/null 2>&1; do
        i=$((i + 1))
        ((i <= limit)) || die "$what: not after $limit s"
        sleep 1
    done
}
ready() { curl -fsS -o /dev/null "$url/readyz"; }

# The first start, as docker/init.sh does it (that script drives
# `docker compose`): password, PostgreSQL and fuseboxd, the worker's keypair
# made in its own volume, its public key in the allow-list, the server's
# public key in the worker's volume.
say "first start: podman-compose up -d postgres fuseboxd (project $project)"
mkdir -p "$work/ctx/docker/import"
install -d -m 0700 "$work/ctx/docker/secrets"
od -An -N32 -tx1 /dev/urandom | tr -d ' \n' >"$work/ctx/docker/secrets/postgres_password"
chmod 0644 "$work/ctx/docker/secrets/postgres_password"
compose up -d --no-build postgres fuseboxd || die "podman-compose up failed (log: $work/compose.log)"
wait_for "fuseboxd ready ($url/readyz)" 180 ready
wait_for "server.key.pub" 30 podman exec "$(ctr fuseboxd)" test -s /var/lib/fusebox/server.key.pub
server_pub=$(podman exec "$(ctr fuseboxd)" cat /var/lib/fusebox/server.key.pub)
wvol=${project}_worker-cpu
# shellcheck disable=SC2016 # expanded by the container's shell
pub=$(podman run --rm --network none -v "$wvol:/var/lib/fusebox-worker" --entrypoint sh \
    "fusebox-worker-cpu:$tag" -c '
        k=/var/lib/fusebox-worker/worker.key
        [ -e "$k" ] || fusebox-worker --gen-key "$k" >/dev/null
        sed -n "s/^public: *//p" "$k"')
[[ -n $pub ]] || die "no public key from the worker's volume"
# shellcheck disable=SC2016 # expanded by the container's shell
podman exec "$(ctr fuseboxd)" sh -c 'printf "# worker-cpu\n%s\n" "$1" >>/var/lib/fusebox/worker-keys' \
    sh "$pub"
printf '%s\n' "$server_pub" | podman run --rm -i --network none -v "$wvol:/var/lib/fusebox-worker" \
    --entrypoint sh "fusebox-worker-cpu:$tag" -c 'cat >/var/lib/fusebox-worker/server.key.pub'
say "podman-compose up -d (the worker)"
compose up -d --no-build || die "podman-compose up failed (log: $work/compose.log)"
admin=$(podman exec "$(ctr fuseboxd)" cat /var/lib/fusebox/admin.key)
workers_up() {
    curl -fsS -H "Authorization: Bearer $admin" "$url/v1/workers" |
        jq -e '[.workers[] | select(.name == "cpu-1" and .state == "ready")] | length >= 1'
}
wait_for "worker cpu-1 connected" 120 workers_up

# The README's block, as it is, against the stack; its variables are kept.
say "README.md: Quick start with curl"
mkdir "$work/qs" "$work/data"
printf '%s\n' "$admin" >"$work/data/admin.key"
block=$(awk '/^## Quick start with curl/ {s = 1} s && /^```sh/ {b = 1; next} b && /^```/ {exit} b' \
    "$root/README.md")
[[ -n $block ]] || die "README.md has no sh block under 'Quick start with curl'"
(cd "$work/qs" && FUSEBOX_URL=$url FUSEBOX_DATA_DIR=$work/data timeout 600 bash -euo pipefail -c \
    "$block"$'\n''declare -p KEY JOB >vars') >"$work/quickstart.log" 2>&1 ||
    { cat "$work/quickstart.log" >&2; die "the quick start failed"; }
# shellcheck disable=SC1091 # written just above
source "$work/qs/vars"
api() { curl -fsS -H "Authorization: Bearer $KEY" "$url$1"; }
[[ $(api "/v1/jobs/$JOB" | jq -r .state) == completed ]] || die "the quick start's job did not complete"
[[ -s $work/qs/model.safetensors ]] || die "no model.safetensors from the quick start"
model_sum=$(sha256sum <"$work/qs/model.safetensors")
echo "job $JOB completed; model.safetensors: $(stat -c %s "$work/qs/model.safetensors") bytes"

# A second job, held at step 100 by the step hook, restarts under fuseboxd.
say "fuseboxd restarted while a job trains"
name=restart-mlp
printf '100\n' >"$work/hooks/.hold" && mv "$work/hooks/.hold" "$work/hooks/hold-$name"
spec=$(jq -n --arg name "$name" '{name: $name, dataset: "fashion-mnist",
    model: {input: [1, 28, 28], layers: [{type: "flatten"}, {type: "linear", out: 32},
        {type: "relu"}, {type: "linear", out: 10}]},
    batch_size: 64, steps: 300, eval_every: 100, optimizer: {type: "adamw", lr: 0.003}}')
job2=$(curl -fsS -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d "$spec" \
    "$url/v1/jobs" | jq -r .id)
wait_for "job $job2 held at step 100" 300 test -s "$work/hooks/held-$name"
[[ $(api "/v1/jobs/$job2" | jq -r .state) == running ]] || die "job $job2 is not running when held"
compose restart -t 30 fuseboxd || die "podman-compose restart failed (log: $work/compose.log)"
wait_for "fuseboxd ready again" 180 ready
rm -f "$work/hooks/hold-$name"
job_done() { api "/v1/jobs/$job2" | jq -e '.state == "completed" or .state == "failed" or .state == "cancelled"'; }
wait_for "job $job2 ends" 600 job_done
[[ $(api "/v1/jobs/$job2" | jq -r .state) == completed ]] ||
    die "job $job2 ended $(api "/v1/jobs/$job2" | jq -c '{state, error}')"
api "/v1/jobs/$job2/events?limit=1000" >"$work/events.json"
completed=$(jq '[.events[] | select(.kind == "completed")] | length' "$work/events.json")
((completed == 1)) || { jq -c '.events[] | {kind, message}' "$work/events.json" >&2; die "$completed completed events for job $job2, not 1"; }
echo "job $job2 completed once across the restart (events: $(jq -r '[.events[].kind] | join(", ")' \
    "$work/events.json"))"

# Down and up: the volumes keep the database, the keys and the models.
say "podman-compose down, up -d"
compose down -t 120 || die "podman-compose down failed (log: $work/compose.log)"
[[ -z $(podman ps -aq --filter "name=^${project}_") ]] || die "containers left after down"
compose up -d --no-build || die "podman-compose up failed (log: $work/compose.log)"
wait_for "fuseboxd ready after up" 180 ready
[[ $(podman exec "$(ctr fuseboxd)" cat /var/lib/fusebox/admin.key) == "$admin" ]] || die "admin key changed"
[[ $(api "/v1/jobs/$JOB" | jq -r .state) == completed ]] || die "job $JOB lost after down and up"
[[ $(api "/v1/jobs/$job2" | jq -r .state) == completed ]] || die "job $job2 lost after down and up"
api "/v1/jobs/$JOB/model" >"$work/model-again.safetensors"
[[ $(sha256sum <"$work/model-again.safetensors") == "$model_sum" ]] || die "the model changed after down and up"
wait_for "worker cpu-1 connected after up" 120 workers_up

say "passed: images $tag, the stack up, the quick start, a restart, down and up ($((SECONDS - started)) s)"
