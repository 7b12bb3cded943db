#!/usr/bin/env bash
# The modes of scripts/bench not yet ported to its Rust binary (shared/bench), which runs this
# file for them: compaction, hosts, partitions, links, links-follow and links-soak, each mode
# named an argument (`bench-legacy.sh compaction hosts ...`). `scripts/bench --help` describes
# the modes and the knobs (environment variables), which are read here as before.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../.."
# shellcheck source=scripts/lib/pg.sh
source scripts/lib/pg.sh

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-50}
CLICKS=${CLICKS:-2000000}
SUSTAIN=${SUSTAIN:-15000000}
COLLECTOR_FLAGS=${COLLECTOR_FLAGS:-}
LINK_COUNTS=${LINK_COUNTS:-1000000 10000000}
CHANGE_RATE=${CHANGE_RATE:-100}
SOAK=${SOAK:-600}
SOAK_RATE=${SOAK_RATE:-1000}
RATE=${RATE:-90000}
TOTALS_SECS=${TOTALS_SECS:-120}
CODES=250000
OUT=${OUT:-bench-out}
HTTP=127.0.0.1:18080
REDIRECTOR_ADMIN=127.0.0.1:19180
COLLECTOR_ADMIN=127.0.0.1:19181
BIN=target/release
CHARTS=benchmarks
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
SOCK=$OUT/collector.sock
PGDIR=$OUT/pg
CLK_TCK=$(getconf CLK_TCK)
PIDS=()
COLLECTOR_PID=""
MISMATCHES=0

log() { printf '%s bench: %s\n' "$(date +%T)" "$*" >&2; }

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do stop "$pid"; done
    if [[ -n ${PGBIN:-} ]]; then pg_stop 2>/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Ends the whole run from anywhere, a $(...) subshell included.
die() {
    log "error: $*"
    kill -TERM $$
    exit 1
}

# Polls CMD... every 0.05 s until it succeeds; dies after LIMIT seconds saying WHAT, with the
# tail of the log of whatever was awaited (AWAIT_LOG, by default the collector's).
await() { # await LIMIT WHAT CMD...
    local limit=$1 what=$2 deadline=$((SECONDS + $1)) log=${AWAIT_LOG:-$OUT/collector.log}
    shift 2
    until "$@"; do
        ((SECONDS < deadline)) || die "no $what within ${limit}s; tail of $log: $(tail -5 "$log")"
        sleep 0.05
    done
}

need() {
    command -v "$1" >/dev/null 2>&1 && return
    log "installing $2"
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null
}

metric() { # metric ADMIN_ADDR SERIES
    curl -fsS "http://$1/metrics" | awk -v s="$2" '$1 == s { print $2 }'
}

wait_healthy() { # wait_healthy ADMIN_ADDR NAME
    for _ in $(seq 300); do
        curl -fsS "http://$1/healthz" >/dev/null 2>&1 && return
        sleep 0.1
    done
    log "$2 did not become healthy; log tail:"; tail -20 "$OUT/$2.log" >&2; exit 1
}

exited() { ! kill -0 "$1" 2>/dev/null; } # exited PID

stop() { # stop PID: SIGTERM, up to 60 s for a graceful exit, then SIGKILL
    local deadline=$((SECONDS + 60))
    kill -TERM "$1" 2>/dev/null || true
    while kill -0 "$1" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
    kill -KILL "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    local keep=()
    for p in "${PIDS[@]}"; do [[ $p == "$1" ]] || keep+=("$p"); done
    PIDS=("${keep[@]}")
}

# The median of a column of numbers; a number in full (awk's default %.6g turned an average of
# two large ones into 1.21615e+06, which bc cannot read), a non-number ("-") as it is.
median() {
    sort -g | awk '{ v[NR] = $1 } END {
        m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        if (m == m + 0) printf "%.10g\n", m; else print m }'
}

