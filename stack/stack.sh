#!/usr/bin/env bash
# sessionstream's local stack without Docker: one Apache Kafka (KRaft, broker+controller)
# on 127.0.0.1:9092 and one PostgreSQL cluster of our own on 127.0.0.1:5432.
#
#   stack/stack.sh up       start what is not running; return when both answer
#   stack/stack.sh down     stop what this script started (nothing else)
#   stack/stack.sh status   say what runs
#   stack/stack.sh reset    down, then delete the state (data, logs); keeps the jar cache
#   stack/stack.sh restart-postgres|restart-kafka|restart-registry   stop and start one server
#   stack/stack.sh kill-registry   kill -9 the registry (fault tests)
#   stack/stack.sh connect-up|connect-down|kill-connect   Kafka Connect, on demand (make connect)
#   stack/stack.sh kill-node|stop-node|start-node N  kill -9 / stop / start one Kafka node
#   stack/stack.sh where    print the profile's addresses and directories (shell assignments)
#
# The schema registry (Apicurio Registry, its Confluent-compatible API on
# 127.0.0.1:8081/apis/ccompat/v7) runs next to them, its schemas stored in the cluster's
# database sessionstream_registry; `up`, `down` and `status` include it, and
# restart-registry|kill-registry serve the fault tests. One registry serves every profile
# (it depends on PostgreSQL only, like the profiles themselves).
#
# Two more profiles run next to the default one, each with its own ports and state:
#   SESSIONSTREAM_STACK_SECURE=1   one node, SASL_PLAINTEXT SCRAM-SHA-512 on 127.0.0.1:9192,
#                                  ACLs per role, PostgreSQL roles in database
#                                  sessionstream_secure (credentials in <state>/credentials)
#   SESSIONSTREAM_KAFKA_BROKERS=3  three nodes on 127.0.0.1:9292-9294 (RF 3, min ISR 2)
# Both use the default stack's PostgreSQL (and start it when it is not running).
#
# Needs the project's virtualenv (make install) for the readiness probes. A user with their
# own Kafka/PostgreSQL sets SESSIONSTREAM_KAFKA_BOOTSTRAP / SESSIONSTREAM_DATABASE_URL; when
# those point elsewhere this script only checks that they answer. See docs/local-stack.md.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STACK="$REPO/stack"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
# the stack's own tools (stack/probe.py, stack/secure.py) live beside this script, outside
# the installed package: `-m stack.probe` finds them from the repository's root
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
TIMEOUT="${SESSIONSTREAM_STACK_TIMEOUT:-90}"
STATE_DIR="${SESSIONSTREAM_STATE_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/sessionstream}"
KAFKA_LIBS="${SESSIONSTREAM_KAFKA_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/sessionstream/kafka-libs}"
KAFKA_HEAP="${SESSIONSTREAM_KAFKA_HEAP:-512m}"
# Extra arguments for `kafka-storage format`, e.g. "--feature transaction.version=0"
# (only read when the storage is formatted, i.e. on the first `up` or after `reset`).
KAFKA_FORMAT_ARGS="${SESSIONSTREAM_KAFKA_FORMAT_ARGS:-}"

SECURE="${SESSIONSTREAM_STACK_SECURE:-0}"
BROKERS="${SESSIONSTREAM_KAFKA_BROKERS:-1}"
[[ "$SECURE" =~ ^[01]$ ]] || { echo "error: SESSIONSTREAM_STACK_SECURE must be 0 or 1" >&2; exit 1; }
case "$BROKERS" in
    1) PROFILE=default ;;
    3) PROFILE=cluster ;;
    *) echo "error: SESSIONSTREAM_KAFKA_BROKERS must be 1 or 3, not '$BROKERS'" >&2; exit 1 ;;
esac
if [[ "$SECURE" == 1 ]]; then
    [[ "$PROFILE" == default ]] || { echo "error: the secured profile has one broker; unset SESSIONSTREAM_KAFKA_BROKERS" >&2; exit 1; }
    PROFILE=secure
fi

# Each profile: its own state directory, ports and Kafka nodes (node N, N = 1..NODES).
# KAFKA_PORTS/CONTROLLER_PORTS are per node; the default profile is what it always was.
case "$PROFILE" in
    default)
        PROFILE_DIR="$STATE_DIR"
        NODES=1
        KAFKA_PORTS=(9092)
        CONTROLLER_PORTS=(9093)
        OVERLAY=""
        ;;
    secure)
        PROFILE_DIR="${SESSIONSTREAM_SECURE_STATE_DIR:-$STATE_DIR-secure}"
        NODES=1
        KAFKA_PORTS=("${SESSIONSTREAM_SECURE_KAFKA_PORT:-9192}")
        CONTROLLER_PORTS=("${SESSIONSTREAM_SECURE_CONTROLLER_PORT:-9193}")
        OVERLAY="$STACK/kafka/secure.properties.in"
        CRED_DIR="$PROFILE_DIR/credentials"
        SECURE_DB="${SESSIONSTREAM_SECURE_DATABASE:-sessionstream_secure}"
        [[ "$SECURE_DB" =~ ^[a-z_][a-z0-9_]*$ ]] || { echo "error: SESSIONSTREAM_SECURE_DATABASE must be a plain lower-case name" >&2; exit 1; }
        ;;
    cluster)
        PROFILE_DIR="${SESSIONSTREAM_CLUSTER_STATE_DIR:-$STATE_DIR-cluster}"
        NODES=3
        base="${SESSIONSTREAM_CLUSTER_KAFKA_PORT:-9292}"
        cbase="${SESSIONSTREAM_CLUSTER_CONTROLLER_PORT:-9392}"
        KAFKA_PORTS=("$base" "$((base + 1))" "$((base + 2))")
        CONTROLLER_PORTS=("$cbase" "$((cbase + 1))" "$((cbase + 2))")
        OVERLAY="$STACK/kafka/cluster.properties.in"
        ;;
esac
BOOTSTRAP="$(printf '127.0.0.1:%s,' "${KAFKA_PORTS[@]}")"
BOOTSTRAP="${BOOTSTRAP%,}"

use_node() { # N: point the KAFKA_* variables at node N of the profile
    NODE="$1"
    [[ "$NODE" =~ ^[0-9]+$ && "$NODE" -ge 1 && "$NODE" -le "$NODES" ]] \
        || die "no node '$NODE' in the $PROFILE profile (nodes 1..$NODES)"
    if [[ $NODES == 1 ]]; then KAFKA_DIR="$PROFILE_DIR/kafka"; else KAFKA_DIR="$PROFILE_DIR/kafka-$NODE"; fi
    KAFKA_PORT="${KAFKA_PORTS[$((NODE - 1))]}"
    KAFKA_CTRL_PORT="${CONTROLLER_PORTS[$((NODE - 1))]}"
    KAFKA_ADDR="127.0.0.1:$KAFKA_PORT"
    KAFKA_DATA="$KAFKA_DIR/data"
    KAFKA_LOGS="$KAFKA_DIR/logs"
    KAFKA_PROPS="$KAFKA_DIR/server.properties"
    KAFKA_PIDFILE="$KAFKA_DIR/kafka.pid"
    # Copied next to the rendered server.properties, so a running broker never depends on
    # the checkout that started it (CI starts it from a clone that is deleted afterwards).
    KAFKA_LOG4J="$KAFKA_DIR/log4j2.yaml"
    KAFKA_JAAS="$KAFKA_DIR/jaas.conf"
    # what the probe needs to get an answer from this node
    PROBE_ARGS=()
    [[ $PROFILE == secure ]] && PROBE_ARGS=(--credentials "$CRED_DIR/admin.env")
    [[ $NODES -gt 1 ]] && PROBE_ARGS=(--node "$NODE")
    return 0
}


