//! The database schema of both services, in one place: versioned migrations, embedded in the
//! collector's binary and applied at start (the redirector reads `links` and `link_changes`,
//! which they create), and by the tests of both.
//!
//! All pending migrations run in one transaction under a transaction-scoped advisory lock, so
//! collectors starting together apply each migration exactly once, and a failed migration
//! leaves the schema as it was. Each lock a migration asks for is waited for at most
//! [`LOCK_WAIT`]: behind a session that holds `links` (idle in a transaction, say), a
//! migration would otherwise wait for good, holding every lock it took before, and the
//! writers of those tables behind it. It fails instead, and the collector's start tries again.

use tokio_postgres::{Client, GenericClient};

/// The longest a migration waits for a lock on a table (the advisory lock that serialises
/// migrations is waited for as long as another collector migrates).
pub const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The oldest PostgreSQL (`server_version_num`) the schema and the collector run on: 14, for
/// `DETACH PARTITION ... CONCURRENTLY` and `pg_inherits.inhdetachpending`, which retention
/// uses. `scripts/test-server-versions` runs the tests that depend on the version on it and on
/// the newest.
pub const OLDEST_SERVER: i32 = 140_000;

/// Arbitrary, fixed: the advisory lock key that serialises migrations ("clicks" in ASCII).
const LOCK_KEY: i64 = 0x636c_6963_6b73;

/// (version, name, SQL), in order. Never edit one that has shipped; add the next.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "schema", include_str!("../migrations/0001_schema.sql")),
    (
        2,
        "click_writers",
        include_str!("../migrations/0002_click_writers.sql"),
    ),
    (
        3,
        "writer_instance",
        include_str!("../migrations/0003_writer_instance.sql"),
    ),
    (
        4,
        "link_changes",
        include_str!("../migrations/0004_link_changes.sql"),
    ),
    (
        5,
        "count_batches",
        include_str!("../migrations/0005_count_batches.sql"),
    ),
    (
        6,
        "partitions",
        include_str!("../migrations/0006_partitions.sql"),
    ),
    (
        7,
        "link_url_check",
        include_str!("../migrations/0007_link_url_check.sql"),
    ),
    (8, "roles", include_str!("../migrations/0008_roles.sql")),
    (
        9,
        "count_batch_writer",
        include_str!("../migrations/0009_count_batch_writer.sql"),
    ),
    (
        10,
        "count_lists",
        include_str!("../migrations/0010_count_lists.sql"),
    ),
    (
        11,
        "day_vacuum",
        include_str!("../migrations/0011_day_vacuum.sql"),
    ),
    (
        12,
        "sender_resync",
        include_str!("../migrations/0012_sender_resync.sql"),
    ),
    (
        13,
        "public_schema",
        include_str!("../migrations/0013_public_schema.sql"),
    ),
    (
        14,
        "breakdowns",
        include_str!("../migrations/0014_breakdowns.sql"),
    ),
    (
        15,
        "prune_by_id",
        include_str!("../migrations/0015_prune_by_id.sql"),
    ),
    (
        16,
        "trigger_functions",
        include_str!("../migrations/0016_trigger_functions.sql"),
    ),
    (
        17,
        "prune_behind_running",
        include_str!("../migrations/0017_prune_behind_running.sql"),
    ),
    (
        18,
        "breakdown_expiry_index",
        include_str!("../migrations/0018_breakdown_expiry_index.sql"),
    ),
    (
        19,
        "sender_address",
        include_str!("../migrations/0019_sender_address.sql"),
    ),
    (
        20,
        "prune_in_slices",
        include_str!("../migrations/0020_prune_in_slices.sql"),
    ),
    (
        21,
        "replicated_links",
        include_str!("../migrations/0021_replicated_links.sql"),
    ),
    (
        22,
        "prune_on_postgresql_14",
        include_str!("../migrations/0022_prune_on_postgresql_14.sql"),
    ),
    (
        23,
        "link_reader_reads_links_only",
        include_str!("../migrations/0023_link_reader_reads_links_only.sql"),
    ),
    (
        24,
        "partitions_attached",
        include_str!("../migrations/0024_partitions_attached.sql"),
    ),
];

/// Every version this build knows, in order.
pub fn versions() -> Vec<i32> {
    MIGRATIONS.iter().map(|m| m.0).collect()
}

/// The latest schema version this build knows.
pub const LATEST: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Applies the migrations the database lacks; returns the versions it applied.
pub async fn apply(client: &mut Client) -> Result<Vec<i32>, tokio_postgres::Error> {
    apply_up_to(client, LATEST).await
}