# ITEMs in turn from the one at index BY (modulo their count), one a line: the order in which
# the modes or variants of a round run, so that none always runs first (a run pays for what
# the run before it left: a checkpoint, an autovacuum).
rotated() { # rotated BY ITEM...
    local by=$1 i
    shift
    for i in $(seq 0 $(($# - 1))); do
        local at=$(((i + by) % $# + 1))
        echo "${!at}"
    done
}

# --- the two variants: the current code, and BASELINE's ---------------------------------------

# Binaries and database of a variant: `current`, or `baseline` (BASELINE's, built into $OUT).
bin_of() { [[ $1 == baseline ]] && echo "$BASE_BIN" || echo "$BIN"; }
db_of() {
    case $1 in
        baseline) pg_url bench_base ;;
        flat) pg_url bench_flat ;;
        *) pg_url bench ;;
    esac
}

# Builds a revision's binaries once (cached by commit) from an exported tree of it; prints
# the directory they are in.
build_rev() { # build_rev REVISION
    local rev dir
    rev=$(git rev-parse --verify "$1^{commit}") || die "$1 is not a revision"
    dir=$OUT/rev-$rev
    if [[ ! -x $dir/bin/redirector || ! -x $dir/bin/collector || ! -x $dir/bin/clicktap ]]; then
        log "building the binaries of $rev"
        rm -rf "$dir" && mkdir -p "$dir/src" "$dir/bin"
        git archive "$rev" | tar -x -C "$dir/src"
        (cd "$dir/src" && CARGO_TARGET_DIR=$dir/target cargo build --release -q --bin collector \
            --bin redirector --bin clicktap >&2) || die "building $rev failed"
        cp "$dir/target/release/"{collector,redirector,clicktap} "$dir/bin/"
    fi
    echo "$dir/bin"
}

# A fresh database for a variant: migrated by its own collector, seeded with the links.
fresh_db() { # fresh_db VARIANT
    local name
    name=$(db_of "$1" | sed 's/.*dbname=//')
    psql_cluster -c "DROP DATABASE IF EXISTS $name" -c "CREATE DATABASE $name"
    "$(bin_of "$1")/collector" migrate --database-url "$(db_of "$1")" 2>>"$OUT/collector.log"
    # Vacuumed now: autovacuum would otherwise do it for the seeding (links and the change
    # log, ~0.3 s of CPU) in the middle of whichever run comes first.
    psql -X -q -v ON_ERROR_STOP=1 "$(db_of "$1")" \
        -c "INSERT INTO links (code, url) SELECT 'seed' || n, 'https://example.com/' || n
            FROM generate_series(0, $CODES - 1) AS n" \
        -c "VACUUM ANALYZE"
    [[ $1 != flat ]] && return 0
    # The current collector's schema with clicks one unpartitioned table, as before migration
    # 6: nothing to route, and no partition for the collector to make or find.
    psql -X -q -v ON_ERROR_STOP=1 "$(db_of flat)" -c "DROP TABLE clicks" \
        -c "CREATE TABLE clicks (code text NOT NULL, clicked_at timestamptz NOT NULL)" \
        -c "CREATE OR REPLACE FUNCTION ensure_click_partition(day date) RETURNS boolean
            LANGUAGE sql AS 'SELECT false'"
}

setup() {
    need curl curl
    need wrk wrk
    need bc bc
    if [[ -n ${CURRENT_REV:-} ]]; then
        BIN=$(build_rev "$CURRENT_REV")
    else
        log "building release binaries"
        cargo build --release --bin collector --bin redirector --bin clicktap -q
    fi
    [[ -n ${BASELINE:-} ]] && BASE_BIN=$(build_rev "$BASELINE")
    PGBIN=$(pg_bindir)
    pg_prepare "$OUT/postgres.log"
    pg_initialized || pg_initdb "$OUT/initdb.log"
    # Commit timestamps time the hosts runs (pg_xact_commit_timestamp); a cluster left running
    # by an interrupted run is restarted to have them.
    pg_running && [[ $(psql_cluster -At -c "SHOW track_commit_timestamp") != on ]] && pg_stop
    pg_running || PG_OPTIONS="-c track_commit_timestamp=on ${PG_OPTIONS:-}" pg_start "$OUT/postgres.log"
    # A cluster left running takes the current access rules (scripts/lib/pg.sh, pg_access).
    pg_reload_access
    fresh_db current
    [[ -n ${BASELINE:-} ]] && fresh_db baseline
    [[ -n ${FLAT:-} ]] && fresh_db flat
    return 0
}

psql_bench() { psql -X -q -v ON_ERROR_STOP=1 -At "$(db_of "${VARIANT:-current}")" "$@"; }
# Cluster-wide statements (databases, settings, checkpoints), on the postgres database.
psql_cluster() { psql -X -q "$(pg_url postgres)" "$@"; }

# Starts the variant's collector on $SOCK; its pid in COLLECTOR_PID.
start_collector_of() { # start_collector_of VARIANT
    local bin instance=""
    bin=$(bin_of "$1")
    [[ $("$bin/collector" --help) == *--instance* ]] && instance="--instance bench"
    # shellcheck disable=SC2086 # COLLECTOR_FLAGS and instance are lists of flags
    RUST_LOG=info,collector::maintenance=debug,collector::compact=debug \
        "$bin/collector" --database-url "$(db_of "$1")" --socket "$SOCK" \
        --admin-listen "$COLLECTOR_ADMIN" $instance $COLLECTOR_FLAGS >>"$OUT/collector.log" 2>&1 &
    COLLECTOR_PID=$!
    PIDS+=("$COLLECTOR_PID")
    wait_healthy "$COLLECTOR_ADMIN" collector
}

stop_collector() {
    [[ -n $COLLECTOR_PID ]] && stop "$COLLECTOR_PID"
    COLLECTOR_PID=""
}

# --- what each process costs: CPU from /proc/PID/stat, memory from /proc/PID/status ------------

# CPU ticks (utime + stime) of a live process; 0 if it is gone. The fields after the command
# name, which may hold spaces, counted from the state: utime is the 12th, stime the 13th.
ticks() { # ticks PID
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    sed 's/^.*) //' <<<"$stat" | awk '{ print $12 + $13 }'
}

ticks_sum() { # ticks_sum PID...: the CPU ticks of them all
    local pid total=0
    for pid in "$@"; do total=$((total + $(ticks "$pid"))); done
    echo "$total"
}

# CPU ticks of the whole PostgreSQL cluster: the postmaster, what its exited children used
# (cutime + cstime, collected when it reaps them), and every live child.
pg_ticks() {
    local pm own
    pm=$(head -1 "$PGDIR/data/postmaster.pid")
    own=$(sed 's/^.*) //' "/proc/$pm/stat" | awk '{ print $12 + $13 + $14 + $15 }')
    # shellcheck disable=SC2046 # one pid per word
    echo $((own + $(ticks_sum $(pgrep -P "$pm"))))
}

# The CPU counters of this run's processes, "redirector collector postgres" in ticks.
cpu_now() { # cpu_now REDIRECTOR_PID (or -)
    local r=0 c=0
    [[ $1 != - ]] && r=$(ticks "$1")
    [[ -n $COLLECTOR_PID ]] && c=$(ticks "$COLLECTOR_PID")
    echo "$r $c $(pg_ticks)"
}

# CPU microseconds per click of each process between two cpu_now readings.
cpu_per_click() { # cpu_per_click "BEFORE" "AFTER" CLICKS -> "redirector collector postgres"
    awk -v b="$1" -v a="$2" -v n="$3" -v hz="$CLK_TCK" 'BEGIN {
        split(b, x, " "); split(a, y, " ");
        for (i = 1; i <= 3; i++) printf "%.3f%s", n ? (y[i] - x[i]) * 1e6 / hz / n : 0, i < 3 ? " " : "\n" }'
}

hwm_mib() { # hwm_mib PID: peak resident memory in MiB (0 if gone)
    awk '$1 == "VmHWM:" { printf "%.1f\n", $2 / 1024; found = 1 } END { if (!found) print 0 }' \
        "/proc/$1/status" 2>/dev/null || echo 0
}

# PostgreSQL's memory: the proportional set size of all its processes, sampled every half
# second into $1 until this job is killed; its largest value is the run's peak.
sample_pg_memory() { # sample_pg_memory FILE
    local pm
    pm=$(head -1 "$PGDIR/data/postmaster.pid")
    while :; do
        # A backend that exits between pgrep and cat is only left out of this sample.
        { cat "/proc/$pm/smaps_rollup" $(pgrep -P "$pm" | sed 's|.*|/proc/&/smaps_rollup|') 2>/dev/null || true; } \
            | awk '$1 == "Pss:" { kib += $2 } END { printf "%.1f\n", kib / 1024 }' >>"$1"
        sleep 0.5
    done
}

peak() { sort -g "$1" | tail -1; }

# The commit-lag histogram's buckets: "le count" lines, +Inf as inf.
lag_buckets() { # lag_buckets ADMIN_ADDR
    curl -fsS "http://$1/metrics" | awk -F'[{}" ]+' '$1 == "collector_commit_lag_seconds_bucket" {
        print ($3 == "+Inf" ? "inf" : $3), $NF }'
}

# Quantile Q of the clicks committed between two lag_buckets readings, interpolated within
# its bucket as Prometheus' histogram_quantile does.
lag_quantile() { # lag_quantile "BEFORE" "AFTER" Q
    awk -v q="$3" 'NR == FNR { b[$1] = $2; next }
        { le[++n] = $1; c[n] = $2 - b[$1] }
        END { if (!n || c[n] <= 0) { print "-"; exit }
              rank = q * c[n]; lower = 0; below = 0
              for (i = 1; i <= n; i++) {
                  if (c[i] >= rank) {
                      if (le[i] == "inf") { print lower; exit }
                      printf "%.4f\n", lower + (le[i] - lower) * (rank - below) / (c[i] - below); exit }
                  lower = le[i]; below = c[i] } }' <(echo "$1") <(echo "$2")
}

stop_sampler() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

# --- redirector: off / pipeline / direct (and baseline) ------------------------------------------

# wrk scripts that pick a code per request: uniform over all codes, or Zipf-like (s = 1):
# floor((N+1)^u) - 1 for uniform u has P(k) ~ 1/(k+1.5), the continuous Zipf.
write_lua() {
    cat >"$OUT/codes-uniform.lua" <<LUA
math.randomseed(os.time())
request = function() return wrk.format("GET", "/seed" .. math.random(0, $CODES - 1)) end
LUA
    cat >"$OUT/codes-zipf.lua" <<LUA
math.randomseed(os.time())
request = function()
  return wrk.format("GET", "/seed" .. (math.floor(($CODES + 1) ^ math.random()) - 1))
end
LUA
}

# wrk's report on stdin -> "req/s p50_ms p99_ms".
wrk_stats() {
    awk 'function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
        /^ +50%/ { p50 = ms($2) } /^ +99%/ { p99 = ms($2) } /^Requests\/sec/ { rps = $2 }
        END { printf "%.0f %.3f %.3f\n", rps, p50, p99 }'
}

written_since() { # written_since BEFORE N: the collector has written N clicks since BEFORE
    (($(metric "$COLLECTOR_ADMIN" collector_clicks_written_total) - $1 >= $2))
}

# The collector has folded what it wrote: a compaction has run since COMPACTIONS, with no
# delta left.
folded_since() { # folded_since COMPACTIONS
    (($(metric "$COLLECTOR_ADMIN" collector_compactions_total) > $1)) \
        && [[ $(metric "$COLLECTOR_ADMIN" collector_deltas_pending) == 0 ]]
}

rows() { psql_bench -c "SELECT count(*) FROM clicks"; }

# Redirector flags beyond the common ones: an ack socket for a build that has them.
redirector_flags() { # redirector_flags BIN
    [[ $("$1/redirector" --help) == *--ack-socket* ]] && echo "--ack-socket $OUT/redirector-ack.sock"
    return 0
}

