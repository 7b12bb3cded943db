//! The schema against a real PostgreSQL cluster from the test harness.

use testkit::pgtest;

/// Every table, view, function and trigger with its definition, to compare schemas.
const SCHEMA: &str = "
    SELECT string_agg(line, E'\n' ORDER BY line) FROM (
        SELECT format('%s.%s %s', table_name, column_name, data_type) AS line
          FROM information_schema.columns WHERE table_schema = 'public'
        UNION ALL SELECT 'view ' || pg_get_viewdef('click_totals'::regclass)
        UNION ALL SELECT 'check ' || conname || ' ' || pg_get_constraintdef(oid)
          FROM pg_constraint WHERE connamespace = 'public'::regnamespace
        UNION ALL SELECT 'trigger ' || tgname FROM pg_trigger WHERE NOT tgisinternal
        UNION ALL SELECT 'migration ' || version FROM schema_migrations
    ) AS s";

#[tokio::test]
async fn applying_twice_changes_nothing() {
    let db = pgtest::cluster().fresh_database().await;
    let mut client = pgtest::connect(&db.url).await;
    assert_eq!(
        schema::apply(&mut client).await.unwrap(),
        schema::versions()
    );
    let before: String = client.query_one(SCHEMA, &[]).await.unwrap().get(0);
    for column in [
        "clicks.clicked_at timestamp with time zone",
        "click_writers.last_batch bigint",
        "click_writers.instance text",
    ] {
        assert!(before.contains(column), "{column} in {before}");
    }
    assert_eq!(schema::apply(&mut client).await.unwrap(), Vec::<i32>::new());
    let after: String = client.query_one(SCHEMA, &[]).await.unwrap().get(0);
    assert_eq!(before, after);
}

/// A statement timeout the database sets (and from PostgreSQL 17 on a transaction timeout)
/// does not cut the migrations short: a long one would be cancelled at every start. A
/// millisecond outlasts none of them whole, and 5 ms not all of them together.
#[tokio::test]
async fn a_statement_timeout_the_database_sets_does_not_cancel_the_migrations() {
    let db = pgtest::cluster().fresh_database().await;
    let admin = pgtest::connect(&db.url).await;
    let set = format!("ALTER DATABASE \"{}\" SET statement_timeout = 1", db.name);
    admin.batch_execute(&set).await.unwrap();
    if schema::server_version(&admin).await.unwrap() >= 170_000 {
        let set = format!("ALTER DATABASE \"{}\" SET transaction_timeout = 5", db.name);
        admin.batch_execute(&set).await.unwrap();
    }
    // Not set up as the services' sessions are, which run without the database's timeouts:
    // the migrations see to their own, whoever calls them.
    let mut client = pgtest::connect_as_given(&db.url).await;
    let timeout: String = client
        .query_one("SHOW statement_timeout", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(timeout, "1ms", "the database's setting reaches the session");
    assert_eq!(
        schema::apply(&mut client).await.unwrap(),
        schema::versions()
    );
}

/// A migration waits for a table's lock at most `LOCK_WAIT`: behind a session that holds
/// `links` (migration 21 makes triggers on it), it fails with the lock's timeout, the schema as
/// it was, and applies once that session has ended.
#[tokio::test]
async fn a_migration_behind_a_held_table_gives_up_and_applies_later() {
    let db = pgtest::cluster().fresh_database().await;
    let mut client = pgtest::connect(&db.url).await;
    schema::apply_up_to(&mut client, 20).await.unwrap();
    let mut holder = pgtest::connect(&db.url).await;
    let held = holder.transaction().await.unwrap();
    held.batch_execute("LOCK TABLE links IN ROW EXCLUSIVE MODE")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let limit = schema::LOCK_WAIT * 3;
    let waited = tokio::time::timeout(limit, schema::apply(&mut client)).await;
    let err = waited
        .unwrap_or_else(|_| panic!("the migration waited past {limit:?}"))
        .expect_err("a migration behind the held table");
    let code = err.code().cloned();
    assert_eq!(
        code,
        Some(tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE),
        "{err}"
    );
    assert!(started.elapsed() >= schema::LOCK_WAIT);
    held.rollback().await.unwrap();
    let versions = schema::versions();
    assert_eq!(schema::apply(&mut client).await.unwrap(), versions[20..]);
}

#[tokio::test]
async fn concurrent_starts_apply_each_migration_once() {
    let db = pgtest::cluster().fresh_database().await;
    let runs = (0..4).map(|_| {
        let url = db.url.clone();
        tokio::spawn(async move {
            let mut client = pgtest::connect(&url).await;
            schema::apply(&mut client).await.unwrap()
        })
    });
    let mut applied = Vec::new();
    for run in runs {
        applied.extend(run.await.unwrap());
    }
    applied.sort();
    assert_eq!(applied, schema::versions());
}

#[tokio::test]
async fn links_accept_only_http_urls_and_valid_codes() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let insert = "INSERT INTO links (code, url) VALUES ($1, $2)";
    client
        .execute(insert, &[&"ok", &"https://example.com/"])
        .await
        .unwrap();
    client
        .execute(insert, &[&"ok2", &"http://example.com/"])
        .await
        .unwrap();
    for (code, url) in [
        ("bad", "ftp://x"),
        ("bad", "javascript:alert(1)"),
        ("a b", "https://x"),
    ] {
        let err = client.execute(insert, &[&code, &url]).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION),
            "{code} {url}: {err:?}"
        );
    }
}