/// Applies the migrations the database lacks up to version `last` (an older schema, for the
/// tests of a migration on a populated database); returns the versions it applied.
pub async fn apply_up_to(
    client: &mut Client,
    last: i32,
) -> Result<Vec<i32>, tokio_postgres::Error> {
    // No statement timeout, nor (PostgreSQL 17 on) transaction timeout: one the database or
    // the role sets (common on managed servers) would cancel a long migration (a scan of a
    // large table, an index build) at every attempt, and the collector never start. Only the
    // waits for the tables' locks are bounded, below. Set first thing in the transaction,
    // whose timeout runs from its start.
    let timeouts = match server_version(&*client).await? {
        170_000.. => "SET LOCAL statement_timeout = 0; SET LOCAL transaction_timeout = 0",
        _ => "SET LOCAL statement_timeout = 0",
    };
    let tx = client.transaction().await?;
    tx.batch_execute(timeouts).await?;
    refuse_older_than(&tx, OLDEST_SERVER).await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
        .await?;
    let lock_timeout = format!("SET LOCAL lock_timeout = {}", LOCK_WAIT.as_millis());
    tx.batch_execute(&lock_timeout).await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now())",
    )
    .await?;
    let done: Vec<i32> = tx
        .query("SELECT version FROM schema_migrations", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut applied = Vec::new();
    let missing = MIGRATIONS
        .iter()
        .filter(|m| m.0 <= last && !done.contains(&m.0));
    for &(version, name, sql) in missing {
        if let Err(e) = tx.batch_execute(sql).await {
            // The caller's line says only what the server said; a lock not had within
            // LOCK_WAIT is some session's holding a table this migration needs.
            tracing::warn!(
                "migration {version} ({name}) did not apply, all pending ones rolled back: \
                 {e}; a lock timeout is a session holding a table it needs for over \
                 {LOCK_WAIT:?} (see pg_locks and pg_stat_activity)"
            );
            return Err(e);
        }
        tx.execute(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            &[&version, &name],
        )
        .await?;
        tracing::info!("applied migration {version} ({name})");
        applied.push(version);
    }
    tx.commit().await?;
    Ok(applied)
}

/// The server's `server_version_num` (e.g. 150018).
pub async fn server_version(client: &impl GenericClient) -> Result<i32, tokio_postgres::Error> {
    let row = client
        .query_one("SELECT current_setting('server_version_num')::int4", &[])
        .await?;
    Ok(row.get(0))
}

/// Fails, saying which server it is and what to do, on a server older than `oldest` (a
/// `server_version_num`): [`apply`] checks [`OLDEST_SERVER`].
pub async fn refuse_older_than(
    client: &impl GenericClient,
    oldest: i32,
) -> Result<(), tokio_postgres::Error> {
    let major = oldest / 10_000;
    client
        .batch_execute(&format!(
            "DO $$ BEGIN
               IF current_setting('server_version_num')::int < {oldest} THEN
                 RAISE EXCEPTION 'PostgreSQL % is older than {major}, the oldest this release \
                   runs on', current_setting('server_version')
                   USING ERRCODE = 'feature_not_supported',
                         HINT = 'Upgrade the server (pg_upgrade): a collector waiting for it goes on by itself.';
               END IF;
             END $$"
        ))
        .await
}

/// A trigger on `links` of migration 21 that must not fire in ordinary sessions only: its
/// name, the `tgenabled` letter of its mode and the words `ALTER TABLE` sets it with.
struct LinkTrigger {
    name: &'static str,
    letter: &'static str,
    mode: &'static str,
}

const LINK_TRIGGERS: [LinkTrigger; 3] = [
    LinkTrigger {
        name: "links_log_replicated",
        letter: "R",
        mode: "ENABLE REPLICA",
    },
    LinkTrigger {
        name: "links_truncated",
        letter: "A",
        mode: "ENABLE ALWAYS",
    },
    LinkTrigger {
        name: "links_changed",
        letter: "A",
        mode: "ENABLE ALWAYS",
    },
];

/// What [`restore_link_trigger_modes`] found, by trigger name.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LinkTriggerModes {
    /// In another mode than theirs, with the `tgenabled` letter found (`O` after `ALTER TABLE
    /// links ENABLE TRIGGER ALL`).
    pub wrong: Vec<(&'static str, String)>,
    /// The one statement that set those back, if any (the `TRUNCATE` epoch bumped with it).
    pub set_back: Option<String>,
    /// Disabled (`D`), on purpose maybe (a bulk load): left so.
    pub disabled: Vec<&'static str>,
    /// Not on `links` at all.
    pub missing: Vec<&'static str>,
}

