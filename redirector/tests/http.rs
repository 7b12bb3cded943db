//! The redirect endpoint of the real binary: status codes, headers, what counts as a click,
//! and the not-ready state before the first link table load.

use std::os::unix::net::UnixDatagram;

use hyper::Method;
use testkit::redirector::{add_link, fixture, load::Load, redirector, LIMIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn answers_redirects_not_found_and_wrong_methods() {
    let f = fixture(&[("home", "https://example.com/home?x=1")]).await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;

    let response = testkit::http::request(r.http, Method::GET, "/home")
        .await
        .expect("an answer");
    assert_eq!(response.status(), 302);
    assert_eq!(
        response.headers()["location"],
        "https://example.com/home?x=1"
    );
    assert_eq!(response.headers()["cache-control"], "no-store");
    let head = testkit::http::request(r.http, Method::HEAD, "/home")
        .await
        .expect("an answer");
    assert_eq!(head.status(), 302);
    assert_eq!(head.headers()["location"], "https://example.com/home?x=1");
    for path in [
        "/nope",
        "/",
        "/bad%20code",
        "/home/more",
        &format!("/{}", "a".repeat(65)),
    ] {
        let response = testkit::http::request(r.http, Method::GET, path)
            .await
            .expect("an answer");
        assert_eq!(response.status(), 404, "GET {path}");
        // Not kept by a cache in front: the code may be a link a moment later.
        assert_eq!(
            response.headers()["cache-control"],
            "no-store",
            "GET {path}"
        );
    }
    for method in [Method::POST, Method::PUT, Method::DELETE] {
        let response = testkit::http::request(r.http, method.clone(), "/home")
            .await
            .expect("an answer");
        assert_eq!(response.status(), 405, "{method} /home");
        // RFC 9110, 15.5.6: a 405 says which methods the resource takes.
        assert_eq!(response.headers()["allow"], "GET, HEAD", "{method} /home");
    }

    assert_eq!(r.metric("redirector_redirects_total").await, 1.0);
    assert_eq!(r.metric("redirector_clicks_queued_total").await, 1.0);
    assert_eq!(r.metric("redirector_head_redirects_total").await, 1.0);
    assert_eq!(r.metric("redirector_not_found_total").await, 5.0);
    assert_eq!(r.metric("redirector_method_not_allowed_total").await, 3.0);
    assert_eq!(r.metric("redirector_links").await, 1.0);
}

#[tokio::test]
async fn head_requests_and_unknown_codes_queue_no_clicks_under_load() {
    let f = fixture(&[("known", "https://example.com/")]).await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;
    let head = Load::get(r.http, "/known")
        .method(Method::HEAD)
        .run(1_000)
        .await;
    let unknown = Load::get(r.http, "/unknown").run(1_000).await;
    assert_eq!(head.count(302), 1_000, "{head:?}");
    assert_eq!(unknown.count(404), 1_000, "{unknown:?}");
    assert_eq!(r.metric("redirector_clicks_queued_total").await, 0.0);
    assert_eq!(r.metric("redirector_redirects_total").await, 0.0);
}

/// A request head over 16 KiB is refused before routing, and counted; one of 12 KB (a
/// browser's, carrying the cookies of a parent domain's analytics) is served; a request that
/// is not HTTP is refused and counted too, and HTTP/2 without asking (a proxy told to speak
/// h2c to its backends) under a reason of its own.
#[tokio::test]
async fn a_request_head_over_the_limit_is_refused_and_counted() {
    let f = fixture(&[("known", "https://example.com/")]).await;
    let r = redirector(&f.db.url, &f.socket, &[]).await;
    r.ready().await;
    let cookies = format!("_ga={}", "a".repeat(12_000));
    let served =
        testkit::http::request_with(r.http, Method::GET, "/known", &[("cookie", &cookies)])
            .await
            .expect("an answer");
    assert_eq!(served.status(), 302, "a 12 kB head is served");
    let long = format!("/{}", "a".repeat(20_000));
    let status = testkit::http::request(r.http, Method::GET, &long)
        .await
        .expect("an answer")
        .status();
    assert_eq!(
        status, 431,
        "a 20 kB request line is refused before routing"
    );
    assert_eq!(r.metric("redirector_not_found_total").await, 0.0);
    let too_large = r#"redirector_connections_closed_total{reason="head_too_large"}"#;
    r.await_metric(too_large, 1.0).await;

    let mut stream = tokio::net::TcpStream::connect(r.http).await.unwrap();
    stream.write_all(b"NOT HTTP AT ALL\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
    let bad = r#"redirector_connections_closed_total{reason="bad_request"}"#;
    r.await_metric(bad, 1.0).await;
    assert_eq!(r.metric(too_large).await, 1.0);

    let mut stream = tokio::net::TcpStream::connect(r.http).await.unwrap();
    stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // Until the server closes it.
    stream.read_to_end(&mut Vec::new()).await.unwrap();
    let http2 = r#"redirector_connections_closed_total{reason="http2"}"#;
    r.await_metric(http2, 1.0).await;
    assert_eq!(r.metric(bad).await, 1.0, "not counted as garbage too");
}

#[tokio::test]
async fn until_the_first_load_answers_503_is_not_healthy_and_not_ready_for_systemd() {
    // A database that does not exist yet: the link table cannot load until it is created.
    let cluster = testkit::pgtest::cluster();
    let name = format!("late_{}", std::process::id());
    let dir = tempfile::tempdir().unwrap();
    let notify = UnixDatagram::bind(dir.path().join("notify.sock")).unwrap();
    let mut cmd = testkit::redirector::redirector_command(
        &cluster.url(&name),
        &dir.path().join("c.sock"),
        &[],
    );
    cmd.env("NOTIFY_SOCKET", dir.path().join("notify.sock"));
    let mut r = testkit::redirector::start_redirector(cmd).await;

    let response = testkit::http::request(r.http, Method::GET, "/soon")
        .await
        .expect("an answer");
    assert_eq!(response.status(), 503);
    assert_eq!(response.headers()["retry-after"], "1");
    assert_eq!(response.headers()["cache-control"], "no-store");
    let (status, body) = testkit::http::get(r.admin, "/healthz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    testkit::eventually("a failed link load counted", LIMIT, || async {
        (r.metric("redirector_link_load_errors_total").await >= 1.0).then_some(())
    })
    .await;
    assert_eq!(
        notifications(&notify),
        Vec::<String>::new(),
        "no READY=1 before the first load"
    );

    let admin = cluster.connect("postgres").await;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let mut client = cluster.connect(&name).await;
    schema::apply(&mut client).await.unwrap();
    add_link(&client, "soon", "https://example.com/soon").await;
    r.ready().await;
    // The first load may come between the schema and the link: the link then follows.
    testkit::eventually("/soon redirected", LIMIT, || async {
        let response = testkit::http::request(r.http, Method::GET, "/soon")
            .await
            .expect("an answer");
        (response.status() == 302).then_some(())
    })
    .await;
    testkit::eventually("READY=1", LIMIT, || async {
        (notifications(&notify) == ["READY=1"]).then_some(())
    })
    .await;

    r.service.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(r.service.wait_exit(LIMIT).await.success());
    assert_eq!(notifications(&notify), ["STOPPING=1"]);
}

/// The sd_notify messages received since the last call.
fn notifications(socket: &UnixDatagram) -> Vec<String> {
    socket.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 256];
    let mut got = Vec::new();
    while let Ok(n) = socket.recv(&mut buf) {
        got.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    got
}