IS_ROOT=0
[[ "$(id -u)" == 0 ]] && IS_ROOT=1
# PostgreSQL refuses to run as root, so as root it runs as the `postgres` OS user, which
# cannot enter root's private home: its cluster then lives under /var/lib instead.
if [[ $IS_ROOT == 1 ]]; then
    PG_DIR="${SESSIONSTREAM_PG_DIR:-/var/lib/sessionstream/postgres}"
else
    PG_DIR="${SESSIONSTREAM_PG_DIR:-$STATE_DIR/postgres}"
fi
PG_DATA="$PG_DIR/data"
PG_SOCK="$PG_DIR/run"
PG_LOG="$PG_DIR/postgres.log"
PG_PORT=5432
PG_ROLE=sessionstream
PG_PASSWORD=sessionstream
PG_DB=sessionstream

say() { printf '%s\n' "$*"; }
warn() { printf '%s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

show_tail() { # file [lines]
    local file="$1" n="${2:-40}"
    if [[ -s "$file" ]]; then
        warn "---- last $n lines of $file ----"
        tail -n "$n" "$file" >&2
        warn "----"
    fi
}

listening() { # host port -> 0 when something accepts TCP connections
    timeout 2 bash -c "exec 3<>/dev/tcp/$1/$2" 2>/dev/null
}

who_listens() { # port -> one line about the listening process, if ss can tell
    ss -ltnpH "sport = :$1" 2>/dev/null | head -n 1 || true
}

have_apt_as_root() { [[ $IS_ROOT == 1 ]] && command -v apt-get >/dev/null; }

APT_UPDATED=0
apt_install() {
    if [[ $APT_UPDATED == 0 ]]; then
        say "apt: apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        APT_UPDATED=1
    fi
    say "apt: apt-get install -y $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

load_config() {
    [[ -x "$PYTHON" ]] || die "no Python at $PYTHON: run 'make install' first (or set PYTHON)"
    local out
    out="$("$PYTHON" -m stack.probe config)" || die "could not read sessionstream settings"
    eval "$out"
}

# --------------------------------------------------------------------------- Kafka

ktag() { # how output lines name the current node
    case "$PROFILE" in
        default) printf 'kafka' ;;
        secure) printf 'kafka-secure' ;;
        *) printf 'kafka-%s/%s' "$PROFILE" "$NODE" ;;
    esac
}

kafka_pid() { # prints the pid of the broker this script started, if it still runs
    [[ -f "$KAFKA_PIDFILE" ]] || return 1
    local pid
    pid="$(cat "$KAFKA_PIDFILE" 2>/dev/null || true)"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [[ -r "/proc/$pid/cmdline" ]] || return 1
    # A pid can be reused after a crash: it is ours only if it runs kafka.Kafka on our config.
    tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "kafka.Kafka $KAFKA_PROPS" || return 1
    printf '%s\n' "$pid"
}

drop_stale_kafka_pidfile() {
    if [[ -f "$KAFKA_PIDFILE" ]] && ! kafka_pid >/dev/null; then
        say "$(ktag): removing stale pid file (pid $(cat "$KAFKA_PIDFILE" 2>/dev/null) is no longer our broker)"
        rm -f "$KAFKA_PIDFILE"
    fi
}

java_major() {
    java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}

JAVA_OK=0
ensure_java_and_maven() { # once per run: `java -version` alone takes seconds on a busy machine
    [[ $JAVA_OK == 1 ]] && return 0
    if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then
        have_apt_as_root || die "Kafka needs Java 17+ and Maven (java, mvn) on PATH"
        apt_install default-jre-headless maven
    fi
    local major
    major="$(java_major)"
    [[ -n "$major" && "$major" -ge 17 ]] || die "Kafka 4 needs Java 17+, found: $(java -version 2>&1 | head -n 1)"
    JAVA_OK=1
}

ensure_kafka_libs() {
    # The cache is keyed by the pom's hash: a version bump in the pom re-resolves once,
    # every other `up` uses the cached jars without touching the network.
    local want have=""
    want="$(sha256sum "$STACK/kafka/pom.xml" | cut -d' ' -f1)"
    [[ -f "$KAFKA_LIBS/.pom.sha256" ]] && have="$(cat "$KAFKA_LIBS/.pom.sha256")"
    [[ "$want" == "$have" ]] && return 0
    say "kafka: resolving the broker's jars from Maven Central into $KAFKA_LIBS"
    local tmp="$KAFKA_LIBS.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$(dirname "$KAFKA_LIBS")"
    if ! mvn -q -B -f "$STACK/kafka/pom.xml" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$tmp" >"$tmp.log" 2>&1; then
        show_tail "$tmp.log" 60
        rm -rf "$tmp"
        die "kafka: mvn could not resolve the broker's jars (log above)"
    fi
    rm -f "$tmp.log"
    printf '%s\n' "$want" >"$tmp/.pom.sha256"
    rm -rf "$KAFKA_LIBS"
    mv "$tmp" "$KAFKA_LIBS"
}

kafka_java() { # runs a Kafka main class with our logging config
    java -Dlog4j2.configurationFile="$KAFKA_LOG4J" -Dkafka.logs.dir="$KAFKA_LOGS" \
        -cp "$KAFKA_LIBS/*" "$@"
}

kafka_version() {
    local jar
    jar="$(ls "$KAFKA_LIBS"/kafka_2.13-*.jar 2>/dev/null | head -n 1)"
    jar="${jar##*/kafka_2.13-}"
    printf '%s\n' "${jar%.jar}"
}