# One wrk run against mode MODE (off, pipeline, direct, or baseline: pipeline of BASELINE's
# binaries). The measured window runs from wrk's start until the collector has written and
# folded the run's clicks, so compaction is included. Appends to $OUT/redirect.tsv: "mix mode
# round rps p50_ms p99_ms redirects sent dropped compaction_s, then CPU us per redirect and
# peak MiB of redirector, collector, postgres".
wrk_once() { # wrk_once MIX MODE ROUND
    local mix=$1 mode=$2 round=$3 variant=current clicks=$2 bin pid report final rows0
    [[ $mode == baseline ]] && variant=baseline clicks=pipeline
    bin=$(bin_of "$variant")
    VARIANT=$variant
    rows0=$(rows)
    [[ $clicks == pipeline ]] && start_collector_of "$variant"
    # shellcheck disable=SC2046 # the flags are words
    "$bin/redirector" --clicks "$clicks" --database-url "$(db_of "$variant")" --socket "$SOCK" \
        --listen "$HTTP" --admin-listen "$REDIRECTOR_ADMIN" $(redirector_flags "$bin") \
        >"$OUT/redirector.log" 2>&1 &
    pid=$!; PIDS+=("$pid")
    wait_healthy "$REDIRECTOR_ADMIN" redirector
    local written0=0 compactions0=0 compact0=0 cpu0 sampler
    if [[ $clicks == pipeline ]]; then
        written0=$(metric "$COLLECTOR_ADMIN" collector_clicks_written_total)
        compactions0=$(metric "$COLLECTOR_ADMIN" collector_compactions_total)
        compact0=$(metric "$COLLECTOR_ADMIN" collector_compaction_seconds_sum)
    fi
    : >"$OUT/pg-memory.txt"
    sample_pg_memory "$OUT/pg-memory.txt" &
    sampler=$!
    cpu0=$(cpu_now "$pid")
    report=$(wrk -t2 -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$OUT/codes-$mix.lua" "http://$HTTP/")
    echo "$report" >"$OUT/wrk-$mix-$mode-$round.txt"
    local red_cpu red_mib col_mib=0 compact=0
    red_cpu=$(ticks "$pid")
    red_mib=$(hwm_mib "$pid")
    stop "$pid"
    final=$(grep -o "redirector: [0-9]* clicks sent, [0-9]* dropped ([0-9]* redirects" "$OUT/redirector.log" \
        | awk '{ gsub(/[(]/, ""); print $7, $2, $5 }')
    local redirects sent dropped
    read -r redirects sent dropped <<<"$final"
    if [[ $clicks == pipeline ]]; then
        await 300 "the run's clicks written" written_since "$written0" "$sent"
        await 300 "the run's deltas folded" folded_since "$compactions0"
        compact=$(echo "$(metric "$COLLECTOR_ADMIN" collector_compaction_seconds_sum) - $compact0" | bc -l)
        col_mib=$(hwm_mib "$COLLECTOR_PID")
    fi
    local cpu1 per
    cpu1=$(cpu_now -)
    cpu1="$red_cpu ${cpu1#* }"
    stop_sampler "$sampler"
    per=$(cpu_per_click "$cpu0" "$cpu1" "$redirects")
    stop_collector
    check_recorded "$mode" "$clicks" "$redirects" "$dropped" "$rows0"
    local rps p50 p99
    read -r rps p50 p99 <<<"$(wrk_stats <<<"$report")"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%s\t%s\t%s\n' "$mix" "$mode" "$round" \
        "$rps" "$p50" "$p99" "$redirects" "$sent" "$dropped" "$compact" "${per// /$'\t'}" \
        "$red_mib" "$col_mib" "$(peak "$OUT/pg-memory.txt")" >>"$OUT/redirect.tsv"
}

# Every redirect served is a row or a counted drop: rows the run added plus its drops must be
# its redirects (modes that record clicks). A mismatch is reported and fails the run at the end.
check_recorded() { # check_recorded MODE CLICKS REDIRECTS DROPPED ROWS_BEFORE
    [[ $2 == off ]] && return 0
    local recorded
    recorded=$(($(rows) - $5))
    if ((recorded + $4 != $3)); then
        log "MISMATCH in mode $1: $3 redirects served, $recorded clicks recorded, $4 dropped"
        MISMATCHES=$((MISMATCHES + 1))
    fi
}

col() { # col MIX MODE FIELD -> median of that column over the rounds
    awk -v x="$1" -v m="$2" -v f="$3" '$1 == x && $2 == m { print $f }' "$OUT/redirect.tsv" | median
}

redirect_modes() {
    local modes=(${MODES:-off pipeline direct})
    [[ -n ${BASELINE:-} && " ${modes[*]} " != *" baseline "* ]] && modes+=(baseline)
    echo "${modes[@]}"
}

bench_redirect() {
    write_lua
    : >"$OUT/redirect.tsv"
    local modes mix round mode
    read -r -a modes <<<"$(redirect_modes)"
    for round in $(seq "$ROUNDS"); do
        for mix in zipf uniform; do
            for mode in $(rotated "$round" "${modes[@]}"); do
                log "redirect round $round, $mix codes: $mode"
                wrk_once "$mix" "$mode" "$round"
            done
        done
    done
    echo "wrk -t2 -c$CONNECTIONS -d${DURATION}s, $CODES links, medians of $ROUNDS interleaved rounds."
    [[ -n ${BASELINE:-} ]] && echo "\`baseline\`: the pipeline of $BASELINE ($(git rev-parse --short "$BASELINE")), on a database of its own."
    echo
    echo "| codes | mode | req/s | vs off | p50 ms | p99 ms | dropped | compaction s | CPU us per redirect: redirector / collector / PostgreSQL | peak MiB: redirector / collector / PostgreSQL |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
    for mix in zipf uniform; do
        local base
        base=$(col "$mix" off 4)
        for mode in "${modes[@]}"; do
            local rps
            rps=$(col "$mix" "$mode" 4)
            printf '| %s | %s | %.0f | %.3f | %s | %s | %s | %s | %s / %s / %s | %s / %s / %s |\n' \
                "$mix" "$mode" "$rps" "$(echo "$rps / $base" | bc -l)" "$(col "$mix" "$mode" 5)" \
                "$(col "$mix" "$mode" 6)" "$(col "$mix" "$mode" 9)" "$(col "$mix" "$mode" 10)" \
                "$(col "$mix" "$mode" 11)" "$(col "$mix" "$mode" 12)" "$(col "$mix" "$mode" 13)" \
                "$(col "$mix" "$mode" 14)" "$(col "$mix" "$mode" 15)" "$(col "$mix" "$mode" 16)"
        done
    done
    echo
    echo "Every run: $OUT/redirect.tsv (mix, mode, round, req/s, p50 ms, p99 ms, redirects, sent, dropped,"
    echo "compaction s, CPU us per redirect of redirector, collector and PostgreSQL, peak MiB of each)."
    echo "CPU counts from wrk's start until the collector has written and folded the run's clicks."
}

# --- collector: ingest vs psql \copy ----------------------------------------------------------

make_inputs() { # codes files (one code per line) and CSV files for \copy, same rows
    log "generating $CLICKS rows per distribution"
    python3 - "$OUT" "$CLICKS" "$CODES" <<'PY'
import bisect, datetime, itertools, random, sys
out, n, codes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
# Today (UTC): a day the collector keeps a partition for, and inside its window.
today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
rng = random.Random(1)
cum = list(itertools.accumulate(1.0 / k for k in range(1, codes + 1)))  # Zipf, s = 1
dists = {
    "zipf": lambda: bisect.bisect_left(cum, rng.random() * cum[-1]),
    "uniform": lambda: rng.randrange(codes),
}
for name, draw in dists.items():
    with open(f"{out}/codes-{name}.txt", "w") as c, open(f"{out}/rows-{name}.csv", "w") as r:
        for i in range(n):
            code = f"seed{draw()}"
            c.write(code + "\n")
            r.write(f"{code},{today} 00:00:00.{i % 1000000:06d}+00\n")
PY
}

# Counts (code, day) waiting to be folded, in either shape of the schema (a row each, or
# arrays per batch since version 5).
pending_counts() {
    if [[ $(psql_bench -c "SELECT to_regclass('click_count_lists') IS NOT NULL") == t ]]; then
        psql_bench -c "SELECT (SELECT count(*) FROM click_count_deltas)
                            + (SELECT coalesce(sum(entries), 0) FROM click_count_batches)
                            + (SELECT coalesce(sum(entries), 0) FROM click_count_lists)"
    elif [[ $(psql_bench -c "SELECT to_regclass('click_count_batches') IS NOT NULL") == t ]]; then
        psql_bench -c "SELECT (SELECT count(*) FROM click_count_deltas)
                            + (SELECT coalesce(sum(entries), 0) FROM click_count_batches)"
    else
        psql_bench -c "SELECT count(*) FROM click_count_deltas"
    fi
}

reset_tables() {
    psql_bench -c "TRUNCATE clicks, click_count_deltas, click_counts"
    psql_bench -c "DO \$\$ BEGIN
                       IF to_regclass('click_count_batches') IS NOT NULL THEN
                           TRUNCATE click_count_batches; END IF;
                       IF to_regclass('clicks_set_aside') IS NOT NULL THEN
                           TRUNCATE clicks_set_aside; END IF;
                       IF to_regclass('click_count_lists') IS NOT NULL THEN
                           TRUNCATE click_count_lists; END IF; END \$\$"
}

# CLICKS clicks of DIST from clicktap into the variant's collector as fast as it takes them,
# timed until written; then until folded. Sets RESULT to (rate deltas catchup_s compaction_s
# collector_us postgres_us collector_mib postgres_mib). Runs in this shell, not a $(...)
# subshell, so that the collector it starts is one `cleanup` knows.
ingest_collector() { # ingest_collector DIST VARIANT
    local dist=$1 before t0 t1 deltas compact0 compactions0 cpu0 sampler
    VARIANT=$2
    start_collector_of "$2"
    before=$(metric "$COLLECTOR_ADMIN" collector_clicks_written_total)
    compact0=$(metric "$COLLECTOR_ADMIN" collector_compaction_seconds_sum)
    compactions0=$(metric "$COLLECTOR_ADMIN" collector_compactions_total)
    : >"$OUT/pg-memory.txt"
    sample_pg_memory "$OUT/pg-memory.txt" &
    sampler=$!
    cpu0=$(cpu_now -)
    t0=$(date +%s.%N)
    "$BIN/clicktap" send --socket "$SOCK" --code-file "$OUT/codes-$dist.txt" --count "$CLICKS" \
        --batch 1250 >/dev/null || die "clicktap send failed"
    await 300 "$CLICKS clicks written" written_since "$before" "$CLICKS"
    t1=$(date +%s.%N)
    deltas=$(pending_counts)
    local c0; c0=$(date +%s.%N)
    await 300 "the run's deltas folded" folded_since "$compactions0"
    local per catchup col_mib
    per=$(cpu_per_click "$cpu0" "$(cpu_now -)" "$CLICKS")
    catchup=$(echo "$(date +%s.%N) - $c0" | bc -l)
    col_mib=$(hwm_mib "$COLLECTOR_PID")
    stop_sampler "$sampler"
    read -r -a RESULT <<<"$(echo "$CLICKS / ($t1 - $t0)" | bc -l) $deltas $catchup \
        $(echo "$(metric "$COLLECTOR_ADMIN" collector_compaction_seconds_sum) - $compact0" | bc -l) \
        ${per#* } $col_mib $(peak "$OUT/pg-memory.txt")"
    stop_collector
}

ingest_copy() { # ingest_copy DIST: sets RESULT to (rate postgres_us postgres_mib)
    local t0 t1 cpu0 sampler
    VARIANT=current
    : >"$OUT/pg-memory.txt"
    sample_pg_memory "$OUT/pg-memory.txt" &
    sampler=$!
    cpu0=$(cpu_now -)
    t0=$(date +%s.%N)
    psql_bench -c "\\copy clicks (code, clicked_at) from '$OUT/rows-$1.csv' csv"
    t1=$(date +%s.%N)
    local per
    per=$(cpu_per_click "$cpu0" "$(cpu_now -)" "$CLICKS")
    stop_sampler "$sampler"
    read -r -a RESULT <<<"$(echo "$CLICKS / ($t1 - $t0)" | bc -l) ${per##* } $(peak "$OUT/pg-memory.txt")"
}

ccol() { # ccol KIND DIST FIELD -> median of that column of collector.tsv
    awk -v k="$1" -v d="$2" -v f="$3" '$1 == k && $2 == d { print $f }' "$OUT/collector.tsv" | median
}

bench_collector() {
    : >"$OUT/collector.tsv"
    local round dist variants=(current)
    [[ -n ${BASELINE:-} ]] && variants+=(baseline)
    [[ -n ${FLAT:-} ]] && variants+=(flat)
    local m=0 variant
    for round in $(seq "$ROUNDS"); do
        for dist in zipf uniform; do
            # Rotated between the two mixes of a round too (with an even number of rounds,
            # each variant goes first equally often in each mix).
            m=$((m + 1))
            for variant in $(rotated $((round + m)) "${variants[@]}"); do
                VARIANT=$variant reset_tables
                log "ingest round $round, $dist: collector ($variant)"
                ingest_collector "$dist" "$variant"
                printf '%s\t%s\t%s\t%.0f\t%s\t%.2f\t%.2f\t%s\t%s\t%s\t%s\n' "$variant" "$dist" "$round" \
                    "${RESULT[@]}" >>"$OUT/collector.tsv"
            done
            VARIANT=current reset_tables
            log "ingest round $round, $dist: psql \\copy"
            ingest_copy "$dist"
            printf 'copy\t%s\t%s\t%.0f\t-\t-\t-\t0\t%s\t0\t%s\n' "$dist" "$round" "${RESULT[@]}" \
                >>"$OUT/collector.tsv"
        done
    done
    echo "| codes | writer | rows/s | vs \\copy | delta rows per run | folding them took s | deltas empty after s | CPU us per click: collector / PostgreSQL | peak MiB: collector / PostgreSQL |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for dist in zipf uniform; do
        local p
        p=$(ccol copy "$dist" 4)
        for kind in "${variants[@]}" copy; do
            local name=$kind
            [[ $kind == current ]] && name=collector
            [[ $kind == baseline ]] && name="collector (baseline)"
            [[ $kind == flat ]] && name="collector, clicks unpartitioned"
            [[ $kind == copy ]] && name="psql \\copy"
            printf '| %s | %s | %.0f | %.2f | %s | %s | %s | %s / %s | %s / %s |\n' "$dist" "$name" \
                "$(ccol "$kind" "$dist" 4)" "$(echo "$(ccol "$kind" "$dist" 4) / $p" | bc -l)" \
                "$(ccol "$kind" "$dist" 5)" "$(ccol "$kind" "$dist" 7)" "$(ccol "$kind" "$dist" 6)" \
                "$(ccol "$kind" "$dist" 8)" "$(ccol "$kind" "$dist" 9)" "$(ccol "$kind" "$dist" 10)" \
                "$(ccol "$kind" "$dist" 11)"
        done
    done
    echo
    echo "Every run: $OUT/collector.tsv. $CLICKS rows per run over $CODES codes; medians of $ROUNDS."
    echo "'deltas empty after' counts from the end of the ingest, so it includes the wait for the next"
    echo "compaction; 'folding them took' is the compactions' own time. CPU counts until folded."
}

# --- compaction under sustained ingest ----------------------------------------------------------

# Sends SUSTAIN clicks as fast as the collector takes them while sampling the delta backlog
# each second; then reads the collector's "folded N delta rows in T" lines of that run.
sustain_once() { # sustain_once DIST: sets RESULT to (clicks/s max_backlog fold_rows_per_s longest_fold_s)
    local dist=$1 sender t0 t1 max=0 pending lines compactions0
    VARIANT=current
    start_collector_of current
    compactions0=$(metric "$COLLECTOR_ADMIN" collector_compactions_total)
    lines=$(wc -l <"$OUT/collector.log")
    t0=$(date +%s.%N)
    "$BIN/clicktap" send --socket "$SOCK" --code-file "$OUT/codes-$dist.txt" --count "$SUSTAIN" \
        --batch 1250 >/dev/null &
    sender=$!
    while kill -0 "$sender" 2>/dev/null; do
        pending=$(metric "$COLLECTOR_ADMIN" collector_deltas_pending)
        ((pending > max)) && max=$pending
        sleep 1
    done
    wait "$sender" || die "clicktap send failed"
    t1=$(date +%s.%N)
    await 600 "the backlog folded" folded_since "$compactions0"
    stop_collector
    read -r -a RESULT <<<"$(tail -n +"$((lines + 1))" "$OUT/collector.log" \
        | grep -o 'folded [0-9]* counts in [0-9.]*[mu]*s' \
        | awk -v rate="$(echo "$SUSTAIN / ($t1 - $t0)" | bc -l)" -v max="$max" '
            { t = $5; if (t ~ /ms$/) t /= 1000; else if (t ~ /us$/) t /= 1e6; else t += 0;
              rows += $2; secs += t; if (t > longest) longest = t }
            END { printf "%.0f %d %.0f %.2f\n", rate, max, secs ? rows / secs : 0, longest }')"
}

bench_compaction() {
    echo "| codes | ingest clicks/s | largest delta backlog (rows) | fold rate (delta rows/s) | longest compaction s |"
    echo "|---|---|---|---|---|"
    local dist
    for dist in zipf uniform; do
        reset_tables
        log "sustained ingest, $dist: $SUSTAIN clicks"
        sustain_once "$dist"
        printf '| %s | %s | %s | %s | %s |\n' "$dist" "${RESULT[@]}"
    done
    echo
    echo "$SUSTAIN clicks per run, as fast as the collector takes them. Compaction keeps up while the"
    echo "backlog stays bounded and returns to 0."
}

# --- totals: what keeping click_totals costs at a steady rate ---------------------------------

# RATE clicks/s of uniform codes for TOTALS_SECS through `clicktap send --rate` (stamped and
# paced as a redirector's drain sends them) into the variant's collector, which folds at its
# own default interval; CPU from the first click until the run's counts are folded. Sets RESULT to
# (collector_us postgres_us folds collector_mib).
totals_once() { # totals_once VARIANT
    local n=$((RATE * TOTALS_SECS)) before folds0 cpu0 per lag0 lag1
    VARIANT=$1 reset_tables
    VARIANT=$1
    start_collector_of "$1"
    before=$(metric "$COLLECTOR_ADMIN" collector_clicks_written_total)
    folds0=$(metric "$COLLECTOR_ADMIN" collector_compactions_total)
    cpu0=$(cpu_now -)
    lag0=$(lag_buckets "$COLLECTOR_ADMIN")
    "$BIN/clicktap" send --socket "$SOCK" --code-file "$OUT/codes-uniform.txt" --count "$n" \
        --rate "$RATE" --batch 1250 >/dev/null || die "clicktap send failed"
    await 120 "$n clicks written" written_since "$before" "$n"
    lag1=$(lag_buckets "$COLLECTOR_ADMIN")
    # Until every count of the run is folded: each variant then carries the whole cost of its
    # run's totals, however its folds fall in time.
    await 300 "the run's counts folded" folded_since "$folds0"
    per=$(cpu_per_click "$cpu0" "$(cpu_now -)" "$n")
    read -r -a RESULT <<<"${per#* } $(echo "$(metric "$COLLECTOR_ADMIN" collector_compactions_total) - $folds0" | bc) \
        $(hwm_mib "$COLLECTOR_PID") $(lag_quantile "$lag0" "$lag1" 0.5) $(lag_quantile "$lag0" "$lag1" 0.99)"
    stop_collector
}

bench_totals() {
    : >"$OUT/totals.tsv"
    local round variant variants=(current)
    [[ -n ${BASELINE:-} ]] && variants+=(baseline)
    for round in $(seq "$ROUNDS"); do
        for variant in "${variants[@]}"; do
            log "totals round $round: $variant, $RATE clicks/s for $TOTALS_SECS s"
            totals_once "$variant"
            printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$variant" "$round" "${RESULT[@]}" >>"$OUT/totals.tsv"
        done
    done
    echo "| collector | CPU us per click: collector | PostgreSQL | folds per run | collector peak MiB | commit lag p50 / p99 s |"
    echo "|---|---|---|---|---|---|"
    for variant in "${variants[@]}"; do
        awk -v v="$variant" '$1 == v' "$OUT/totals.tsv" | sort -k4 -g \
            | awk -v v="$variant" '{ c[NR] = $3; p[NR] = $4; f[NR] = $5; m[NR] = $6; l[NR] = $7 " / " $8 }
                END { i = int((NR + 1) / 2); printf "| %s | %.3f | %.3f | %s | %s | %s |\n", v, c[i], p[i], f[i], m[i], l[i] }'
    done
    echo
    echo "$RATE uniform clicks/s over $CODES codes for $TOTALS_SECS s per run, medians of $ROUNDS rounds"
    echo "(the run with the median PostgreSQL figure); every run in $OUT/totals.tsv."
}

# --- several collectors on one database ---------------------------------------------------------

# k collectors of VARIANT (instances bench1..k, each its own socket and admin port), each fed
# CLICKS/k clicks by its own clicktap sender at full speed, all at once. Appends to
# $OUT/hosts.tsv "variant mix k round aggregate_rows_per_s slowest_collector_rows_per_s
# fastest_collector_rows_per_s", then CPU microseconds per click of the collectors and of
# PostgreSQL (all k collectors summed; the senders are the load, not measured).
hosts_once() { # hosts_once VARIANT MIX K ROUND
    local variant=$1 mix=$2 k=$3 round=$4 i share=$(($CLICKS / $3)) pids=() senders=() t0 done_at=()
    local bin cpu0 pg0 cpu_collectors
    bin=$(bin_of "$variant")
    [[ $("$bin/collector" --help) == *--instance* ]] || die "hosts: $variant's collector has no --instance"
    for i in $(seq "$k"); do
        # shellcheck disable=SC2086 # COLLECTOR_FLAGS is a list of flags
        "$bin/collector" --database-url "$(db_of "$variant")" --socket "$OUT/host$i.sock" \
            --admin-listen "127.0.0.1:$((19200 + i))" --instance "bench$i" $COLLECTOR_FLAGS \
            >>"$OUT/host$i.log" 2>&1 &
        pids+=($!)
        PIDS+=($!)
        wait_healthy "127.0.0.1:$((19200 + i))" "host$i"
    done
    cpu0=$(ticks_sum "${pids[@]}")
    pg0=$(pg_ticks)
    t0=$(date +%s.%N)
    for i in $(seq "$k"); do
        "$bin/clicktap" send --socket "$OUT/host$i.sock" --code-file "$OUT/codes-$mix.txt" \
            --count "$share" --batch 1250 >/dev/null &
        senders+=($!)
    done
    # Nothing is asked of the collectors while the senders run: a metrics poll (curl and awk)
    # costs ~9 ms of CPU, and polling k collectors every 20 ms took 0.3 (k = 1) to 0.6 (k = 4)
    # of a core from the run. The times come from the commits below, not from polling.
    local sender
    for sender in "${senders[@]}"; do
        await 300 "the end of clicktap sender $sender" exited "$sender"
        wait "$sender" || die "clicktap send failed"
    done
    for i in $(seq "$k"); do
        COLLECTOR_ADMIN=127.0.0.1:$((19200 + i)) AWAIT_LOG=$OUT/host$i.log \
            await 60 "$share clicks written by host$i" written_since 0 "$share"
    done
    cpu_collectors=$(($(ticks_sum "${pids[@]}") - cpu0))
    local cpu_pg=$(($(pg_ticks) - pg0))
    for i in "${pids[@]}"; do stop "$i"; done
    # When each collector committed its last batch (the commit timestamp of its click_writers
    # row's last version), rather than when the polling saw it done.
    mapfile -t done_at < <(VARIANT=$variant psql_bench -c "SELECT extract(epoch FROM max(pg_xact_commit_timestamp(xmin)))
        FROM click_writers WHERE instance LIKE 'bench%' AND updated_at >= to_timestamp($t0)
        GROUP BY instance")
    ((${#done_at[@]} == k)) || die "hosts: ${#done_at[@]} of $k collectors recorded their last batch"
    printf '%s\n' "${done_at[@]}" | awk -v t0="$t0" -v share="$share" -v k="$k" -v x="$mix" -v r="$round" \
        -v v="$variant" -v hz="$CLK_TCK" -v cc="$cpu_collectors" -v cp="$cpu_pg" '
        { t = $1 - t0; if (t > last) last = t; rate = share / t;
          if (NR == 1 || rate < slow) slow = rate; if (rate > fast) fast = rate }
        END { us = 1e6 / hz / (share * k);
              printf "%s\t%s\t%s\t%s\t%.0f\t%.0f\t%.0f\t%.3f\t%.3f\n", v, x, k, r, share * k / last,
                  slow, fast, cc * us, cp * us }' \
        >>"$OUT/hosts.tsv"
}

hosts_col() { # hosts_col VARIANT MIX K FIELD -> median over the rounds
    awk -v v="$1" -v x="$2" -v k="$3" -v f="$4" '$1 == v && $2 == x && $3 == k { print $f }' \
        "$OUT/hosts.tsv" | median
}

bench_hosts() {
    : >"$OUT/hosts.tsv"
    local counts=(1 2 4) mix round k variant variants=(current)
    [[ -n ${BASELINE:-} ]] && variants+=(baseline)
    # A run writes up to ~0.55 GB of WAL, as much as the default max_wal_size (1 GB) lets
    # pass before PostgreSQL checkpoints on its own: a checkpoint then fell inside every
    # one-collector run on uniform codes and no other. With room for a run's WAL, the
    # CHECKPOINT before each run is the only one, and every run starts on a clean one.
    psql_cluster -c "ALTER SYSTEM SET max_wal_size = '4GB'" -c "SELECT pg_reload_conf()"
    for round in $(seq "$ROUNDS"); do
        for mix in zipf uniform; do
            for k in $(rotated "$round" "${counts[@]}"); do
                # The variants take turns going first, round by round, in every cell alike.
                for variant in $(rotated $((round - 1)) "${variants[@]}"); do
                    VARIANT=$variant reset_tables
                    psql_cluster -c CHECKPOINT
                    log "hosts round $round, $mix codes: $k collectors of $variant"
                    hosts_once "$variant" "$mix" "$k" "$round"
                done
            done
        done
    done
    psql_cluster -c "ALTER SYSTEM RESET max_wal_size" -c "SELECT pg_reload_conf()"
    echo "| variant | codes | collectors | aggregate rows/s | vs 1 collector | slowest collector rows/s | fastest collector rows/s | CPU us per click: collectors | PostgreSQL |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for variant in "${variants[@]}"; do
        for mix in zipf uniform; do
            local base
            base=$(hosts_col "$variant" "$mix" 1 5)
            for k in "${counts[@]}"; do
                local agg
                agg=$(hosts_col "$variant" "$mix" "$k" 5)
                printf '| %s | %s | %s | %.0f | %.2f | %.0f | %.0f | %.3f | %.3f |\n' "$variant" "$mix" "$k" \
                    "$agg" "$(echo "$agg / $base" | bc -l)" "$(hosts_col "$variant" "$mix" "$k" 6)" \
                    "$(hosts_col "$variant" "$mix" "$k" 7)" "$(hosts_col "$variant" "$mix" "$k" 8)" \
                    "$(hosts_col "$variant" "$mix" "$k" 9)"
            done
        done
    done
    echo
    echo "$CLICKS clicks per run split evenly over the collectors, each fed by its own clicktap sender;"
    echo "aggregate = all clicks / time until the last collector wrote its share; a collector's"
    echo "rate = its share / the time it took. Medians of $ROUNDS interleaved rounds; every run: $OUT/hosts.tsv"
    echo "(variant, codes, collectors, round, aggregate, slowest, fastest, CPU us per click of the collectors, of PostgreSQL)."
}

logged_since() { # logged_since LINES TEXT: the collector logged TEXT after its first LINES lines
    tail -n +"$(($1 + 1))" "$OUT/collector.log" | grep "$2" >/dev/null
}

# --- partitions: bytes per click, and the time to drop a day ---------------------------------------

# A day CLICKS clicks long, 20 days ago, loaded straight into its partition; its size on disk per
# click (heap, and the code index the collector builds once a day is over); then a collector
# with --retention 10 drops it, and its log says how long detaching and dropping took.
bench_partitions() {
    VARIANT=current
    local day rows bytes indexed took
    day=$(psql_bench -c "SELECT to_char(current_date - 20, 'YYYYMMDD')")
    psql_bench -c "SELECT ensure_click_partition(current_date - 20)" >/dev/null
    awk -F, -v d="$(psql_bench -c "SELECT (current_date - 20)::text")" \
        '{ sub(/^[^ ]* /, d " ", $2); print $1 "," $2 }' "$OUT/rows-uniform.csv" >"$OUT/rows-old.csv"
    psql_bench -c "\\copy clicks (code, clicked_at) from '$OUT/rows-old.csv' csv"
    rows=$(psql_bench -c "SELECT count(*) FROM clicks_p$day")
    bytes=$(psql_bench -c "SELECT pg_table_size('clicks_p$day')")
    psql_bench -c "CREATE INDEX clicks_p${day}_code ON clicks_p$day (code, clicked_at)"
    indexed=$(psql_bench -c "SELECT pg_total_relation_size('clicks_p$day')")
    local lines
    lines=$(wc -l <"$OUT/collector.log")
    COLLECTOR_FLAGS="$COLLECTOR_FLAGS --retention 10" start_collector_of current
    await 300 "the old day dropped" logged_since "$lines" "dropped partition clicks_p$day"
    took=$(tail -n +"$((lines + 1))" "$OUT/collector.log" | grep -o "dropped partition clicks_p$day in [0-9.]*[mu]*s" \
        | awk '{ print $NF }')
    stop_collector
    echo "| rows in the day | heap bytes per click | with the code index | dropping the day took |"
    echo "|---|---|---|---|"
    printf '| %s | %.1f | %.1f | %s |\n' "$rows" "$(echo "$bytes / $rows" | bc -l)" \
        "$(echo "$indexed / $rows" | bc -l)" "$took"
    echo
    echo "One day of $rows uniform clicks loaded with \\copy into its partition; the index is the"
    echo "(code, clicked_at) one the collector builds on each partition once its day is over."
}

# --- charts ---------------------------------------------------------------------------------------

# The SVG charts in benchmarks/, drawn by scripts/bench-charts.py from the runs' TSV files.
bench_charts() {
    python3 -c 'import matplotlib' 2>/dev/null || {
        log "installing matplotlib (PyPI)"
        python3 -m pip install -q matplotlib || die "pip install matplotlib failed"
    }
    mkdir -p "$CHARTS"
    python3 scripts/bench-charts.py "$OUT" "$CHARTS" || die "drawing the charts failed"
    log "charts in $CHARTS/"
}

# --- link table: 1 M and 10 M links, no changes vs CHANGE_RATE changes a second -----------------

# Links l0 ... l(N-1) to 45-byte URLs, loaded with one statement (the change log's triggers
# on, as in production), then the log pruned so that the run starts from an empty log. Also
# links_control, the same rows without triggers or redirectors: the control mode changes it
# instead, to show what the changes themselves cost PostgreSQL and the cores. A checkpoint
# last, so that writing the load out does not land in a timed run.
load_links() { # load_links N
    local t0
    t0=$(date +%s.%N)
    psql_bench -c "TRUNCATE links" \
        -c "INSERT INTO links (code, url)
            SELECT 'l' || n, 'https://example.com/articles/2026/' || lpad(n::text, 11, '0')
            FROM generate_series(0, $1 - 1) AS n" \
        -c "SELECT prune_link_changes('0 s')" >/dev/null
    log "loaded $1 links in $(echo "$(date +%s.%N) - $t0" | bc -l | cut -c1-6) s"
    psql_bench -c "DROP TABLE IF EXISTS links_control" \
        -c "CREATE TABLE links_control AS SELECT code, url FROM links" \
        -c "ALTER TABLE links_control ADD PRIMARY KEY (code)"
    psql_bench -c "VACUUM ANALYZE links, link_changes, links_control" -c "CHECKPOINT"
}

# A wrk script over random codes, and a pgbench script of random updates, deletes and inserts.
write_links_scripts() { # write_links_scripts N
    cat >"$OUT/codes-links.lua" <<LUA
math.randomseed(os.time())
request = function() return wrk.format("GET", "/l" .. math.random(0, $1 - 1)) end
LUA
    cat >"$OUT/link-changes.sql" <<'SQL'
\set n random(0, :links - 1)
\set op random(0, 2)
\if :op = 0
UPDATE links SET url = 'https://example.com/updated/2026/' || lpad(:n::text, 11, '0') WHERE code = 'l' || :n;
\elif :op = 1
DELETE FROM links WHERE code = 'l' || :n;
\else
INSERT INTO links (code, url) VALUES ('l' || :n, 'https://example.com/articles/2026/' || lpad(:n::text, 11, '0'))
ON CONFLICT (code) DO UPDATE SET url = EXCLUDED.url;
\endif
SQL
    sed -E 's/(UPDATE|FROM|INTO) links /\1 links_control /' "$OUT/link-changes.sql" >"$OUT/link-changes-control.sql"
}

# pgbench: on PATH, beside initdb, or in the newest /usr/lib/postgresql/*/bin.
pgbench_bin() {
    local dir
    for dir in "$(dirname "$(command -v pgbench 2>/dev/null || echo /nonexistent/x)")" "$PGBIN" \
        $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r); do
        [[ -x $dir/pgbench ]] && { echo "$dir/pgbench"; return; }
    done
    die "pgbench not found (Debian: apt-get install postgresql)"
}

status_kib() { awk -v k="$2:" '$1 == k { print $2 }' "/proc/$1/status"; } # status_kib PID VmRSS|VmHWM

healthy() { curl -fsS "http://$REDIRECTOR_ADMIN/healthz" >/dev/null 2>&1; }

# Starts the redirector (no click recording: only the link table is measured) and waits for
# /healthz; sets LINKS_PID and READY_S (seconds from start to ready).
links_start() {
    local t0
    t0=$(date +%s.%N)
    "$BIN/redirector" --clicks off --database-url "$(db_of current)" --socket "$SOCK" \
        --listen "$HTTP" --admin-listen "$REDIRECTOR_ADMIN" >"$OUT/redirector-links.log" 2>&1 &
    LINKS_PID=$!
    PIDS+=("$LINKS_PID")
    AWAIT_LOG=$OUT/redirector-links.log await 300 "a ready redirector" healthy
    READY_S=$(echo "$(date +%s.%N) - $t0" | bc -l)
}

# One wrk run over random codes, with CHANGE_RATE changes a second meanwhile to links
# (MODE changes) or to links_control (MODE control), or none; appends "links mode round rps
# p50 p99 rss_kib changes_per_s lag_s redirector_ticks postgres_ticks" to links.tsv, the CPU
# over the wrk run alone, as in the run without changes.
links_once() { # links_once N MODE ROUND
    local changer="" report rps p50 p99 rate=0 script=$OUT/link-changes.sql before after
    [[ $2 == control ]] && script=$OUT/link-changes-control.sql
    if [[ $2 != none ]]; then
        "$(pgbench_bin)" -n -R "$CHANGE_RATE" -T "$((DURATION + 1))" -c 1 -f "$script" \
            -D links="$1" "$(db_of current)" >"$OUT/pgbench-$1-$3.log" 2>&1 &
        changer=$!
        sleep 0.5 # the changes are under way before the load starts
    fi
    before=$(cpu_now "$LINKS_PID")
    report=$(wrk -t2 -c"$CONNECTIONS" -d"${DURATION}s" --latency -s "$OUT/codes-links.lua" "http://$HTTP/")
    after=$(cpu_now "$LINKS_PID")
    echo "$report" >"$OUT/wrk-links-$1-$2-$3.txt"
    if [[ -n $changer ]]; then
        wait "$changer" || die "pgbench failed: $(tail -3 "$OUT/pgbench-$1-$3.log")"
        rate=$(awk '/^tps = / { print $3 }' "$OUT/pgbench-$1-$3.log")
    fi
    read -r rps p50 p99 <<<"$(wrk_stats <<<"$report")"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.1f\t%s\t%s\n' "$1" "$2" "$3" "$rps" "$p50" "$p99" \
        "$(status_kib "$LINKS_PID" VmRSS)" "$rate" \
        "$(metric "$REDIRECTOR_ADMIN" redirector_links_lag_seconds)" \
        "$(awk -v b="$before" -v a="$after" 'BEGIN { split(b, x); split(a, y); print y[1] - x[1] "\t" y[3] - x[3] }')" \
        >>"$OUT/links.tsv"
}

links_col() { # links_col N MODE FIELD -> median over the rounds
    awk -v n="$1" -v m="$2" -v f="$3" '$1 == n && $2 == m { print $f }' "$OUT/links.tsv" | median
}

# The redirector's CPU microseconds per request and PostgreSQL's CPU seconds per run, medians.
links_cpu() { # links_cpu N MODE -> "us_per_request postgres_s"
    echo "$(awk -v n="$1" -v m="$2" -v hz="$CLK_TCK" -v d="$DURATION" '$1 == n && $2 == m {
        print $10 * 1e6 / hz / ($4 * d) }' "$OUT/links.tsv" | median)" \
        "$(awk -v n="$1" -v m="$2" -v hz="$CLK_TCK" '$1 == n && $2 == m { print $11 / hz }' "$OUT/links.tsv" | median)"
}

bench_links() {
    : >"$OUT/links.tsv"
    : >"$OUT/links-ready.tsv"
    local n round mode modes=(none changes control)
    for n in $LINK_COUNTS; do
        load_links "$n"
        write_links_scripts "$n"
        links_start
        printf '%s\t%.2f\t%s\t%s\n' "$n" "$READY_S" "$(status_kib "$LINKS_PID" VmRSS)" \
            "$(status_kib "$LINKS_PID" VmHWM)" >>"$OUT/links-ready.tsv"
        log "$n links: ready in $READY_S s"
        for round in $(seq "$ROUNDS"); do
            for mode in $(rotated "$round" "${modes[@]}"); do
                log "links round $round, $n links: $mode"
                links_once "$n" "$mode" "$round"
            done
        done
        stop "$LINKS_PID"
    done
    echo "wrk -t2 -c$CONNECTIONS -d${DURATION}s over random codes, redirector --clicks off; with $CHANGE_RATE"
    echo "changes a second (pgbench -R: random UPDATE, DELETE or INSERT) to links, or the same to"
    echo "links_control (a copy no redirector follows: what the changes cost by themselves), or none;"
    echo "medians of $ROUNDS interleaved rounds."
    echo
    echo "| links | ready s | RSS after ready MiB | bytes/link | peak RSS (VmHWM) MiB | changes | req/s | vs none | p99 ms | vs none | RSS after the runs MiB | lag s | redirector CPU us/request | PostgreSQL CPU s/run |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    for n in $LINK_COUNTS; do
        local ready rss hwm base99 base
        read -r _ ready rss hwm <<<"$(awk -v n="$n" '$1 == n' "$OUT/links-ready.tsv")"
        base=$(links_col "$n" none 4)
        base99=$(links_col "$n" none 6)
        for mode in none changes control; do
            local rps p99 cpu
            rps=$(links_col "$n" "$mode" 4)
            p99=$(links_col "$n" "$mode" 6)
            read -r -a cpu <<<"$(links_cpu "$n" "$mode")"
            printf '| %s | %s | %.0f | %.0f | %.0f | %s | %.0f | %.3f | %s | %.2f | %.0f | %s | %.2f | %.2f |\n' "$n" "$ready" \
                "$(echo "$rss / 1024" | bc -l)" "$(echo "$rss * 1024 / $n" | bc -l)" "$(echo "$hwm / 1024" | bc -l)" \
                "$([[ $mode == none ]] && echo 0 || links_col "$n" "$mode" 8)/s" "$rps" "$(echo "$rps / $base" | bc -l)" \
                "$p99" "$(echo "$p99 / $base99" | bc -l)" "$(echo "$(awk -v n="$n" -v m="$mode" '$1 == n && $2 == m { r = $7 } END { print r }' "$OUT/links.tsv") / 1024" | bc -l)" \
                "$(links_col "$n" "$mode" 9)" "${cpu[0]}" "${cpu[1]}"
        done
    done
    echo
    echo "Every run: $OUT/links.tsv (links, mode, round, req/s, p50 ms, p99 ms, RSS KiB after the run, changes/s, lag s,"
    echo "redirector and PostgreSQL CPU ticks over the run);"
    echo "ready times and RSS: $OUT/links-ready.tsv. 'RSS after the runs' is the last run's."
}

# --- what following the change log costs, without requests ----------------------------------------

# Context switches of a process, its threads summed; 0 if it is gone (a backend can exit
# between pgrep and the read).
switches() { # switches PID
    { cat /proc/"$1"/task/*/status 2>/dev/null || true; } | awk '/ctxt_switches:/ { n += $2 } END { print n + 0 }'
}

# CPU ticks and context switches of the redirector PID and of the cluster's live processes:
# "redirector_ticks redirector_switches postgres_ticks postgres_switches".
follow_now() { # follow_now PID
    local pm pid cs=0
    pm=$(head -1 "$PGDIR/data/postmaster.pid")
    for pid in $pm $(pgrep -P "$pm"); do cs=$((cs + $(switches "$pid"))); done
    echo "$(ticks "$1") $(switches "$1") $(pg_ticks) $cs"
}

# At the last of LINK_COUNTS, no HTTP load: DURATION seconds of CHANGE_RATE changes a second to
# links (MODE changes) or to links_control (MODE control), for the current redirector and,
# with BASELINE, the baseline's on the same database, interleaved; what the redirector and
# PostgreSQL spend on following is the changes' cost minus the control's.
bench_links_follow() {
    local n=${LINK_COUNTS##* } round variant mode changer before variants=(current)
    [[ -n ${BASELINE:-} ]] && variants=(baseline current)
    load_links "$n"
    write_links_scripts "$n"
    : >"$OUT/links-follow.tsv"
    for round in $(seq "$ROUNDS"); do
        for variant in $(rotated "$round" "${variants[@]}"); do
            BIN=$(bin_of "$variant") links_start
            for mode in $(rotated "$round" control changes); do
                log "follow round $round, $variant: $mode"
                "$(pgbench_bin)" -n -R "$CHANGE_RATE" -T "$((DURATION + 2))" -c 1 \
                    -f "$OUT/link-changes$([[ $mode == control ]] && echo -control).sql" \
                    -D links="$n" "$(db_of current)" >"$OUT/pgbench-follow.log" 2>&1 &
                changer=$!
                sleep 1 # pgbench's session is up
                before=$(follow_now "$LINKS_PID")
                sleep "$DURATION"
                printf '%s\t%s\t%s\t%s\n' "$variant" "$mode" "$round" "$(awk -v b="$before" \
                    -v a="$(follow_now "$LINKS_PID")" 'BEGIN { split(b, x); split(a, y)
                    printf "%d\t%d\t%d\t%d", y[1] - x[1], y[2] - x[2], y[3] - x[3], y[4] - x[4] }')" \
                    >>"$OUT/links-follow.tsv"
                wait "$changer" || die "pgbench failed: $(tail -3 "$OUT/pgbench-follow.log")"
            done
            stop "$LINKS_PID"
        done
    done
    echo "$n links, no HTTP load: ${DURATION} s of $CHANGE_RATE changes a second to links (changes) or to"
    echo "links_control (control, which no redirector follows); CPU seconds and context switches"
    echo "per run, medians of $ROUNDS interleaved rounds."
    echo
    echo "| redirector | changes | redirector CPU s | redirector switches | PostgreSQL CPU s | PostgreSQL switches |"
    echo "|---|---|---|---|---|---|"
    for variant in "${variants[@]}"; do
        for mode in control changes; do
            local cells="" f
            for f in 4 5 6 7; do
                cells+=" $(awk -v v="$variant" -v m="$mode" -v f="$f" -v hz="$CLK_TCK" '$1 == v && $2 == m {
                    print (f == 4 || f == 6) ? $f / hz : $f }' "$OUT/links-follow.tsv" | median) |"
            done
            echo "| $variant | $mode |$cells"
        done
    done
    echo
    echo "Every run: $OUT/links-follow.tsv (variant, mode, round, redirector ticks, switches, PostgreSQL ticks, switches)."
}

# --- link table memory through a long run of changes -------------------------------------------

# SOAK seconds of SOAK_RATE changes a second against LINK_COUNTS' first count (as many changes
# as hours at 100 a second), sampling the redirector's RSS every 10 s into links-soak.tsv.
bench_links_soak() {
    local n=${LINK_COUNTS%% *} changer t0 i=0
    load_links "$n"
    write_links_scripts "$n"
    links_start
    : >"$OUT/links-soak.tsv"
    t0=$SECONDS
    "$(pgbench_bin)" -n -R "$SOAK_RATE" -T "$SOAK" -c 1 -f "$OUT/link-changes.sql" \
        -D links="$n" "$(db_of current)" >"$OUT/pgbench-soak.log" 2>&1 &
    changer=$!
    while kill -0 "$changer" 2>/dev/null; do
        printf '%s\t%s\t%s\t%s\n' "$((SECONDS - t0))" "$(status_kib "$LINKS_PID" VmRSS)" \
            "$(metric "$REDIRECTOR_ADMIN" redirector_link_changes_applied_total)" \
            "$(metric "$REDIRECTOR_ADMIN" redirector_links)" >>"$OUT/links-soak.tsv"
        ((i++ % 6 == 0)) && log "soak: $(tail -1 "$OUT/links-soak.tsv")"
        sleep 10
    done
    wait "$changer" || die "pgbench failed: $(tail -3 "$OUT/pgbench-soak.log")"
    stop "$LINKS_PID"
    awk -v n="$n" -v rate="$(awk '/^tps = / { print $3 }' "$OUT/pgbench-soak.log")" '
        NR == 1 { first = $2; min = $2; max = $2 } { if ($2 < min) min = $2; if ($2 > max) max = $2; last = $2; applied = $3 }
        END { printf "| %d | %.0f/s | %d s | %d | %.0f | %.0f | %.0f | %.0f | %.2f |\n", n, rate, $1, applied,
              first / 1024, min / 1024, max / 1024, last / 1024, max / first }' "$OUT/links-soak.tsv" >"$OUT/links-soak.md"
    echo "| links | changes | run | changes applied | RSS first MiB | min | max | last | max / first |"
    echo "|---|---|---|---|---|---|---|---|---|"
    cat "$OUT/links-soak.md"
    echo
    echo "Every sample (seconds, RSS KiB, changes applied, links): $OUT/links-soak.tsv."
}

main() {
    local what
    (($# > 0)) || { echo "usage: scripts/lib/bench-legacy.sh MODE..." >&2; exit 2; }
    for what in "$@"; do
        case $what in
            compaction | hosts | partitions | links | links-follow | links-soak) ;;
            *) echo "bench-legacy.sh: $what is not one of its modes" >&2; exit 2 ;;
        esac
    done
    setup
    echo "# scripts/bench $*, $(date -u +%F), $(nproc) cores"
    echo
    [[ " $* " =~ \ (compaction|hosts|partitions)\  ]] && make_inputs
    for what in "$@"; do
        case $what in
            compaction) bench_compaction ;;
            hosts) bench_hosts ;;
            partitions) bench_partitions ;;
            links) bench_links ;;
            links-follow) bench_links_follow ;;
            links-soak) bench_links_soak ;;
        esac
    done
}

main "$@"
