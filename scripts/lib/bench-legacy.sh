#!/usr/bin/env bash
# The modes of scripts/bench not yet ported to its Rust binary (shared/bench), which runs this
# file for them: hosts, links, links-follow and links-soak, each mode named an argument
# (`bench-legacy.sh hosts links`). `scripts/bench --help` describes
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

# --- wrk, and the collector's progress ------------------------------------------------------------

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

# --- ingest inputs and tables ----------------------------------------------------------------------

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
            hosts | links | links-follow | links-soak) ;;
            *) echo "bench-legacy.sh: $what is not one of its modes" >&2; exit 2 ;;
        esac
    done
    setup
    echo "# scripts/bench $*, $(date -u +%F), $(nproc) cores"
    echo
    [[ " $* " == *" hosts "* ]] && make_inputs
    for what in "$@"; do
        case $what in
            hosts) bench_hosts ;;
            links) bench_links ;;
            links-follow) bench_links_follow ;;
            links-soak) bench_links_soak ;;
        esac
    done
}

main "$@"