render_props() { # server.properties of the current node: the base, then the profile's overlay
    local base="$STACK/kafka/server.properties.in" voters="" i
    for ((i = 1; i <= NODES; i++)); do voters+="$i@127.0.0.1:${CONTROLLER_PORTS[$((i - 1))]},"; done
    {
        if [[ -z "$OVERLAY" ]]; then
            cat "$base"
        else
            # every base line whose key the overlay sets is dropped, so each key appears once
            awk 'NR == FNR { if ($0 !~ /^[[:space:]]*(#|$)/) over[substr($0, 1, index($0, "=") - 1)] = 1; next }
                 /^[[:space:]]*(#|$)/ || !(substr($0, 1, index($0, "=") - 1) in over)' "$OVERLAY" "$base"
            printf '\n# ---- %s (profile %s, node %s): replaces the same keys above\n' \
                "${OVERLAY##*/}" "$PROFILE" "$NODE"
            cat "$OVERLAY"
        fi
    } | sed -e "s#@LOG_DIRS@#$KAFKA_DATA#" -e "s#@NODE_ID@#$NODE#" -e "s#@PORT@#$KAFKA_PORT#g" \
        -e "s#@CONTROLLER_PORT@#$KAFKA_CTRL_PORT#g" -e "s#@VOTERS@#${voters%,}#" >"$KAFKA_PROPS"
}

SCRAM_ARGS=()
secure_prepare() { # credentials files, the broker's jaas.conf, the format-time SCRAM users
    local out
    out="$("$PYTHON" -m stack.secure prepare "$CRED_DIR" --bootstrap "$BOOTSTRAP" \
        --database-url "$CFG_SECURE_DATABASE_URL" --jaas "$KAFKA_JAAS" \
        --registry-url "$REGISTRY_URL")" \
        || die "kafka-secure: could not write the credentials in $CRED_DIR"
    SCRAM_ARGS=()
    local line
    while IFS= read -r line; do SCRAM_ARGS+=(--add-scram "$line"); done <<<"$out"
}

kafka_prepare() {
    mkdir -p "$KAFKA_DATA" "$KAFKA_LOGS"
    render_props
    cp "$STACK/kafka/log4j2.yaml" "$KAFKA_LOG4J"
    [[ $PROFILE == secure ]] && secure_prepare
    if [[ ! -f "$KAFKA_DATA/meta.properties" ]]; then
        local cluster_id quorum=(--standalone)
        if [[ $NODES -gt 1 ]]; then
            # one cluster id for all nodes; a static quorum (controller.quorum.voters)
            quorum=()
            [[ -s "$PROFILE_DIR/cluster.id" ]] \
                || kafka_java kafka.tools.StorageTool random-uuid >"$PROFILE_DIR/cluster.id"
            cluster_id="$(cat "$PROFILE_DIR/cluster.id")"
        else
            cluster_id="$(kafka_java kafka.tools.StorageTool random-uuid)"
        fi
        say "$(ktag): formatting storage in $KAFKA_DATA (cluster id $cluster_id${KAFKA_FORMAT_ARGS:+, $KAFKA_FORMAT_ARGS}${SCRAM_ARGS:+, SCRAM users broker and admin})"
        # shellcheck disable=SC2086  # KAFKA_FORMAT_ARGS is a list of words on purpose
        kafka_java kafka.tools.StorageTool format "${quorum[@]}" --cluster-id "$cluster_id" \
            --config "$KAFKA_PROPS" "${SCRAM_ARGS[@]}" $KAFKA_FORMAT_ARGS \
            >>"$KAFKA_LOGS/format.log" 2>&1 \
            || { show_tail "$KAFKA_LOGS/format.log"; die "$(ktag): formatting the storage failed"; }
    fi
}

kafka_start() {
    rm -f "$KAFKA_PIDFILE"
    : >"$KAFKA_LOGS/kafka.out"
    local jaas=()
    [[ $PROFILE == secure ]] && jaas=("-Djava.security.auth.login.config=$KAFKA_JAAS")
    # setsid: the broker outlives this script and is not hit by signals sent to make's
    # process group. The inner shell writes its own pid, which `exec` hands to java.
    setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$KAFKA_PIDFILE" \
        java "-Xmx$KAFKA_HEAP" "-Xms$KAFKA_HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -Djava.awt.headless=true "${jaas[@]}" \
        -Dlog4j2.configurationFile="$KAFKA_LOG4J" -Dkafka.logs.dir="$KAFKA_LOGS" \
        -cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_PROPS" \
        </dev/null >>"$KAFKA_LOGS/kafka.out" 2>&1 &
    for _ in $(seq 1 50); do
        [[ -s "$KAFKA_PIDFILE" ]] && break
        sleep 0.1
    done
    cat "$KAFKA_PIDFILE"
}

kafka_probe() { # wait [pid]: the probe of the current node (credentials, node id as needed)
    local pid=()
    [[ -n "${2:-}" ]] && pid=(--pid "$2")
    "$PYTHON" -m stack.probe kafka "$KAFKA_ADDR" --wait "$1" "${pid[@]}" "${PROBE_ARGS[@]}"
}

kafka_fail() { # message
    warn "error: $1"
    show_tail "$KAFKA_LOGS/kafka.out" 20
    show_tail "$KAFKA_LOGS/server.log" 40
    exit 1
}

kafka_wait_started() { # pid: wait until the node just started answers
    local pid="$1" desc rc=0
    desc="$(kafka_probe "$TIMEOUT" "$pid")" || rc=$?
    case $rc in
        0) say "$(ktag): ready on $KAFKA_ADDR ($desc)" ;;
        3) rm -f "$KAFKA_PIDFILE"; kafka_fail "$(ktag): the broker exited during startup" ;;
        *) kill -KILL "$pid" 2>/dev/null || true
           rm -f "$KAFKA_PIDFILE"
           kafka_fail "$(ktag): no answer on $KAFKA_ADDR within ${TIMEOUT}s; killed pid $pid" ;;
    esac
}

kafka_up() { # the default profile: also knows external and foreign brokers
    use_node 1
    if [[ "$CFG_KAFKA_LOCAL" != 1 ]]; then
        local desc
        desc="$("$PYTHON" -m stack.probe kafka "$CFG_KAFKA_BOOTSTRAP" --wait 15)" \
            || die "kafka: SESSIONSTREAM_KAFKA_BOOTSTRAP=$CFG_KAFKA_BOOTSTRAP does not answer (see above); not starting a local broker for an external address"
        say "kafka: external $CFG_KAFKA_BOOTSTRAP answers ($desc); not starting a local broker"
        return 0
    fi
    local pid desc
    if pid="$(kafka_pid)"; then
        desc="$(kafka_probe "$TIMEOUT" "$pid")" \
            || kafka_fail "kafka: our broker (pid $pid) runs but does not answer on 127.0.0.1:9092"
        say "kafka: already running (pid $pid, 127.0.0.1:9092, $desc) - nothing to do"
        return 0
    fi
    drop_stale_kafka_pidfile
    if listening 127.0.0.1 9092; then
        desc="$("$PYTHON" -m stack.probe kafka 127.0.0.1:9092 --wait 10)" \
            || die "kafka: 127.0.0.1:9092 is taken by a process that does not answer as Kafka: $(who_listens 9092)"
        say "kafka: 127.0.0.1:9092 already answers and was not started by sessionstream ($desc) - using it"
        return 0
    fi
    listening 127.0.0.1 9093 && die "kafka: the controller port 127.0.0.1:9093 is taken: $(who_listens 9093)"

    ensure_java_and_maven
    ensure_kafka_libs
    kafka_prepare
    drop_deleted_logs
    pid="$(kafka_start)"
    say "kafka: started Apache Kafka $(kafka_version) (pid $pid), waiting up to ${TIMEOUT}s for it to answer"
    kafka_wait_started "$pid"
}