#[tokio::test]
async fn changing_links_notifies_links_changed() {
    let db = pgtest::test_db().await;
    let (listener, mut conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = std::pin::pin!(std::future::poll_fn(move |cx| {
            loop {
                match conn.poll_message(cx) {
                    std::task::Poll::Ready(Some(Ok(
                        tokio_postgres::AsyncMessage::Notification(n),
                    ))) => {
                        let _ = tx.send(n.channel().to_owned());
                    }
                    std::task::Poll::Ready(Some(Ok(_))) => {}
                    std::task::Poll::Ready(_) => return std::task::Poll::Ready(()),
                    std::task::Poll::Pending => return std::task::Poll::Pending,
                }
            }
        }));
        (&mut messages).await
    });
    listener
        .batch_execute("LISTEN links_changed")
        .await
        .unwrap();
    let writer = pgtest::connect(&db.url).await;
    writer
        .execute(
            "INSERT INTO links (code, url) VALUES ('n1', 'https://e.x/')",
            &[],
        )
        .await
        .unwrap();
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), rx.recv())
        .await
        .expect("no links_changed notification within 10 s");
    assert_eq!(got.as_deref(), Some("links_changed"));
}

#[tokio::test]
async fn totals_view_adds_unfolded_deltas() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "INSERT INTO click_counts VALUES ('a', '2026-01-01', 10);
             INSERT INTO click_count_deltas VALUES ('a', '2026-01-01', 2);
             INSERT INTO click_count_batches (day, entries, codes, counts)
                  VALUES ('2026-01-01', 1, '{a}', '{3}'), ('2026-01-02', 1, '{b}', '{1}');
             INSERT INTO click_count_lists (day, entries, code_list, count_list, writer, batch)
                  VALUES ('2026-01-01', 2, 'a c-_9', '4 12', 1, 1);",
        )
        .await
        .unwrap();
    let rows = client
        .query(
            "SELECT code, day::text, clicks FROM click_totals ORDER BY code",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, String, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        got,
        [
            ("a".into(), "2026-01-01".into(), 19),
            ("b".into(), "2026-01-02".into(), 1),
            ("c-_9".into(), "2026-01-01".into(), 12)
        ]
    );
}

/// What the README's "Past one PostgreSQL" relies on to shard by code on Citus: every unique
/// key of a table to be distributed contains its distribution column, and the totals view
/// groups by it.
#[tokio::test]
async fn every_unique_key_contains_the_column_the_table_would_be_sharded_by() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let keys = "
        SELECT c.conrelid::regclass::text, string_agg(a.attname, ',' ORDER BY a.attname)
        FROM pg_constraint c
        JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
        WHERE c.contype IN ('p', 'u') AND c.connamespace = 'public'::regnamespace
        GROUP BY c.oid, c.conrelid";
    let shard_by = [
        ("clicks", "code"),
        ("click_count_deltas", "code"),
        ("click_counts", "code"),
        ("click_senders", "sender"),
        ("click_writers", "writer"),
    ];
    for row in client.query(keys, &[]).await.unwrap() {
        let (table, columns): (String, String) = (row.get(0), row.get(1));
        if let Some((_, column)) = shard_by.iter().find(|(t, _)| *t == table) {
            assert!(
                columns.split(',').any(|c| c == *column),
                "{table}: unique key ({columns}) lacks {column}"
            );
        }
    }
    let view: String = client
        .query_one("SELECT pg_get_viewdef('click_totals'::regclass)", &[])
        .await
        .unwrap()
        .get(0);
    // PostgreSQL 18 deparses the columns unqualified, earlier ones as `parts.code`.
    let unqualified = view.replace("parts.", "");
    assert!(unqualified.contains("GROUP BY code, day"), "{view}");
}

#[tokio::test]
async fn links_refuse_control_characters_and_urls_over_2048_bytes() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let insert = "INSERT INTO links (code, url) VALUES ($1, $2)";
    let longest = format!("https://example.com/{}", "x".repeat(2048 - 20));
    assert_eq!(longest.len(), 2048);
    client
        .execute(insert, &[&"longest", &longest])
        .await
        .expect("2,048 bytes is allowed");
    let too_long = format!("{longest}x");
    let bad = [
        ("nl", "https://example.com/a\nb".to_owned()),
        ("cr", "https://example.com/a\rb".to_owned()),
        ("tab", "https://example.com/a\tb".to_owned()),
        ("soh", "https://example.com/a\u{1}b".to_owned()),
        ("del", "https://example.com/a\u{7f}b".to_owned()),
        ("long", too_long),
    ];
    for (code, url) in &bad {
        let err = client.execute(insert, &[code, url]).await.unwrap_err();
        let db_err = err.as_db_error().expect("a server error");
        assert_eq!(
            (db_err.code(), db_err.constraint()),
            (
                &tokio_postgres::error::SqlState::CHECK_VIOLATION,
                Some("links_url_clean")
            ),
            "{code}: {err:?}"
        );
    }
    // An UPDATE cannot bring one in either.
    let err = client
        .execute(
            "UPDATE links SET url = url || chr(10) WHERE code = 'longest'",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.as_db_error().and_then(|e| e.constraint()),
        Some("links_url_clean")
    );
}

