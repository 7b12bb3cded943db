# shellcheck shell=bash
# A private PostgreSQL cluster in a directory of its own, for scripts/dev and scripts/bench:
# data in $PGDIR/data, its Unix socket in $PGDIR, no TCP. Set PGDIR (and PG_USER, the user it
# runs as when we are root: PostgreSQL refuses to run as root), then:
#   pg_install_server; PGBIN=$(pg_bindir); pg_prepare; pg_initdb LOG; pg_running || pg_start LOG; ...; pg_stop
# Each function returns non-zero with the reason on stderr; the caller decides what to say.
#
# The cluster is the developer's alone: whoever runs the script (root included) and the user
# the server runs as connect, as the superuser `postgres`; nobody else can. $PGDIR is 0700,
# the socket 0700, and authentication is `peer`, mapped from those two OS users only
# (pg_access, rewritten at every start, so that a cluster made by an older script, with
# `trust`, is closed too). A superuser can run programs as the server's user (COPY ... TO
# PROGRAM), so reaching the socket must not be enough.

PG_USER=${PG_USER:-postgres}

# Where initdb and pg_ctl are: PATH, `pg_config --bindir`, or the newest /usr/lib/postgresql/*/bin.
pg_bindir() {
    local dir
    if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
        # Where a link on PATH leads: the directory that also has pg_basebackup and psql.
        dirname "$(readlink -f "$(command -v initdb)")"
        return
    fi
    dir=$(pg_config --bindir 2>/dev/null || true)
    if [ -n "$dir" ] && [ -x "$dir/initdb" ]; then
        echo "$dir"
        return
    fi
    for dir in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V -r); do
        [ -x "$dir/initdb" ] && { echo "$dir"; return; }
    done
    echo "PostgreSQL server binaries (initdb, pg_ctl) not found: install them (Debian: apt-get install postgresql)" >&2
    return 1
}

# Makes sure the server binaries are there: when pg_bindir finds none, installs Debian's
# `postgresql` package if it can (root, apt-get; its output on stderr), as CI does on a fresh
# machine. Otherwise fails, saying the one command to run.
pg_install_server() {
    pg_bindir >/dev/null 2>&1 && return 0
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "PostgreSQL server binaries (initdb, pg_ctl) not found and there is no apt-get:" \
            "install PostgreSQL's server package with this system's package manager" >&2
        return 1
    fi
    if ((EUID != 0)); then
        echo "PostgreSQL server binaries (initdb, pg_ctl) not found. Install them with:" \
            "sudo apt-get install postgresql" >&2
        return 1
    fi
    echo "PostgreSQL server binaries (initdb, pg_ctl) not found: installing Debian's postgresql package" >&2
    apt-get update -q >&2 &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends postgresql >&2 ||
        { echo "apt-get install postgresql failed (see above)" >&2; return 1; }
    pg_bindir >/dev/null
}

# Runs a command in the cluster's dir, as $PG_USER when we are root.
as_pg() {
    if ((EUID == 0)); then
        (cd "$PGDIR" && setpriv --reuid="$PG_USER" --regid="$(id -g "$PG_USER")" --init-groups -- "$@")
    else
        (cd "$PGDIR" && "$@")
    fi
}

