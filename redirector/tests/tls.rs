//! TLS to PostgreSQL (`sslmode` in `DATABASE_URL`) and one role per process, against real
//! servers on loopback TCP: one with TLS (a CA and a certificate for `localhost` and
//! 127.0.0.1, made at start), one without.

use testkit::http::request;
use testkit::pgtest::{cluster, tcp_cluster, tls_cluster};
use testkit::redirector::*;

/// Connects with `url` through `shared::db`, as both services do.
async fn try_connect(url: &str) -> Result<tokio_postgres::Client, String> {
    let config: shared::db::Config = url.parse().map_err(|e| format!("{e}"))?;
    shared::db::connect(&config)
        .await
        .map_err(|e| shared::db::describe(&e))
}

/// The error connecting with `url` gives; panics saying `why` if it connects.
async fn refused(url: &str, why: &str) -> String {
    match try_connect(url).await {
        Ok(_) => panic!("{why}: {url}"),
        Err(e) => e,
    }
}

/// Whether the session of `client` is encrypted, as the server sees it.
async fn encrypted(client: &tokio_postgres::Client) -> bool {
    scalar(
        client,
        "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
    )
    .await
}

/// A key=value URL for the TLS cluster's `postgres` database that names the server `host`
/// (what the certificate is checked against) while connecting to 127.0.0.1.
fn named(host: &str, tail: &str) -> String {
    let port = tls_cluster().port().expect("a TCP cluster");
    format!("host={host} hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres {tail}")
}

fn ca() -> String {
    tls_cluster()
        .ca_file()
        .expect("a TLS cluster")
        .display()
        .to_string()
}

fn other_ca() -> String {
    let path = tls_cluster().other_ca_file().expect("a TLS cluster");
    path.display().to_string()
}

#[tokio::test]
async fn require_and_prefer_encrypt_and_disable_does_not() {
    let base = tls_cluster().url("postgres");
    for (mode, tls) in [("require", true), ("prefer", true), ("disable", false)] {
        let client = try_connect(&format!("{base} sslmode={mode}"))
            .await
            .unwrap_or_else(|e| panic!("sslmode={mode}: {e}"));
        assert_eq!(encrypted(&client).await, tls, "sslmode={mode}");
    }
    // libpq's default is prefer: TLS when offered.
    let client = try_connect(&base).await.expect("no sslmode");
    assert!(encrypted(&client).await, "the default must be prefer");
    // An address without a name: checked against the address (the certificate has 127.0.0.1).
    let port = tls_cluster().port().unwrap();
    let addr_only = format!("hostaddr=127.0.0.1 port={port} user=postgres dbname=postgres");
    let verified = format!("{addr_only} sslmode=verify-full sslrootcert={}", ca());
    for url in [addr_only.clone(), verified] {
        let client = try_connect(&url)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(encrypted(&client).await, "{url}");
    }
    // The URL form says the same.
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres?sslmode=require");
    let client = try_connect(&url).await.expect("URL form");
    assert!(encrypted(&client).await);
}

#[tokio::test]
async fn verify_full_checks_the_chain_and_the_host_name() {
    let client = try_connect(&named(
        "localhost",
        &format!("sslmode=verify-full sslrootcert={}", ca()),
    ))
    .await
    .expect("verify-full with the right CA and name");
    assert!(encrypted(&client).await);

    let wrong_name = refused(
        &named(
            "db.invalid",
            &format!("sslmode=verify-full sslrootcert={}", ca()),
        ),
        "verify-full must refuse a certificate for another name",
    )
    .await;
    assert!(
        wrong_name.contains("not for this host name") && wrong_name.contains("verify-full"),
        "{wrong_name}"
    );

    let wrong_ca = refused(
        &named(
            "localhost",
            &format!("sslmode=verify-full sslrootcert={}", other_ca()),
        ),
        "verify-full must refuse a certificate of another CA",
    )
    .await;
    assert!(
        wrong_ca.contains("not signed by a CA in sslrootcert"),
        "{wrong_ca}"
    );
}

#[tokio::test]
async fn verify_ca_checks_the_chain_only_and_require_with_a_root_cert_checks_it_too() {
    let client = try_connect(&named(
        "db.invalid",
        &format!("sslmode=verify-ca sslrootcert={}", ca()),
    ))
    .await
    .expect("verify-ca does not check the name");
    assert!(encrypted(&client).await);
    for mode in ["verify-ca", "require"] {
        let err = refused(
            &named(
                "localhost",
                &format!("sslmode={mode} sslrootcert={}", other_ca()),
            ),
            &format!("sslmode={mode} with a wrong sslrootcert must fail"),
        )
        .await;
        assert!(err.contains("not signed by a CA in sslrootcert"), "{err}");
    }
}