/// Whether `links_url_clean` is validated.
async fn url_check_validated(client: &tokio_postgres::Client) -> bool {
    client
        .query_one(
            "SELECT convalidated FROM pg_constraint WHERE conname = 'links_url_clean'",
            &[],
        )
        .await
        .expect("links_url_clean exists")
        .get(0)
}

/// Migrations 1-6, then `rows` written into links, then the rest; returns a client and the
/// warnings the rest raised.
async fn migrate_links_holding(rows: &[(&str, String)]) -> (tokio_postgres::Client, Vec<String>) {
    let db = pgtest::cluster().fresh_database().await;
    let mut client = pgtest::connect(&db.url).await;
    schema::apply_up_to(&mut client, 6).await.unwrap();
    for (code, url) in rows {
        client
            .execute(
                "INSERT INTO links (code, url) VALUES ($1, $2)",
                &[code, url],
            )
            .await
            .unwrap();
    }
    // A session of our own, to see the server's notices.
    let config: shared::db::Config = db.url.parse().unwrap();
    let (mut migrator, mut conn) = config.connect_raw().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(Ok(message)) = std::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let tokio_postgres::AsyncMessage::Notice(n) = message {
                let _ = tx.send(format!("{}: {}", n.severity(), n.message()));
            }
        }
    });
    schema::apply(&mut migrator).await.unwrap();
    drop(migrator);
    // The session ends once its client is dropped, and with it the stream of notices.
    let mut notices = Vec::new();
    let limit = std::time::Duration::from_secs(30);
    while let Some(n) = tokio::time::timeout(limit, rx.recv())
        .await
        .expect("the migrating session to end")
    {
        notices.push(n);
    }
    (client, notices)
}

#[tokio::test]
async fn migration_7_validates_a_clean_table_and_warns_about_rows_that_break_the_check() {
    let (clean, notices) =
        migrate_links_holding(&[("a", "https://example.com/a".to_owned())]).await;
    assert!(url_check_validated(&clean).await);
    assert!(
        !notices.iter().any(|n| n.contains("links_url_clean")),
        "{notices:?}"
    );

    let (dirty, notices) = migrate_links_holding(&[
        ("a", "https://example.com/a".to_owned()),
        ("nl", "https://example.com/a\nb".to_owned()),
        ("long", format!("https://example.com/{}", "x".repeat(3000))),
    ])
    .await;
    assert!(
        !url_check_validated(&dirty).await,
        "left NOT VALID while rows break it"
    );
    let warning = notices
        .iter()
        .find(|n| n.contains("links_url_clean"))
        .unwrap_or_else(|| panic!("no warning about links_url_clean in {notices:?}"));
    assert!(
        warning.starts_with("WARNING: 2 row(s) of links")
            && warning.contains("SELECT code FROM links"),
        "{warning}"
    );
    // The query the warning gives finds exactly those rows.
    let query = &warning[warning.find("SELECT code FROM links").unwrap()..];
    let query = &query[..query.find(';').unwrap()];
    let mut found: Vec<String> = dirty
        .query(query, &[])
        .await
        .unwrap_or_else(|e| panic!("{query}: {e:?}"))
        .iter()
        .map(|r| r.get(0))
        .collect();
    found.sort();
    assert_eq!(found, ["long", "nl"]);
    // New rows are checked all the same.
    let err = dirty
        .execute(
            "INSERT INTO links (code, url) VALUES ('t', 'https://x/' || chr(9))",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.as_db_error().and_then(|e| e.constraint()),
        Some("links_url_clean")
    );
}

