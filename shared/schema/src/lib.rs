//! The database schema of both services, in one place: versioned migrations, embedded in the
//! collector's binary and applied at start (the redirector reads `links` and `link_changes`,
//! which they create), and by the tests of both.
//!
//! All pending migrations run in one transaction under a transaction-scoped advisory lock, so
//! collectors starting together apply each migration exactly once, and a failed migration
//! leaves the schema as it was.

use tokio_postgres::Client;

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
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
        .await?;
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
        tx.batch_execute(sql).await?;
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

/// The triggers on `links` that must not fire in ordinary sessions only (migration 21), and
/// the mode each fires in: `ENABLE REPLICA` (`R`) or `ENABLE ALWAYS` (`A`).
const LINK_TRIGGER_MODES: [(&str, &str); 3] = [
    ("links_log_replicated", "REPLICA"),
    ("links_truncated", "ALWAYS"),
    ("links_changed", "ALWAYS"),
];

/// Sets back the modes of migration 21's triggers on `links` where they are not theirs:
/// `ALTER TABLE links ENABLE TRIGGER ALL` (or `ENABLE TRIGGER` of one) resets them to fire
/// in ordinary sessions only, which leaves what a logical replication subscription applies
/// unlogged. A disabled one is left
/// as it is (disabled on purpose, for a bulk load say). Returns what it found, each a line
/// for the log, and whether it set it back. Waits a second at most for its lock on `links`.
pub async fn restore_link_trigger_modes(
    client: &Client,
) -> Result<Vec<(String, bool)>, tokio_postgres::Error> {
    let names: Vec<&str> = LINK_TRIGGER_MODES.iter().map(|t| t.0).collect();
    let rows = client
        .query(
            "SELECT tgname::text, tgenabled::text FROM pg_trigger
             WHERE tgrelid = 'public.links'::regclass AND tgname = ANY($1)",
            &[&names],
        )
        .await?;
    let mut found = Vec::new();
    for row in rows {
        let (name, enabled): (String, String) = (row.get(0), row.get(1));
        let Some(&(_, mode)) = LINK_TRIGGER_MODES.iter().find(|t| t.0 == name) else {
            continue;
        };
        let set = format!("ALTER TABLE public.links ENABLE {mode} TRIGGER {name}");
        match enabled.as_str() {
            // Disabled on purpose, maybe: said, and left.
            "D" => {
                let line = format!(
                    "trigger {name} on links is disabled: what it logs or announces goes \
                     unseen by the redirectors until `{set}`"
                );
                found.push((line, false));
            }
            now if now == &mode[..1] => {}
            _ => {
                // A moment at most: it waits for every writer of links, and they behind it.
                let bounded = format!("SET LOCAL lock_timeout = '1s'; {set}");
                client.batch_execute(&bounded).await?;
                let line = format!(
                    "trigger {name} on links fired in the wrong sessions (mode {enabled}; \
                     after ENABLE TRIGGER ALL?): what a logical replication subscription \
                     applied went unseen by the redirectors; set back by `{set}`"
                );
                found.push((line, true));
            }
        }
    }
    Ok(found)
}