#[tokio::test]
async fn require_against_a_server_without_tls_fails_clearly() {
    let base = tcp_cluster().url("postgres");
    let err = refused(
        &format!("{base} sslmode=require"),
        "require must not fall back to plain",
    )
    .await;
    assert!(err.contains("server does not support TLS"), "{err}");
    let client = try_connect(&format!("{base} sslmode=prefer"))
        .await
        .expect("prefer falls back to plain");
    assert!(!encrypted(&client).await);
}

#[tokio::test]
async fn bad_tls_settings_are_refused_before_connecting() {
    let base = tls_cluster().url("postgres");
    let err = refused(&format!("{base} sslmode=verify"), "must be refused").await;
    assert!(err.contains("sslmode=\"verify\""), "{err}");
    let err = refused(&format!("{base} sslmode=verify-full"), "must be refused").await;
    assert!(err.contains("needs sslrootcert"), "{err}");
    let err = refused(
        &format!("{base} sslmode=require sslrootcert=/nonexistent/ca.pem"),
        "must be refused",
    )
    .await;
    assert!(err.contains("/nonexistent/ca.pem"), "{err}");
}

#[tokio::test]
async fn unix_sockets_never_use_tls() {
    // libpq ignores sslmode over a Unix socket; so do we (the server would refuse TLS there).
    let client = try_connect(&format!("{} sslmode=require", cluster().url("postgres")))
        .await
        .expect("require over a Unix socket connects, unencrypted");
    assert!(!encrypted(&client).await);
}

/// Login roles for one test: members of the group roles migration 8 made.
async fn login_roles(admin: &tokio_postgres::Client, db: &str) -> (String, String) {
    let collector = format!("{db}_collector");
    let redirector = format!("{db}_redirector");
    admin
        .batch_execute(&format!(
            "CREATE ROLE {collector} LOGIN IN ROLE clicks_collector; \
             CREATE ROLE {redirector} LOGIN IN ROLE clicks_link_reader"
        ))
        .await
        .unwrap_or_else(|e| panic!("creating login roles: {}", shared::db::describe(&e)));
    (collector, redirector)
}

/// The real binaries over TLS (`sslmode=require`), each under its own role: clicks land, links
/// load, both services' sessions are encrypted, and the redirector's role cannot read clicks.
#[tokio::test]
async fn pipeline_runs_over_tls_with_a_role_per_process() {
    let db = testkit::pgtest::test_db_on(tls_cluster()).await;
    let admin = testkit::pgtest::connect(&db.url).await;
    add_link(&admin, "tls", "https://example.com/tls").await;
    let (collector_role, redirector_role) = login_roles(&admin, &db.name).await;
    let url = |role: &str| {
        let port = tls_cluster().port().unwrap();
        format!(
            "host=127.0.0.1 port={port} dbname={} user={role} sslmode=require",
            db.name
        )
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("collector.sock");
    let _collector = collector(&url(&collector_role), &socket).await;
    let redirector = redirector(&url(&redirector_role), &socket, &[]).await;
    redirector.ready().await;

    const N: u64 = 50;
    for _ in 0..N {
        let response = request(redirector.http, hyper::Method::GET, "/tls")
            .await
            .expect("an answer");
        assert_eq!(response.status(), 302);
    }
    await_rows(&admin, Some("tls"), N).await;

    // Every session of each role is encrypted, and each role has one at least.
    for role in [&collector_role, &redirector_role] {
        let (all, tls): (i64, i64) = {
            let row = admin
                .query_one(
                    "SELECT count(*), count(*) FILTER (WHERE s.ssl) \
                     FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
                     WHERE a.usename = $1",
                    &[role],
                )
                .await
                .expect("pg_stat_ssl");
            (row.get(0), row.get(1))
        };
        assert!(all > 0, "no session of {role}");
        assert_eq!(all, tls, "sessions of {role} not over TLS");
    }

    // The redirector's role reads links and nothing else.
    let reader = try_connect(&url(&redirector_role)).await.expect("reader");
    let n: i64 = scalar(&reader, "SELECT count(*) FROM links").await;
    assert_eq!(n, 1);
    let err = reader
        .query_one("SELECT count(*) FROM clicks", &[])
        .await
        .expect_err("the link reader must not read clicks");
    assert_eq!(
        err.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{}",
        shared::db::describe(&err)
    );
}