/// A collector upgraded under the roles of an older `database.sql` (its login role owns the
/// database but is no member of clicks_collector) stops at migration 8 and says what to run;
/// once granted, the migration goes through and hands the schema over.
#[tokio::test]
async fn migration_8_tells_a_collector_without_the_role_what_to_run() {
    let cluster = pgtest::cluster();
    // The group roles exist once any database of the cluster is migrated.
    let _ = pgtest::test_db().await;
    let admin = cluster.connect("postgres").await;
    let name = format!("legacy_{}", std::process::id());
    for sql in [
        format!("CREATE ROLE {name} LOGIN"),
        format!("CREATE DATABASE {name} OWNER {name}"),
    ] {
        admin.batch_execute(&sql).await.unwrap();
    }
    let url = format!("{} user={name}", cluster.url(&name));
    let mut legacy = pgtest::connect(&url).await;
    schema::apply_up_to(&mut legacy, 7)
        .await
        .expect("migrations 1-7 as the database owner");
    let err = schema::apply(&mut legacy).await.unwrap_err();
    let db_err = err.as_db_error().expect("a server error");
    assert!(
        db_err
            .message()
            .contains(&format!("role {name} is not a member of clicks_collector")),
        "{db_err:?}"
    );
    assert!(
        db_err
            .hint()
            .is_some_and(|h| h.contains(&format!("GRANT clicks_collector TO {name}"))),
        "{db_err:?}"
    );

    admin
        .batch_execute(&format!("GRANT clicks_collector TO {name}"))
        .await
        .unwrap();
    assert_eq!(schema::apply_up_to(&mut legacy, 8).await.unwrap(), [8]);
    let owner: String = legacy
        .query_one(
            "SELECT tableowner::text FROM pg_tables WHERE tablename = 'clicks'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, "clicks_collector");
    // A partition made later belongs to the group role too, not to the login that made it.
    legacy
        .batch_execute("SELECT ensure_click_partition((now() AT TIME ZONE 'UTC')::date + 10)")
        .await
        .unwrap();
    let owner: String = legacy
        .query_one(
            "SELECT tableowner::text FROM pg_tables
             WHERE tablename = 'clicks_p' || to_char((now() AT TIME ZONE 'UTC')::date + 10, 'YYYYMMDD')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owner, "clicks_collector");
    // And so does everything the later migrations make, whoever runs them. Before
    // PostgreSQL 15 the database's schema public is the bootstrap superuser's, which this
    // login may not close: migration 13 asks a superuser to, as an operator would.
    let version = schema::server_version(&legacy).await.unwrap();
    if version < 150_000 {
        let close = "GRANT USAGE, CREATE ON SCHEMA public TO clicks_collector;
                     REVOKE CREATE ON SCHEMA public FROM PUBLIC";
        cluster
            .connect(&name)
            .await
            .batch_execute(close)
            .await
            .unwrap();
    }
    schema::apply(&mut legacy).await.unwrap();
    let others: String = legacy
        .query_one(
            "SELECT coalesce(string_agg(name, ' '), '') FROM (
                 SELECT oid::regprocedure::text FROM pg_proc
                  WHERE pronamespace = 'public'::regnamespace
                    AND proowner <> 'clicks_collector'::regrole
                 UNION ALL
                 SELECT relname::text FROM pg_class
                  WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p', 'v')
                    AND relowner <> 'clicks_collector'::regrole) AS o(name)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        others, "",
        "owned by the login that migrated, not the group role"
    );
}

/// A database owned by a new login role `<prefix>_<pid>` in clicks_collector, as
/// `systemd/database.sql` makes the collector's: a superuser's session in it, and the login's.
async fn collectors_database(prefix: &str) -> (tokio_postgres::Client, tokio_postgres::Client) {
    let cluster = pgtest::cluster();
    // The group roles exist once any database of the cluster is migrated.
    let _ = pgtest::test_db().await;
    let admin = cluster.connect("postgres").await;
    let name = format!("{prefix}_{}", std::process::id());
    for sql in [
        format!("CREATE ROLE {name} LOGIN IN ROLE clicks_collector"),
        format!("CREATE DATABASE {name} OWNER {name}"),
    ] {
        admin.batch_execute(&sql).await.unwrap();
    }
    let login = pgtest::connect(&format!("{} user={name}", cluster.url(&name))).await;
    (cluster.connect(&name).await, login)
}