drop_deleted_logs() { # partitions of deleted topics, before the node starts and loads them
    # `...-delete`: deleted while the node ran, waiting out file.delete.delay.ms when it
    # stopped. `...-stray`: deleted while the node was down; Kafka renames them and keeps
    # them for an operator to look at (KAFKA-15605). Each start loads both again (838
    # partitions took 146 s on a loaded machine). In this stack they are only a cost.
    local gone=()
    mapfile -t gone < <(find "$KAFKA_DATA" -mindepth 1 -maxdepth 1 -type d \( -name '*-stray' -o -name '*-delete' \))
    if [[ ${#gone[@]} -gt 0 ]]; then
        rm -rf -- "${gone[@]}"
        say "$(ktag): removed ${#gone[@]} partition directories of deleted topics"
    fi
}

STARTED=()
kafka_node_start() { # the current node of a profile, unless it runs; records what it started
    local pid port
    if pid="$(kafka_pid)"; then
        return 0
    fi
    drop_stale_kafka_pidfile
    for port in "$KAFKA_PORT" "$KAFKA_CTRL_PORT"; do
        listening 127.0.0.1 "$port" \
            && die "$(ktag): 127.0.0.1:$port is taken by a process this script did not start: $(who_listens "$port") (set SESSIONSTREAM_${PROFILE^^}_KAFKA_PORT / _CONTROLLER_PORT)"
    done
    ensure_java_and_maven
    ensure_kafka_libs
    kafka_prepare
    drop_deleted_logs
    pid="$(kafka_start)"
    say "$(ktag): started Apache Kafka $(kafka_version) (pid $pid, $KAFKA_ADDR), waiting up to ${TIMEOUT}s for it to answer"
    STARTED+=("$NODE:$pid")
}

kafka_profile_up() { # start the nodes that do not run (all before waiting: a quorum needs two)
    local n pid desc entry
    STARTED=()
    for ((n = 1; n <= NODES; n++)); do
        use_node "$n"
        kafka_node_start
    done
    for ((n = 1; n <= NODES; n++)); do
        use_node "$n"
        pid=""
        for entry in "${STARTED[@]}"; do [[ "${entry%%:*}" == "$n" ]] && pid="${entry#*:}"; done
        if [[ -n "$pid" ]]; then
            kafka_wait_started "$pid"
        else
            pid="$(kafka_pid)"
            desc="$(kafka_probe "$TIMEOUT" "$pid")" \
                || kafka_fail "$(ktag): our broker (pid $pid) runs but does not answer on $KAFKA_ADDR"
            say "$(ktag): already running (pid $pid, $KAFKA_ADDR, $desc) - nothing to do"
        fi
    done
    if [[ $NODES -gt 1 ]]; then
        desc="$("$PYTHON" -m stack.probe kafka "$BOOTSTRAP" --wait "$TIMEOUT" --brokers "$NODES")" \
            || die "kafka-$PROFILE: the nodes run but do not form a cluster of $NODES brokers (logs in $PROFILE_DIR/kafka-*/logs)"
        say "kafka-$PROFILE: $desc on $BOOTSTRAP"
    fi
}

kafka_node_down() { # stop the current node (SIGTERM, SIGKILL after `grace` seconds)
    local grace="${1:-60}" pid
    if pid="$(kafka_pid)"; then
        kill -TERM "$pid"
        for _ in $(seq 1 $((grace * 10))); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
            say "$(ktag): pid $pid did not stop within ${grace}s; killed it"
        fi
        rm -f "$KAFKA_PIDFILE"
        say "$(ktag): stopped (pid $pid)"
        return 0
    fi
    drop_stale_kafka_pidfile
    if [[ $PROFILE == default ]] && listening 127.0.0.1 9092; then
        say "kafka: 127.0.0.1:9092 was not started by sessionstream - left alone"
    else
        say "$(ktag): not running"
    fi
}

kafka_down() {
    local n pid
    if [[ $NODES == 1 ]]; then
        use_node 1
        kafka_node_down
        return 0
    fi
    # All nodes at once: stopped one by one, the last ones would wait for a quorum that the
    # first ones took with them.
    local stopping=()
    for ((n = 1; n <= NODES; n++)); do
        use_node "$n"
        if pid="$(kafka_pid)"; then
            kill -TERM "$pid"
            stopping+=("$n:$pid")
        else
            kafka_node_down # says "not running" (and drops a stale pid file)
        fi
    done
    local entry waited=0
    for entry in "${stopping[@]}"; do
        use_node "${entry%%:*}"
        pid="${entry#*:}"
        while kill -0 "$pid" 2>/dev/null && [[ $waited -lt 600 ]]; do
            sleep 0.1
            waited=$((waited + 1))
        done
        if kill -0 "$pid" 2>/dev/null; then
            kill -KILL "$pid" 2>/dev/null || true
            say "$(ktag): pid $pid did not stop within 60s; killed it"
        fi
        rm -f "$KAFKA_PIDFILE"
        say "$(ktag): stopped (pid $pid)"
    done
}

kafka_status() {
    local pid desc n
    use_node 1
    if [[ $PROFILE != default ]]; then
        for ((n = 1; n <= NODES; n++)); do
            use_node "$n"
            if pid="$(kafka_pid)"; then
                if desc="$(kafka_probe 0 2>&1)"; then
                    say "$(ktag): running (pid $pid, Apache Kafka $(kafka_version), $KAFKA_ADDR, $desc; state $KAFKA_DIR)"
                else
                    say "$(ktag): running (pid $pid) but not answering yet ($desc)"
                fi
            elif [[ -f "$KAFKA_PIDFILE" ]]; then
                say "$(ktag): not running (stale pid file $KAFKA_PIDFILE; 'up' removes it)"
            else
                say "$(ktag): not running"
            fi
        done
        [[ $PROFILE == secure && -d "$CRED_DIR" ]] && say "kafka-secure: credentials in $CRED_DIR/<role>.env"
        return 0
    fi
    if [[ "$CFG_KAFKA_LOCAL" != 1 ]]; then
        if desc="$("$PYTHON" -m stack.probe kafka "$CFG_KAFKA_BOOTSTRAP" 2>&1)"; then
            say "kafka: external $CFG_KAFKA_BOOTSTRAP answers ($desc)"
        else
            say "kafka: external $CFG_KAFKA_BOOTSTRAP does not answer ($desc)"
        fi
    elif pid="$(kafka_pid)"; then
        if desc="$("$PYTHON" -m stack.probe kafka 127.0.0.1:9092 2>&1)"; then
            say "kafka: running (pid $pid, Apache Kafka $(kafka_version), 127.0.0.1:9092, $desc; state $KAFKA_DIR)"
        else
            say "kafka: running (pid $pid) but not answering yet ($desc)"
        fi
    elif desc="$("$PYTHON" -m stack.probe kafka 127.0.0.1:9092 2>&1)"; then
        say "kafka: 127.0.0.1:9092 answers but was not started by sessionstream ($desc)"
    elif [[ -f "$KAFKA_PIDFILE" ]]; then
        say "kafka: not running (stale pid file $KAFKA_PIDFILE; 'up' removes it)"
    else
        say "kafka: not running"
    fi
}

kafka_kill_node() { # N: kill -9, as a crash would; the pid file stays (start-node drops it)
    use_node "$1"
    local pid
    pid="$(kafka_pid)" || die "$(ktag): not running"
    kill -KILL "$pid"
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    say "$(ktag): killed (pid $pid, SIGKILL)"
}

kafka_start_node() { # N: start one node of the profile and wait until it is back in the cluster
    use_node "$1"
    local pid desc
    if pid="$(kafka_pid)"; then
        desc="$(kafka_probe "$TIMEOUT" "$pid")" \
            || kafka_fail "$(ktag): our broker (pid $pid) runs but does not answer on $KAFKA_ADDR"
        say "$(ktag): already running (pid $pid, $KAFKA_ADDR, $desc) - nothing to do"
        return 0
    fi
    STARTED=()
    kafka_node_start
    kafka_wait_started "${STARTED[0]#*:}"
}

# ---------------------------------------------------------------------- PostgreSQL

as_pg() { # run a PostgreSQL binary as the user that owns our cluster
    if [[ $IS_ROOT == 1 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

PG_BIN=""
find_pg_bin() { # sets PG_BIN; prefers the major version the data directory was made with
    local want="" dir
    [[ -f "$PG_DATA/PG_VERSION" ]] && want="$(cat "$PG_DATA/PG_VERSION")"
    if [[ -n "$want" && -x "/usr/lib/postgresql/$want/bin/postgres" ]]; then
        PG_BIN="/usr/lib/postgresql/$want/bin"
        return 0
    fi
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -t/ -k5 -n -r); do
        if [[ -x "$dir/postgres" && -x "$dir/initdb" ]]; then
            PG_BIN="$dir"
            break
        fi
    done
    if [[ -z "$PG_BIN" ]] && command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        PG_BIN="$(dirname "$(command -v initdb)")"
    fi
    [[ -n "$PG_BIN" ]] || return 1
    if [[ -n "$want" && "$(cat "$PG_DATA/PG_VERSION")" != "$("$PG_BIN/postgres" -V | sed 's/[^0-9]*\([0-9]*\).*/\1/')" ]]; then
        die "postgres: $PG_DATA was made by PostgreSQL $want, which is not installed; install it or run 'stack/stack.sh reset'"
    fi
}

ensure_postgres_installed() {
    find_pg_bin && return 0
    have_apt_as_root || die "postgres: PostgreSQL server binaries (initdb, postgres) not found; install PostgreSQL (Debian: apt-get install postgresql)"
    apt_install postgresql
    find_pg_bin || die "postgres: installed the postgresql package but found no server binaries"
    # On machines where services start on install, Debian's own cluster would take port
    # 5432; it is not ours to use (other credentials), so stop the one we just caused.
    if command -v pg_lsclusters >/dev/null; then
        pg_lsclusters -h 2>/dev/null | while read -r ver name port status _; do
            if [[ "$port" == "$PG_PORT" && "$status" == online* ]]; then
                say "postgres: stopping Debian's cluster $ver/$name that the install started on port $PG_PORT"
                pg_ctlcluster "$ver" "$name" stop || true
            fi
        done
    fi
}

pg_running() { [[ -f "$PG_DATA/PG_VERSION" ]] && as_pg "$PG_BIN/pg_ctl" status -D "$PG_DATA" >/dev/null 2>&1; }

pg_pid() { head -n 1 "$PG_DATA/postmaster.pid" 2>/dev/null; }

drop_stale_postmaster_pid() {
    # After a kill -9 the lock file stays. PostgreSQL usually sees through it, but not when
    # the pid was reused by another user's process, so drop it once we know it is stale.
    [[ -f "$PG_DATA/postmaster.pid" ]] || return 0
    local pid
    pid="$(pg_pid)"
    if [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q postgres; then
        return 0
    fi
    say "postgres: removing stale postmaster.pid (pid ${pid:-?} is not running)"
    rm -f "$PG_DATA/postmaster.pid"
}

pg_init() {
    mkdir -p "$PG_DIR"
    if [[ $IS_ROOT == 1 ]]; then
        chown postgres:postgres "$PG_DIR"
        runuser -u postgres -- test -x "$PG_DIR" \
            || die "postgres: the postgres OS user cannot reach $PG_DIR (a parent directory is private); set SESSIONSTREAM_PG_DIR"
    fi
    chmod 700 "$PG_DIR"
    as_pg mkdir -p "$PG_SOCK"
    if [[ ! -f "$PG_DATA/PG_VERSION" ]]; then
        say "postgres: initdb $PG_DATA ($("$PG_BIN/postgres" -V))"
        # Local socket connections (our private socket dir) are trusted for the bootstrap
        # superuser; TCP always needs a password.
        as_pg "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth-local=trust \
            --auth-host=scram-sha-256 --encoding=UTF8 --no-locale >"$PG_DIR/initdb.log" 2>&1 \
            || { show_tail "$PG_DIR/initdb.log"; die "postgres: initdb failed"; }
        as_pg sh -c "printf '%s\n' \"include_if_exists = 'sessionstream.conf'\" >>'$PG_DATA/postgresql.conf'"
    fi
    # Rewritten on every start so edits here take effect without a reset.
    as_pg sh -c "cat >'$PG_DATA/sessionstream.conf'" <<EOF
# Written by stack/stack.sh on every start; edit the script, not this file.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_SOCK'
EOF
}

pg_bootstrap() { # role and database, idempotent
    as_pg "$PG_BIN/psql" -X -q -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres \
        -v ON_ERROR_STOP=1 >/dev/null <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_ROLE') THEN
    CREATE ROLE $PG_ROLE LOGIN CREATEDB PASSWORD '$PG_PASSWORD';
  END IF;
END \$\$;
SELECT 'CREATE DATABASE $PG_DB OWNER $PG_ROLE' WHERE NOT EXISTS
  (SELECT FROM pg_database WHERE datname = '$PG_DB')\gexec
SQL
}

pg_fail() {
    warn "error: $1"
    show_tail "$PG_LOG" 40
    exit 1
}

pg_up() {
    local desc
    if [[ "$CFG_PG_LOCAL" != 1 ]]; then
        desc="$("$PYTHON" -m stack.probe postgres "$CFG_DATABASE_URL" --wait 15)" \
            || die "postgres: SESSIONSTREAM_DATABASE_URL=$CFG_DATABASE_URL_SHOWN does not answer (see above); not starting a local cluster for an external address"
        say "postgres: external $CFG_DATABASE_URL_SHOWN answers ($desc); not starting a local cluster"
        return 0
    fi
    ensure_postgres_installed
    if pg_running; then
        desc="$("$PYTHON" -m stack.probe postgres "$CFG_DATABASE_URL" --wait "$TIMEOUT")" \
            || pg_fail "postgres: our cluster (pid $(pg_pid)) runs but $CFG_DATABASE_URL_SHOWN does not answer"
        say "postgres: already running (pid $(pg_pid), 127.0.0.1:$PG_PORT, $desc) - nothing to do"
        return 0
    fi
    if listening 127.0.0.1 "$PG_PORT"; then
        if desc="$("$PYTHON" -m stack.probe postgres "$CFG_DATABASE_URL" --wait 10)"; then
            say "postgres: 127.0.0.1:$PG_PORT already answers and was not started by sessionstream ($desc) - using it"
            return 0
        fi
        local hint=""
        command -v pg_lsclusters >/dev/null && hint=" Debian clusters: $(pg_lsclusters -h 2>/dev/null | tr '\n' ';')"
        die "postgres: 127.0.0.1:$PG_PORT is taken by a server that does not accept $CFG_DATABASE_URL_SHOWN: $(who_listens "$PG_PORT").$hint Stop it, create the role and database there, or set SESSIONSTREAM_DATABASE_URL."
    fi
    pg_init
    drop_stale_postmaster_pid
    say "postgres: starting $("$PG_BIN/postgres" -V) from $PG_DATA, waiting up to ${TIMEOUT}s"
    as_pg "$PG_BIN/pg_ctl" start -D "$PG_DATA" -l "$PG_LOG" -w -t "$TIMEOUT" -s \
        || pg_fail "postgres: the server did not start within ${TIMEOUT}s"
    pg_bootstrap || pg_fail "postgres: could not create role/database $PG_ROLE/$PG_DB"
    desc="$("$PYTHON" -m stack.probe postgres "$CFG_DATABASE_URL" --wait 15)" \
        || pg_fail "postgres: started, but $CFG_DATABASE_URL_SHOWN does not answer select 1"
    say "postgres: ready on 127.0.0.1:$PG_PORT (pid $(pg_pid), $desc; role/password/db $PG_ROLE/$PG_PASSWORD/$PG_DB)"
}

pg_down() {
    if ! find_pg_bin || [[ ! -f "$PG_DATA/PG_VERSION" ]]; then
        say "postgres: not running (no local cluster)"
        return 0
    fi
    if pg_running; then
        local pid
        pid="$(pg_pid)"
        as_pg "$PG_BIN/pg_ctl" stop -D "$PG_DATA" -m fast -w -t 60 -s \
            || die "postgres: pg_ctl stop failed"
        say "postgres: stopped (pid $pid)"
        return 0
    fi
    drop_stale_postmaster_pid
    if listening 127.0.0.1 "$PG_PORT"; then
        say "postgres: 127.0.0.1:$PG_PORT was not started by sessionstream - left alone"
    else
        say "postgres: not running"
    fi
}

pg_status() {
    local desc
    if [[ "$CFG_PG_LOCAL" != 1 ]]; then
        if desc="$("$PYTHON" -m stack.probe postgres "$CFG_DATABASE_URL" 2>&1)"; then
            say "postgres: external $CFG_DATABASE_URL_SHOWN answers ($desc)"
        else
            say "postgres: external $CFG_DATABASE_URL_SHOWN does not answer ($desc)"
        fi
    elif find_pg_bin && pg_running; then
        if desc="$("$PYTHON" -m stack.probe postgres "$CFG_DATABASE_URL" 2>&1)"; then
            say "postgres: running (pid $(pg_pid), 127.0.0.1:$PG_PORT, $desc; data $PG_DATA)"
        else
            say "postgres: running (pid $(pg_pid)) but not answering ($desc)"
        fi
    elif desc="$("$PYTHON" -m stack.probe postgres "$CFG_DATABASE_URL" 2>&1)"; then
        say "postgres: 127.0.0.1:$PG_PORT answers but was not started by sessionstream ($desc)"
    else
        say "postgres: not running"
    fi
}

# ------------------------------------------------------------------------- schema registry
# Apicurio Registry 3.0.9: the newest 3.x that runs on Java 17 (3.1+ needs Java 21). Maven
# Central serves its distribution, but not the parent POM (io.apicurio:apicurio-registry:
# 3.0.9), so `mvn dependency:copy` cannot resolve it: the archive is fetched as a file and
# checked against Central's SHA-1. Its schemas live in PostgreSQL (database
# sessionstream_registry), so a registry restart keeps every schema id the records carry.
REGISTRY_VERSION=3.0.9
REGISTRY_HOME="${SESSIONSTREAM_REGISTRY_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/sessionstream/apicurio-registry-$REGISTRY_VERSION}"
# the secured profile has a registry of its own: another port and database, HTTP basic
# authentication (one user, its password in the roles' credentials files); the cluster
# profile uses the default one
if [[ $PROFILE == secure ]]; then
    REGISTRY_PORT="${SESSIONSTREAM_SECURE_REGISTRY_PORT:-8181}"
    REGISTRY_DB=sessionstream_registry_secure
    REGISTRY_DIR="$PROFILE_DIR/registry"
    REGISTRY_AUTH=1
else
    REGISTRY_PORT=8081
    REGISTRY_DB=sessionstream_registry
    REGISTRY_DIR="$STATE_DIR/registry"
    REGISTRY_AUTH=0
fi
REGISTRY_URL="http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7"
REGISTRY_PIDFILE="$REGISTRY_DIR/registry.pid"
REGISTRY_LOG="$REGISTRY_DIR/registry.log"
REGISTRY_HEAP="${SESSIONSTREAM_REGISTRY_HEAP:-256m}"
MAVEN_CENTRAL="${SESSIONSTREAM_MAVEN_CENTRAL:-https://repo.maven.apache.org/maven2}"

ensure_registry_app() {
    [[ -f "$REGISTRY_HOME/apicurio-registry-app-$REGISTRY_VERSION-runner.jar" ]] && return 0
    local name="apicurio-registry-app-$REGISTRY_VERSION-all.tar.gz"
    local url="$MAVEN_CENTRAL/io/apicurio/apicurio-registry-app/$REGISTRY_VERSION/$name"
    local tmp="$REGISTRY_HOME.tmp.$$" want have
    say "registry: fetching Apicurio Registry $REGISTRY_VERSION from Maven Central into $REGISTRY_HOME"
    command -v curl >/dev/null || die "registry: curl is needed to fetch $url"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    curl -sSfL --retry 3 -o "$tmp/$name" "$url" || { rm -rf "$tmp"; die "registry: could not fetch $url"; }
    want="$(curl -sSfL --retry 3 "$url.sha1" | cut -c1-40)" || { rm -rf "$tmp"; die "registry: could not fetch $url.sha1"; }
    have="$(sha1sum "$tmp/$name" | cut -d' ' -f1)"
    [[ "$want" == "$have" ]] || { rm -rf "$tmp"; die "registry: $name has SHA-1 $have, Maven Central says $want"; }
    tar -xzf "$tmp/$name" -C "$tmp" || { rm -rf "$tmp"; die "registry: could not unpack $name"; }
    rm -f "$tmp/$name"
    rm -rf "$REGISTRY_HOME"
    mv "$tmp" "$REGISTRY_HOME"
}

pidfile_pid() { # pidfile cmdline-pattern -> the pid, if that process still runs it
    local pid
    [[ -f "$1" ]] || return 1
    pid="$(cat "$1")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && grep -q "$2" "/proc/$pid/cmdline" 2>/dev/null || return 1
    printf '%s\n' "$pid"
}

pidfile_stop() { # name pidfile cmdline-pattern signal [quiet]: stop it, SIGKILL after 30 s
    local pid i
    if ! pid="$(pidfile_pid "$2" "$3")"; then
        rm -f "$2"
        [[ "${5:-}" == quiet ]] || say "$1: not running"
        return 0
    fi
    kill "-$4" "$pid" 2>/dev/null || true
    for ((i = 0; i < 60; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    rm -f "$2"
    say "$1: stopped (pid $pid, SIG$4)"
}

registry_pid() { pidfile_pid "$REGISTRY_PIDFILE" apicurio-registry; }

registry_database() { # the registry's database in our cluster, idempotent
    as_pg "$PG_BIN/psql" -X -q -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres \
        -v ON_ERROR_STOP=1 >/dev/null <<SQL
SELECT 'CREATE DATABASE $REGISTRY_DB OWNER $PG_ROLE' WHERE NOT EXISTS
  (SELECT FROM pg_database WHERE datname = '$REGISTRY_DB')\gexec
SQL
}

registry_probe() { # wait [pid]: ask the profile's registry (with the credentials it needs)
    local args=(registry "$REGISTRY_URL" --wait "$1")
    [[ -n "${2:-}" ]] && args+=(--pid "$2")
    [[ $REGISTRY_AUTH == 1 ]] && args+=(--credentials "$CRED_DIR/admin.env")
    "$PYTHON" -m stack.probe "${args[@]}"
}

registry_fail() {
    warn "error: $1"
    show_tail "$REGISTRY_LOG" 40
    exit 1
}

registry_up() {
    local desc pid
    if [[ $PROFILE == default && "$CFG_REGISTRY_LOCAL" != 1 ]]; then
        desc="$("$PYTHON" -m stack.probe registry "$CFG_REGISTRY_URL" --wait 15)" \
            || die "registry: SESSIONSTREAM_SCHEMA_REGISTRY_URL=$CFG_REGISTRY_URL does not answer (see above); not starting a local registry for an external address"
        say "registry: external $CFG_REGISTRY_URL answers ($desc); not starting a local registry"
        return 0
    fi
    [[ "$CFG_PG_LOCAL" == 1 ]] || die "registry: the local registry keeps its schemas in the local PostgreSQL; with an external database set SESSIONSTREAM_SCHEMA_REGISTRY_URL to a registry of your own"
    if pid="$(registry_pid)"; then
        desc="$(registry_probe "$TIMEOUT" "$pid")" \
            || registry_fail "registry: ours (pid $pid) runs but $REGISTRY_URL does not answer"
        say "registry: already running (pid $pid, $desc) - nothing to do"
        return 0
    fi
    if listening 127.0.0.1 "$REGISTRY_PORT"; then
        if desc="$(registry_probe 5)"; then
            say "registry: 127.0.0.1:$REGISTRY_PORT already answers and was not started by sessionstream ($desc) - using it"
            return 0
        fi
        die "registry: 127.0.0.1:$REGISTRY_PORT is taken by something that is no schema registry: $(who_listens "$REGISTRY_PORT")"
    fi
    ensure_java_and_maven
    ensure_registry_app
    find_pg_bin || die "registry: no PostgreSQL binaries"
    registry_database || die "registry: could not create database $REGISTRY_DB"
    mkdir -p "$REGISTRY_DIR"
    if [[ $REGISTRY_AUTH == 1 ]]; then
        # config/application.properties in its working directory: the user it accepts
        "$PYTHON" -m stack.secure registry-config "$CRED_DIR" "$REGISTRY_DIR" \
            || die "registry: could not write the secured registry's configuration"
    fi
    say "registry: starting Apicurio Registry $REGISTRY_VERSION, waiting up to ${TIMEOUT}s"
    # a small pool (its default keeps 20 connections open) and quiet logs; the subjects
    # bound is Apicurio's, raised: every test world registers subjects of its own topics
    (cd "$REGISTRY_DIR" && exec nohup java "-Xmx$REGISTRY_HEAP" -XX:+UseSerialGC -Djava.awt.headless=true \
        -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$REGISTRY_PORT" \
        -Dapicurio.storage.sql.kind=postgresql \
        -Dapicurio.datasource.url="jdbc:postgresql://127.0.0.1:$PG_PORT/$REGISTRY_DB" \
        -Dapicurio.datasource.username="$PG_ROLE" -Dapicurio.datasource.password="$PG_PASSWORD" \
        -Dapicurio.datasource.jdbc.initial-size=1 -Dapicurio.datasource.jdbc.min-size=1 \
        -Dapicurio.datasource.jdbc.max-size=8 \
        -Dapicurio.ccompat.max-subjects=1000000 \
        -Dquarkus.http.access-log.enabled=false -Dquarkus.log.level=WARN \
        -Dquarkus.log.category.\"io.apicurio\".level=WARN \
        -jar "$REGISTRY_HOME/apicurio-registry-app-$REGISTRY_VERSION-runner.jar" \
        >"$REGISTRY_LOG" 2>&1 </dev/null) &
    pid=$!
    printf '%s\n' "$pid" >"$REGISTRY_PIDFILE"
    desc="$(registry_probe "$TIMEOUT" "$pid")" \
        || registry_fail "registry: started (pid $pid) but $REGISTRY_URL did not answer within ${TIMEOUT}s"
    local auth=""
    [[ $REGISTRY_AUTH == 1 ]] && auth=", basic authentication (the roles' credentials files)"
    say "registry: ready on $REGISTRY_URL (pid $pid, $desc; schemas in PostgreSQL database $REGISTRY_DB$auth)"
}

registry_down() { pidfile_stop registry "$REGISTRY_PIDFILE" apicurio-registry "${1:-TERM}"; }

registry_status() {
    local pid desc
    if [[ $PROFILE == default && "$CFG_REGISTRY_LOCAL" != 1 ]]; then
        if desc="$("$PYTHON" -m stack.probe registry "$CFG_REGISTRY_URL")"; then
            say "registry: external $CFG_REGISTRY_URL answers ($desc)"
        else
            say "registry: external $CFG_REGISTRY_URL does not answer"
        fi
        return 0
    fi
    if pid="$(registry_pid)"; then
        desc="$(registry_probe 0 2>&1)" || true
        say "registry: running (pid $pid, $REGISTRY_URL: $desc)"
    else
        say "registry: not running"
    fi
}

# ---------------------------------------------------------------- Kafka Connect (on demand)
# Apache Kafka's own Connect runtime (the broker's release) with two plugins from Maven
# Central: Apicurio's Avro converter and Debezium's JDBC sink (stack/connect/pom.xml,
# docs/analytics.md). Not part of `up`: `connect-up` (make connect) starts it next to the
# default profile's broker, registry and PostgreSQL; `down` and `status` know it.
CONNECT_LIBS="${SESSIONSTREAM_CONNECT_LIBS:-${XDG_CACHE_HOME:-$HOME/.cache}/sessionstream/connect-libs}"
CONNECT_DIR="$STATE_DIR/connect"
CONNECT_PORT=8083
CONNECT_PIDFILE="$CONNECT_DIR/connect.pid"
CONNECT_LOG="$CONNECT_DIR/connect.log"
CONNECT_HEAP="${SESSIONSTREAM_CONNECT_HEAP:-512m}"
# what the plugins bring that the runtime has: loaded from the runtime instead (two copies
# of Jackson make Hibernate's ServiceLoader fail with "not a subtype"); the JDBC drivers of
# the databases we do not write to
CONNECT_SHARED="kafka-clients,connect-api,connect-json,slf4j-api,lz4-java,snappy-java,zstd-jni,jackson-core,jackson-databind,jackson-annotations"
CONNECT_DRIVERS="mariadb-java-client,mssql-jdbc,mysql-connector-j,ojdbc11"

ensure_connect_libs() {
    local want have="" tmp profile out excl
    want="$(sha256sum "$STACK/connect/pom.xml" | cut -d' ' -f1)"
    [[ -f "$CONNECT_LIBS/.pom.sha256" ]] && have="$(cat "$CONNECT_LIBS/.pom.sha256")"
    [[ "$want" == "$have" ]] && return 0
    say "connect: resolving Kafka Connect and its plugins from Maven Central into $CONNECT_LIBS"
    tmp="$CONNECT_LIBS.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    for profile in runtime converter jdbc; do
        case $profile in
            runtime) out="$tmp/runtime"; excl="" ;;
            converter) out="$tmp/plugins/apicurio-converter"; excl="$CONNECT_SHARED" ;;
            jdbc) out="$tmp/plugins/debezium-jdbc"; excl="$CONNECT_SHARED,$CONNECT_DRIVERS" ;;
        esac
        if ! mvn -q -B -f "$STACK/connect/pom.xml" -P "$profile" dependency:copy-dependencies \
            -DincludeScope=runtime -DexcludeArtifactIds="$excl" -DoutputDirectory="$out" \
            >"$tmp/mvn.log" 2>&1; then
            show_tail "$tmp/mvn.log" 60
            rm -rf "$tmp"
            die "connect: mvn could not resolve the $profile jars (log above)"
        fi
    done
    rm -f "$tmp/mvn.log"
    printf '%s\n' "$want" >"$tmp/.pom.sha256"
    rm -rf "$CONNECT_LIBS"
    mv "$tmp" "$CONNECT_LIBS"
}

connect_pid() { pidfile_pid "$CONNECT_PIDFILE" ConnectDistributed; }

connect_probe() { # wait [pid]
    local args=(connect "http://127.0.0.1:$CONNECT_PORT" --wait "$1")
    [[ -n "${2:-}" ]] && args+=(--pid "$2")
    "$PYTHON" -m stack.probe "${args[@]}"
}

connect_up() {
    local pid desc
    [[ $PROFILE == default ]] || die "connect: runs next to the default profile only"
    [[ "$CFG_KAFKA_LOCAL" == 1 ]] || die "connect: the local worker serves the local broker; with SESSIONSTREAM_KAFKA_BOOTSTRAP=$CFG_KAFKA_BOOTSTRAP run a Connect cluster of your own and set SESSIONSTREAM_CONNECT_URL"
    if pid="$(connect_pid)"; then
        desc="$(connect_probe "$TIMEOUT" "$pid")" \
            || { warn "error: connect: ours (pid $pid) runs but does not answer"; show_tail "$CONNECT_LOG" 40; exit 1; }
        say "connect: already running (pid $pid, $desc) - nothing to do"
        return 0
    fi
    if listening 127.0.0.1 "$CONNECT_PORT"; then
        if desc="$(connect_probe 5)"; then
            say "connect: 127.0.0.1:$CONNECT_PORT already answers and was not started by sessionstream ($desc) - using it"
            return 0
        fi
        die "connect: 127.0.0.1:$CONNECT_PORT is taken by something that is no Kafka Connect: $(who_listens "$CONNECT_PORT")"
    fi
    ensure_java_and_maven
    ensure_connect_libs
    mkdir -p "$CONNECT_DIR"
    sed -e "s#@BOOTSTRAP@#$BOOTSTRAP#" -e "s#@PORT@#$CONNECT_PORT#" \
        -e "s#@PLUGINS@#$CONNECT_LIBS/plugins#" "$STACK/connect/worker.properties.in" \
        >"$CONNECT_DIR/worker.properties"
    say "connect: starting Kafka Connect (distributed, one worker), waiting up to ${TIMEOUT}s"
    (cd "$CONNECT_DIR" && exec nohup java "-Xmx$CONNECT_HEAP" -XX:+UseSerialGC -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$STACK/connect/log4j2.properties" \
        -Dconnect.logs.dir="$CONNECT_DIR" \
        -cp "$CONNECT_LIBS/runtime/*" org.apache.kafka.connect.cli.ConnectDistributed \
        "$CONNECT_DIR/worker.properties" >"$CONNECT_DIR/stdout.log" 2>&1 </dev/null) &
    pid=$!
    printf '%s\n' "$pid" >"$CONNECT_PIDFILE"
    desc="$(connect_probe "$TIMEOUT" "$pid")" \
        || { warn "error: connect: started (pid $pid) but did not answer within ${TIMEOUT}s"; show_tail "$CONNECT_LOG" 40; exit 1; }
    say "connect: ready on http://127.0.0.1:$CONNECT_PORT (pid $pid, $desc; log $CONNECT_LOG)"
}

connect_down() { # [signal] [quiet]
    pidfile_stop connect "$CONNECT_PIDFILE" ConnectDistributed "${1:-TERM}" "${2:-}"
}

connect_status() {
    local pid desc
    if pid="$(connect_pid)"; then
        desc="$(connect_probe 0 2>&1)" || true
        say "connect: running (pid $pid, http://127.0.0.1:$CONNECT_PORT: $desc)"
    else
        say "connect: not running (on demand: make connect)"
    fi
}

# ------------------------------------------------------ PostgreSQL of the secured profile

secure_pg_ours() { # the roles are made with our cluster's superuser: only there
    [[ "$CFG_PG_LOCAL" == 1 ]] && find_pg_bin && pg_running
}

secure_apply() { # users and ACLs in Kafka, roles, database and grants in PostgreSQL
    local pg=()
    if secure_pg_ours; then
        pg=(--pg-socket "$PG_SOCK" --pg-port "$PG_PORT" --database "$SECURE_DB")
    else
        say "postgres-secure: skipped - the roles and database $SECURE_DB are made in this script's own PostgreSQL cluster, and 127.0.0.1:$PG_PORT is not it"
    fi
    "$PYTHON" -m stack.secure apply "$CRED_DIR" "${pg[@]}" \
        || die "secure: creating users, ACLs, roles or grants failed (as admin: $CRED_DIR/admin.env)"
    say "secure: credentials of each role in $CRED_DIR/<role>.env (SESSIONSTREAM_CREDENTIALS_FILE)"
}

secure_pg_reset() {
    if secure_pg_ours; then
        "$PYTHON" -m stack.secure drop --pg-socket "$PG_SOCK" --pg-port "$PG_PORT" \
            --database "$SECURE_DB" || die "postgres-secure: could not drop $SECURE_DB and its roles"
    else
        say "postgres-secure: our PostgreSQL does not run; database $SECURE_DB and its roles left in place"
    fi
}

kv() { # NAME VALUE: one shell assignment, single-quoted
    printf "%s='%s'\n" "$1" "${2//\'/\'\\\'\'}"
}

where() { # the profile's addresses and directories, as shell assignments
    local n
    kv STACK_PROFILE "$PROFILE"
    kv STACK_STATE_DIR "$PROFILE_DIR"
    kv KAFKA_BOOTSTRAP "$BOOTSTRAP"
    kv KAFKA_NODES "$NODES"
    for ((n = 1; n <= NODES; n++)); do
        use_node "$n"
        kv "KAFKA_NODE_$n" "$KAFKA_ADDR"
        kv "KAFKA_NODE_${n}_DIR" "$KAFKA_DIR"
    done
    if [[ $PROFILE == secure ]]; then
        kv CREDENTIALS_DIR "$CRED_DIR"
        kv SECURE_DATABASE "$SECURE_DB"
    fi
}

# --------------------------------------------------------------------------- main

if [[ $PROFILE != default && "$(realpath -m "$PROFILE_DIR")" == "$(realpath -m "$STATE_DIR")" ]]; then
    die "the $PROFILE profile needs a state directory of its own, not $STATE_DIR"
fi
CFG_SECURE_DATABASE_URL="postgresql://127.0.0.1:$PG_PORT/${SECURE_DB:-}"
use_node 1

cmd="${1:-}"
case "$cmd" in
    up)
        load_config
        if [[ $PROFILE == default ]]; then
            kafka_up
            pg_up
        else
            kafka_profile_up
            pg_up
            if [[ $PROFILE == secure ]]; then secure_apply; fi
        fi
        registry_up
        ;;
    down)
        if [[ $PROFILE == default ]]; then connect_down TERM quiet; fi
        kafka_down
        # the profiles share the default stack's PostgreSQL (and the cluster its registry):
        # the default `down` stops them; the secured profile stops its own registry
        if [[ $PROFILE == default ]]; then
            load_config
            registry_down
            pg_down
        elif [[ $PROFILE == secure ]]; then
            registry_down
        fi
        ;;
    status)
        load_config
        kafka_status
        pg_status
        registry_status
        if [[ $PROFILE == default ]]; then connect_status; fi
        ;;
    connect-up)
        load_config
        connect_up
        ;;
    connect-down|kill-connect)
        if [[ $cmd == kill-connect ]]; then connect_down KILL; else connect_down; fi
        ;;
    kill-registry)
        load_config
        registry_down KILL
        ;;
    restart-postgres|restart-kafka|restart-registry)
        # for fault tests: stop and start one server of ours, waiting until it answers
        load_config
        if [[ $cmd == restart-postgres ]]; then
            pg_down; pg_up
        elif [[ $cmd == restart-registry ]]; then
            registry_down; registry_up
        else
            kafka_down
            if [[ $PROFILE == default ]]; then kafka_up; else kafka_profile_up; fi
            if [[ $PROFILE == secure ]]; then secure_apply; fi
        fi
        ;;
    kill-node|stop-node|start-node)
        # for fault tests: one Kafka node of the profile (N = 1..nodes)
        [[ -n "${2:-}" ]] || die "usage: $0 $cmd N"
        load_config
        case $cmd in
            kill-node) kafka_kill_node "$2" ;;
            stop-node) use_node "$2"; kafka_node_down ;;
            start-node) kafka_start_node "$2" ;;
        esac
        ;;
    where)
        where
        ;;
    reset)
        kafka_down
        if [[ $PROFILE == default ]]; then
            load_config
            connect_down TERM quiet
            registry_down
            pg_down
            say "removing $KAFKA_DIR, $REGISTRY_DIR and $PG_DIR (the jar caches $KAFKA_LIBS and $REGISTRY_HOME stay)"
            rm -rf "$KAFKA_DIR" "$REGISTRY_DIR" "$PG_DIR"
        else
            if [[ $PROFILE == secure ]]; then
                load_config
                registry_down
                secure_pg_reset
                if secure_pg_ours; then
                    as_pg "$PG_BIN/psql" -X -q -h "$PG_SOCK" -p "$PG_PORT" -U postgres -d postgres \
                        -c "DROP DATABASE IF EXISTS $REGISTRY_DB" >/dev/null \
                        || die "registry: could not drop $REGISTRY_DB"
                fi
            fi
            say "removing $PROFILE_DIR (the jar cache $KAFKA_LIBS stays)"
            rm -rf "$PROFILE_DIR"
        fi
        ;;
    *)
        die "usage: $0 up|down|status|reset|restart-postgres|restart-kafka|restart-registry|kill-registry|connect-up|connect-down|kill-connect|kill-node N|stop-node N|start-node N|where"
        ;;
esac