# Creates $PGDIR and, as root, hands it (and the log files named) to $PG_USER.
pg_prepare() {
    if (( ${#PGDIR} + 17 >= 108 )); then
        echo "$PGDIR is too long for a Unix socket path" >&2
        return 1
    fi
    mkdir -p "$PGDIR"
    touch "$@"
    # The socket's directory: closed to everyone but its owner (the server's user; root
    # passes anyway), whatever the umask made it or an older script left it.
    chmod 0700 "$PGDIR"
    ((EUID == 0)) || return 0
    if ! id "$PG_USER" >/dev/null 2>&1; then
        echo "running as root, and PostgreSQL refuses to: no user '$PG_USER' to run it as" >&2
        return 1
    fi
    chown "$PG_USER:" "$PGDIR" "$@"
    if ! setpriv --reuid="$PG_USER" --regid="$(id -g "$PG_USER")" --init-groups -- test -w "$PGDIR" 2>/dev/null; then
        echo "user '$PG_USER' cannot reach $PGDIR: a parent directory is closed to it" >&2
        return 1
    fi
}

pg_initialized() { [ -f "$PGDIR/data/PG_VERSION" ]; }

pg_initdb() { # LOG
    as_pg "$PGBIN/initdb" -D "$PGDIR/data" -U postgres --auth-local=peer --auth-host=reject \
        -E UTF8 --locale=C.UTF-8 >"$1" 2>&1
}

# Writes who may connect: through the Unix socket only, by peer authentication, the OS users
# that run this script and the server, as the database role `postgres`.
pg_access() {
    local me
    me=$(id -un) || { echo "uid $EUID has no user name, which peer authentication needs" >&2; return 1; }
    {
        echo "# Written by scripts/lib/pg.sh at every start: the Unix socket only (the server"
        echo "# listens on no TCP address), and only the OS users of pg_ident.conf's map dev."
        echo "local all all peer map=dev"
        # A standby copies the cluster (pg_basebackup) and streams from it over a replication
        # connection, which "all" does not cover.
        echo "local replication all peer map=dev"
    } | as_pg tee "$PGDIR/data/pg_hba.conf" >/dev/null || return 1
    {
        echo "# Written by scripts/lib/pg.sh at every start: who runs the scripts, and the server's user."
        printf 'dev "%s" postgres\n' "$me"
        if ((EUID == 0)); then printf 'dev "%s" postgres\n' "$PG_USER"; fi
    } | as_pg tee "$PGDIR/data/pg_ident.conf" >/dev/null
}

# Copies the running cluster whose socket is in $1 into $PGDIR/data as a streaming standby
# of it (`-R`: the standby settings, primary_conninfo naming that socket). LOG is $2.
pg_basebackup_from() { # PRIMARY_DIR LOG
    as_pg "$PGBIN/pg_basebackup" -h "$1" -U postgres -D "$PGDIR/data" -R -X stream -c fast \
        >"$2" 2>&1
}

pg_running() { as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" status >/dev/null 2>&1; }

# Whether the cluster is known not to run (pg_ctl status says 3): a status that cannot be told
# (its directory unreadable, a user that cannot be switched to) is no reason to skip a stop.
pg_stopped() {
    local status=0
    as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" status >/dev/null 2>&1 || status=$?
    [ "$status" = 3 ]
}

pg_start() { # LOG; extra server settings in $PG_OPTIONS
    pg_access || return 1
    as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" -l "$1" -w -t 60 \
        -o "-k '$PGDIR' -c listen_addresses= -c unix_socket_permissions=0700 ${PG_OPTIONS:-}" \
        start >/dev/null
}

# Whether a process was started on $PGDIR/data (`postgres -D <it>`, as pg_ctl starts it), by
# the processes rather than postmaster.pid: a Ctrl-C passed on by `pg_ctl start` (which then
# exits) to a server too early in its start to act on it, or one that ended pg_ctl just after
# its fork, leaves a server that has not written postmaster.pid yet, so that `pg_ctl status`
# says stopped.
pg_forked() {
    local cmdline
    for cmdline in /proc/[0-9]*/cmdline; do
        { tr '\0' '\n' <"$cmdline"; } 2>/dev/null | grep -qxF -- "$PGDIR/data" && return 0
    done
    return 1
}

# Stops the server unless it is known not to run; one in its start (`pg_forked`) is waited
# for, up to 10 s, until its postmaster.pid says where it is or it is gone.
pg_stop_if_running() {
    local deadline=$((SECONDS + 10))
    while pg_stopped && pg_forked && ((SECONDS < deadline)); do sleep 0.1; done
    pg_stopped || pg_stop
}

# A server already running (left by an earlier run) takes the current access rules (its
# socket's mode stays what it started with; $PGDIR's closes it).
pg_reload_access() { pg_access && as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" reload >/dev/null; }

# A server that stopped meanwhile (told to by pg_ctl start, above) is stopped, not an error.
pg_stop() {
    local why
    why=$(as_pg "$PGBIN/pg_ctl" -D "$PGDIR/data" -m fast -w -t 60 stop 2>&1 >/dev/null) && return 0
    pg_stopped && return 0
    printf '%s\n' "$why" >&2
    return 1
}

# The libpq key=value connection string for database $1 as the superuser postgres (the path
# quoted: it may hold spaces; pg_ctl's -o above is read by a shell, hence its quotes too).
pg_url() { echo "host='$PGDIR' user=postgres dbname=$1"; }