/// Migration 8 hands the schema's objects to clicks_collector, but not what an extension made
/// there: a collector that is no superuser may not take those from their owner, and stopped at
/// migration 8 for good on a database where someone had run `CREATE EXTENSION`.
#[tokio::test]
async fn migration_8_leaves_an_extensions_objects_to_their_owner() {
    let (superuser, mut collector) = collectors_database("ext").await;
    // Schema public closed as systemd/database.sql closes it: before PostgreSQL 15 migration
    // 13 would stop here otherwise (its own test).
    superuser
        .batch_execute(
            "GRANT USAGE, CREATE ON SCHEMA public TO clicks_collector;
             REVOKE CREATE ON SCHEMA public FROM PUBLIC;
             CREATE EXTENSION pgcrypto; CREATE EXTENSION pg_stat_statements",
        )
        .await
        .unwrap();
    schema::apply(&mut collector)
        .await
        .expect("every migration, the extensions' objects left alone");
    let owners: String = collector
        .query_one(
            "SELECT (SELECT proowner::regrole::text FROM pg_proc
                      WHERE oid = 'digest(text, text)'::regprocedure)
                 || ' ' || (SELECT relowner::regrole::text FROM pg_class
                             WHERE oid = 'pg_stat_statements'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(owners, "postgres postgres");
}

/// An older `database.sql` gave the redirector's login SELECT on every table the collector's
/// login made, by a default privilege. Migration 23 takes that back from the redirectors
/// (members of clicks_link_reader), on the tables already there and on the partitions made
/// later, and leaves links readable and another role's grant alone.
#[tokio::test]
async fn migration_23_takes_back_the_old_read_grants_of_the_redirector() {
    let (superuser, mut collector) = collectors_database("grants").await;
    let name = format!("grants_{}", std::process::id());
    let (redirector, reports) = (format!("{name}_r"), format!("{name}_reports"));
    superuser
        .batch_execute(&format!(
            "CREATE ROLE {redirector} LOGIN IN ROLE clicks_link_reader;
             CREATE ROLE {reports} LOGIN;
             GRANT USAGE, CREATE ON SCHEMA public TO clicks_collector;
             REVOKE CREATE ON SCHEMA public FROM PUBLIC;
             ALTER DEFAULT PRIVILEGES FOR ROLE {name} IN SCHEMA public
                 GRANT SELECT ON TABLES TO {redirector}, {reports}"
        ))
        .await
        .unwrap();
    let may_read = |role: &str, table: &str| {
        format!("SELECT has_table_privilege('{role}', '{table}', 'SELECT')")
    };
    let later_day = "clicks_p' || to_char((now() AT TIME ZONE 'UTC')::date + 10, 'YYYYMMDD') || '";
    let new_partition = "SELECT ensure_click_partition((now() AT TIME ZONE 'UTC')::date + 10)";
    schema::apply_up_to(&mut collector, 22).await.unwrap();
    let read = |sql: String| {
        let superuser = &superuser;
        async move {
            superuser
                .query_one(&sql, &[])
                .await
                .unwrap()
                .get::<_, bool>(0)
        }
    };
    assert!(
        read(may_read(&redirector, "click_totals")).await,
        "the old default privilege is not in place"
    );
    // From PostgreSQL 16 on, a member without INHERIT may not change its group's default
    // privileges: such a group's are left, not a migration that fails at every start.
    let version = schema::server_version(&collector).await.unwrap();
    if version >= 160_000 {
        let group = format!("{name}_group");
        superuser
            .batch_execute(&format!(
                "CREATE ROLE {group} NOLOGIN;
                 GRANT {group} TO {name} WITH INHERIT FALSE;
                 ALTER DEFAULT PRIVILEGES FOR ROLE {group} IN SCHEMA public
                     GRANT SELECT ON TABLES TO {redirector}"
            ))
            .await
            .unwrap();
    }

    let applied = schema::apply(&mut collector).await.unwrap();
    assert_eq!(applied, (23..=schema::LATEST).collect::<Vec<_>>());
    let made: bool = collector
        .query_one(new_partition, &[])
        .await
        .unwrap()
        .get(0);
    assert!(made, "the partition was there before the migration");
    let partition: String = collector
        .query_one(&format!("SELECT '{later_day}'"), &[])
        .await
        .unwrap()
        .get(0);
    for table in ["click_totals", "clicks", partition.as_str()] {
        assert!(
            !read(may_read(&redirector, table)).await,
            "the redirector may still read {table}"
        );
        assert!(
            read(may_read(&reports, table)).await,
            "another role's grant on {table} was taken"
        );
    }
    assert!(
        read(may_read(&redirector, "links")).await,
        "the redirector may no longer read links"
    );
}

/// Before PostgreSQL 15 schema public belongs to the bootstrap superuser and every role may
/// create objects in it, so could shadow a function the collector calls by name. A collector
/// whose login role owns the database (as `systemd/database.sql` makes it) may not revoke
/// that: it stops at migration 13 and says what to run; once run, the migration goes
/// through, and the collector's role still creates partitions. Recreated here on 15.
#[tokio::test]
async fn migration_13_on_14s_schema_public_tells_a_collector_that_cannot_revoke_what_to_run() {
    let (superuser, mut collector) = collectors_database("pg14").await;
    let name = format!("pg14_{}", std::process::id());
    superuser
        .batch_execute(
            "ALTER SCHEMA public OWNER TO postgres; GRANT CREATE ON SCHEMA public TO PUBLIC",
        )
        .await
        .unwrap();
    let public_may_create = "SELECT has_schema_privilege('public', 'public', 'CREATE')";

    schema::apply_up_to(&mut collector, 12)
        .await
        .expect("migrations 1-12 as the database owner");
    let err = schema::apply(&mut collector).await.unwrap_err();
    let db_err = err.as_db_error().expect("a server error");
    assert!(
        db_err.message().contains(&format!(
            "migration 13: every role may create objects in schema public (and so shadow \
             functions the collector calls), and {name} may not revoke that"
        )),
        "{db_err:?}"
    );
    let hint = db_err.hint().unwrap_or_default();
    let fix = hint
        .split_once("run: ")
        .and_then(|(_, rest)| rest.split_once("; then"))
        .map(|(statements, _)| statements)
        .unwrap_or_else(|| panic!("no statements in the hint: {db_err:?}"));
    assert!(
        fix.contains("REVOKE CREATE ON SCHEMA public FROM PUBLIC"),
        "{fix}"
    );
    let may: bool = superuser
        .query_one(public_may_create, &[])
        .await
        .unwrap()
        .get(0);
    assert!(may, "the failed migration changed nothing");

    // What the hint says, as a superuser.
    superuser.batch_execute(fix).await.unwrap();
    assert_eq!(schema::apply_up_to(&mut collector, 13).await.unwrap(), [13]);
    // And the later ones, by the same role.
    let later: Vec<i32> = schema::versions().into_iter().filter(|&v| v > 13).collect();
    assert_eq!(schema::apply(&mut collector).await.unwrap(), later);
    let may: bool = superuser
        .query_one(public_may_create, &[])
        .await
        .unwrap()
        .get(0);
    assert!(!may, "PUBLIC may still create in schema public");
    collector
        .batch_execute("SELECT ensure_click_partition((now() AT TIME ZONE 'UTC')::date + 10)")
        .await
        .expect("the collector's role creates partitions without PUBLIC's privilege");
}

/// A migrating role that may revoke (a superuser here, the database owner on PostgreSQL 15)
/// takes PUBLIC's CREATE on schema public itself; and every function of the schema searches
/// a fixed path whoever calls it, so that a caller's own path (or temporary tables) cannot
/// change what it runs.
#[tokio::test]
async fn migration_13_revokes_what_it_may_and_pins_every_functions_search_path() {
    let db = pgtest::cluster().fresh_database().await;
    let mut client = pgtest::connect(&db.url).await;
    client
        .batch_execute(
            "ALTER SCHEMA public OWNER TO postgres; GRANT CREATE ON SCHEMA public TO PUBLIC",
        )
        .await
        .unwrap();
    schema::apply(&mut client).await.unwrap();
    let row = client
        .query_one(
            "SELECT has_schema_privilege('public', 'public', 'CREATE'),
                    has_schema_privilege('clicks_collector', 'public', 'CREATE')",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, bool>(0), row.get::<_, bool>(1)),
        (false, true)
    );
    let unpinned = pgtest::strings(
        &client,
        "SELECT p.oid::regprocedure::text FROM pg_proc AS p
         WHERE p.pronamespace = 'public'::regnamespace
           AND NOT EXISTS (SELECT FROM unnest(p.proconfig) AS c WHERE c LIKE 'search_path=%')
         ORDER BY 1",
    )
    .await;
    assert!(
        unpinned.is_empty(),
        "functions without a search_path of their own: {unpinned:?}"
    );
}

/// Every column of the relations (tables, partitions, views) the migrations create in
/// `public`, as `relation.column type`, sorted.
async fn public_columns(client: &tokio_postgres::Client) -> Vec<String> {
    let sql = "
        SELECT c.relname || '.' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
        FROM pg_class AS c JOIN pg_attribute AS a ON a.attrelid = c.oid
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
          AND a.attnum > 0 AND NOT a.attisdropped
";
    let rows = client.query(sql, &[]).await.unwrap();
    let mut columns: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    columns.sort();
    columns
}

/// The columns of `columns` named like a network address or a user agent, or typed as an
/// address.
fn personal(columns: &[String]) -> Vec<&String> {
    const WORDS: [&str; 10] = [
        "ip", "ipv4", "ipv6", "ips", "inet", "addr", "address", "remote", "ua", "mac",
    ];
    const ANYWHERE: [&str; 5] = ["addr", "user_agent", "useragent", "remote", "client_ip"];
    const TYPES: [&str; 4] = [" inet", " cidr", " macaddr", " macaddr8"];
    columns
        .iter()
        .filter(|line| {
            let (qualified, ty) = line.split_at(line.find(' ').unwrap_or(line.len()));
            let name = qualified
                .rsplit('.')
                .next()
                .unwrap_or(qualified)
                .to_lowercase();
            name.split('_').any(|word| WORDS.contains(&word))
                || ANYWHERE.iter().any(|part| name.contains(part))
                || TYPES.contains(&ty)
        })
        .collect()
}

/// No personal data is kept (issue 29): no column of `clicks`, of `clicks_set_aside`, of the
/// breakdowns or of any relation the migrations create is named like an address or a user
/// agent, or typed as an address; and the columns of the relations that hold clicks are
/// exactly those expected, so that a new one fails here and is looked at.
#[tokio::test]
async fn no_column_holds_an_address_or_a_user_agent() {
    let db = pgtest::test_db().await;
    let client = pgtest::connect(&db.url).await;
    let columns = public_columns(&client).await;
    assert!(columns.len() > 30, "{columns:#?}");
    assert_eq!(personal(&columns), Vec::<&String>::new());

    let of = |relation: &str| -> Vec<&str> {
        let prefix = format!("{relation}.");
        columns
            .iter()
            .filter_map(|line| line.strip_prefix(&prefix))
            .collect()
    };
    let expected: [(&str, &[&str]); 5] = [
        (
            "clicks",
            &["clicked_at timestamp with time zone", "code text"],
        ),
        (
            "clicks_set_aside",
            &[
                "clicked_at timestamp with time zone",
                "code text",
                "error text",
                "reason text",
                "set_aside_at timestamp with time zone",
            ],
        ),
        (
            "click_breakdown_counts",
            &[
                "clicks bigint",
                "code text",
                "day date",
                "dimension text",
                "value text",
            ],
        ),
        (
            "click_breakdown_lists",
            &[
                "batch bigint",
                "code_list text",
                "count_list text",
                "day date",
                "dimension text",
                "entries integer",
                "value_list text",
                "writer bigint",
                "written_at timestamp with time zone",
            ],
        ),
        (
            "click_breakdown",
            &[
                "clicks bigint",
                "code text",
                "day date",
                "dimension text",
                "value text",
            ],
        ),
    ];
    for (relation, want) in expected {
        assert_eq!(of(relation), want, "the columns of {relation}");
    }
    // Each day partition has the columns of clicks, no more.
    let partition = columns
        .iter()
        .find_map(|l| l.strip_prefix("clicks_p").and_then(|l| l.split_once('.')))
        .map(|(day, _)| format!("clicks_p{day}"))
        .expect("a day partition");
    assert_eq!(of(&partition), of("clicks"), "{partition}");

    // The check sees what it is there for: a column named like an address or typed as one.
    client
        .batch_execute(
            "ALTER TABLE click_breakdown_lists ADD COLUMN remote_host text;
             ALTER TABLE clicks_set_aside ADD COLUMN origin inet;
             ALTER TABLE links ADD COLUMN ua text;",
        )
        .await
        .unwrap();
    let columns = public_columns(&client).await;
    let found: Vec<&str> = personal(&columns).into_iter().map(String::as_str).collect();
    assert_eq!(
        found,
        [
            "click_breakdown_lists.remote_host text",
            "clicks_set_aside.origin inet",
            "links.ua text"
        ]
    );
}

/// Migration 18's index built beforehand by an operator (`CREATE INDEX CONCURRENTLY`, as
/// docs/schema.md says) whose build failed: the index it left (invalid) is built again, rather
/// than taken for done while the day index goes.
#[tokio::test]
async fn migration_18_builds_again_an_index_left_invalid() {
    let db = pgtest::cluster().fresh_database().await;
    let mut client = pgtest::connect(&db.url).await;
    schema::apply_up_to(&mut client, 17).await.unwrap();
    // What a failed CONCURRENTLY build leaves: the index, marked invalid.
    client
        .batch_execute(
            "CREATE INDEX click_breakdown_counts_expiring ON click_breakdown_counts (day)
                 WHERE dimension <> 'agent';
             UPDATE pg_index SET indisvalid = false
              WHERE indexrelid = 'click_breakdown_counts_expiring'::regclass",
        )
        .await
        .unwrap();
    assert_eq!(schema::apply_up_to(&mut client, 18).await.unwrap(), [18]);
    let valid = "SELECT indisvalid FROM pg_index
                  WHERE indexrelid = 'click_breakdown_counts_expiring'::regclass";
    let valid: bool = client.query_one(valid, &[]).await.unwrap().get(0);
    assert!(valid, "built again");
}

/// A server older than the oldest supported is refused before any migration, with its
/// version and what to do; a supported one is migrated, and refused by a bar set past its own
/// version. `scripts/test-server-versions` runs this on PostgreSQL 13 too.
#[tokio::test]
async fn migrations_refuse_a_server_older_than_the_oldest_supported_and_no_other() {
    let db = pgtest::cluster().fresh_database().await;
    let mut client = pgtest::connect(&db.url).await;
    let version = schema::server_version(&client).await.unwrap();
    let refused = |e: &tokio_postgres::Error, bar: i32| {
        let said = shared::db::describe(e);
        let major = bar / 10_000;
        assert!(said.contains(&format!("is older than {major}")), "{said}");
        assert!(said.contains("pg_upgrade"), "{said}");
    };
    let applied = schema::apply(&mut client).await;
    if version < schema::OLDEST_SERVER {
        refused(
            &applied.expect_err("an old server refused"),
            schema::OLDEST_SERVER,
        );
        let made = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'";
        let made: i64 = client.query_one(made, &[]).await.unwrap().get(0);
        assert_eq!(made, 0, "no migration applied");
        return;
    }
    assert_eq!(applied.unwrap(), schema::versions());
    schema::refuse_older_than(&client, version).await.unwrap();
    let next_major = (version / 10_000 + 1) * 10_000;
    let e = schema::refuse_older_than(&client, next_major).await;
    refused(
        &e.expect_err("a bar past this server refuses it"),
        next_major,
    );
}

/// A day's partition holds that UTC day whatever the database's `DateStyle` and `TimeZone`:
/// its bounds were written as the session renders a time, and under `SQL, DMY` in Dublin's
/// summer that is "IST", which PostgreSQL before 18 reads as Israel's: every day an hour early, and its
/// last hour's clicks refused by the partition a batch writes to.
#[tokio::test]
async fn a_days_partition_holds_the_utc_day_whatever_the_sessions_date_style() {
    let db = pgtest::cluster().fresh_database().await;
    let mut client = pgtest::connect(&db.url).await;
    schema::apply(&mut client).await.unwrap();
    let local = "SET DateStyle = 'SQL, DMY'; SET TimeZone = 'Europe/Dublin';
                 SELECT ensure_click_partition(date '2030-07-01')";
    client.batch_execute(local).await.unwrap();
    client
        .batch_execute("SET DateStyle = ISO; SET TimeZone = UTC")
        .await
        .unwrap();
    let bound = "SELECT pg_get_expr(relpartbound, oid) FROM pg_class
                 WHERE relname = 'clicks_p20300701'";
    let bound = pgtest::strings(&client, bound).await;
    assert_eq!(
        bound,
        ["FOR VALUES FROM ('2030-07-01 00:00:00+00') TO ('2030-07-02 00:00:00+00')"]
    );
}

/// Days made before migration 24 under a `DateStyle` and `TimeZone` that shifted them (3.5
/// hours late under Kolkata's "IST", read as Israel's; an hour early under Dublin's) meet the
/// days made after it where they end: the first day made in UTC would otherwise overlap the
/// last one shifted late (the attach refused at every round) or leave an hour no partition
/// holds. Each day after the last shifted one is the UTC day again.
#[tokio::test]
async fn days_made_after_days_shifted_by_the_date_style_leave_no_gap_nor_overlap() {
    for zone in ["Asia/Kolkata", "Europe/Dublin"] {
        let db = pgtest::cluster().fresh_database().await;
        let mut client = pgtest::connect(&db.url).await;
        schema::apply_up_to(&mut client, 23).await.unwrap();
        let local = format!("SET DateStyle = 'SQL, DMY'; SET TimeZone = '{zone}'");
        client.batch_execute(&local).await.unwrap();
        let make = |day: &str| format!("SELECT ensure_click_partition(date '{day}')");
        for day in ["2030-07-01", "2030-07-02"] {
            client.batch_execute(&make(day)).await.unwrap();
        }
        schema::apply(&mut client).await.unwrap();
        client.batch_execute(&local).await.unwrap();
        for day in ["2030-07-03", "2030-07-04"] {
            client.batch_execute(&make(day)).await.unwrap();
        }
        client
            .batch_execute("SET DateStyle = ISO; SET TimeZone = UTC")
            .await
            .unwrap();
        let bounds = pgtest::strings(
            &client,
            "SELECT pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits AS i
             JOIN pg_class AS c ON c.oid = i.inhrelid
             WHERE i.inhparent = 'clicks'::regclass AND c.relname >= 'clicks_p20300701'
             ORDER BY c.relname",
        )
        .await;
        let quoted = |b: &String| -> Vec<String> {
            b.split('\'')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect()
        };
        let ends: Vec<Vec<String>> = bounds.iter().map(quoted).collect();
        // From PostgreSQL 18 on, an abbreviation is read as the session's zone has it first:
        // the days before were not shifted there, and the rest still holds.
        if schema::server_version(&client).await.unwrap() < 180_000 {
            let shifted_end = &ends[1][1];
            assert_ne!(
                shifted_end, "2030-07-03 00:00:00+00",
                "{zone}: shifted before"
            );
        }
        for pair in ends.windows(2) {
            assert_eq!(pair[0][1], pair[1][0], "{zone}: {bounds:?}");
        }
        assert_eq!(
            ends[3],
            ["2030-07-04 00:00:00+00", "2030-07-05 00:00:00+00"],
            "{zone}: {bounds:?}"
        );
    }
}

/// A day whose neighbours hold the whole of it already (days shifted by more than half a
/// day, one of them made while this one's name was taken) is not made: no range is left for
/// it, and an empty or overlapping one would fail every later day made in the same round.
#[tokio::test]
async fn a_day_its_neighbours_hold_already_is_not_made() {
    let db = pgtest::cluster().fresh_database().await;
    let mut client = pgtest::connect(&db.url).await;
    schema::apply(&mut client).await.unwrap();
    let neighbours = "
        CREATE TABLE clicks_p20300701 PARTITION OF clicks
            FOR VALUES FROM ('2030-07-01Z') TO ('2030-07-02 14:00Z');
        CREATE TABLE clicks_p20300703 PARTITION OF clicks
            FOR VALUES FROM ('2030-07-02 14:00Z') TO ('2030-07-04Z')";
    client.batch_execute(neighbours).await.unwrap();
    let made = "SELECT ensure_click_partition(date '2030-07-02')";
    let made: bool = client.query_one(made, &[]).await.unwrap().get(0);
    assert!(!made);
    let table = "SELECT to_regclass('clicks_p20300702') IS NULL";
    assert!(client
        .query_one(table, &[])
        .await
        .unwrap()
        .get::<_, bool>(0));
}