impl LinkTriggerModes {
    /// Triggers that do not fire where theirs should: disabled, missing, or in another mode
    /// and not set back.
    pub fn not_firing(&self) -> usize {
        let wrong = if self.set_back.is_some() {
            0
        } else {
            self.wrong.len()
        };
        self.disabled.len() + self.missing.len() + wrong
    }
}

/// Sets back the modes of migration 21's triggers on `links` where they are not theirs:
/// `ALTER TABLE links ENABLE TRIGGER ALL` (or `ENABLE TRIGGER` of one) resets them to fire in
/// ordinary sessions only, which leaves what a logical replication subscription applies
/// unlogged. With them it bumps the `TRUNCATE` epoch, so that every redirector loads the table
/// in full and serves what went unlogged meanwhile (and what a restore with triggers disabled,
/// which ends with that reset, loaded). The modes are read first without a lock, so that a
/// look that finds them right holds up no writer; wrong, they are read again under the lock
/// the `ALTER` takes (`LOCK TABLE` in its mode, by the table's owner only: another role would
/// hold up every writer only to be refused), so that collectors looking at once set them
/// back, and reload every redirector, once. Each of the three locks it may wait for (that
/// one, the epoch's row, the notification queue's at commit) it waits for at most
/// `lock_wait`: for `links`', every writer of links waits behind it.
pub async fn restore_link_trigger_modes(
    client: &mut Client,
    lock_wait: std::time::Duration,
) -> Result<LinkTriggerModes, tokio_postgres::Error> {
    let unlocked = link_trigger_modes(client).await?;
    if unlocked.wrong.is_empty() {
        return Ok(unlocked);
    }
    let tx = client.transaction().await?;
    let wait = lock_wait.as_millis().max(1);
    let lock = format!(
        "SET LOCAL lock_timeout = '{wait}ms';
         DO $$ BEGIN
             IF NOT pg_has_role((SELECT relowner FROM pg_class
                                 WHERE oid = 'public.links'::regclass), 'USAGE') THEN
                 RAISE EXCEPTION 'must be owner of table links'
                     USING ERRCODE = 'insufficient_privilege';
             END IF;
         END $$;
         LOCK TABLE public.links IN SHARE ROW EXCLUSIVE MODE"
    );
    tx.batch_execute(&lock).await?;
    let mut found = link_trigger_modes(&tx).await?;
    if !found.wrong.is_empty() {
        let clauses: Vec<String> = (found.wrong.iter())
            .filter_map(|(name, _)| LINK_TRIGGERS.iter().find(|t| t.name == *name))
            .map(|t| format!("{} TRIGGER {}", t.mode, t.name))
            .collect();
        let alter = format!("ALTER TABLE public.links {}", clauses.join(", "));
        // The notification wakes redirectors that wait for one (`--reload-interval` long).
        let reload = "UPDATE public.link_changes_state SET epoch = epoch + 1;
                      NOTIFY links_changed";
        tx.batch_execute(&format!("{alter}; {reload}")).await?;
        found.set_back = Some(alter);
    }
    tx.commit().await?;
    Ok(found)
}

/// The modes of migration 21's triggers, read without a lock, as
/// [`restore_link_trigger_modes`] sorts them.
pub async fn link_trigger_modes(
    client: &impl GenericClient,
) -> Result<LinkTriggerModes, tokio_postgres::Error> {
    let names: Vec<&str> = LINK_TRIGGERS.iter().map(|t| t.name).collect();
    let rows = client
        .query(
            "SELECT tgname::text, tgenabled::text FROM pg_trigger
             WHERE tgrelid = 'public.links'::regclass AND tgname = ANY($1)",
            &[&names],
        )
        .await?;
    let mut found = LinkTriggerModes::default();
    for t in &LINK_TRIGGERS {
        let letter = rows
            .iter()
            .find(|r| r.get::<_, &str>(0) == t.name)
            .map(|r| r.get::<_, String>(1));
        match letter.as_deref() {
            None => found.missing.push(t.name),
            Some("D") => found.disabled.push(t.name),
            Some(letter) if letter == t.letter => {}
            Some(letter) => found.wrong.push((t.name, letter.to_owned())),
        }
    }
    Ok(found)
}
