//! The monitoring files (`monitoring/`) against a real Prometheus, Debian's `prometheus`
//! package: it scrapes the real redirector and collector while they carry traffic and evaluates
//! `monitoring/alerts.yml`; through its HTTP API, every dashboard panel's query and the instance
//! variable's must parse and return data, every series an alert expression selects must exist,
//! every rule must evaluate cleanly, and no alert may be pending or firing while the pipeline is
//! healthy. Without Prometheus installed the test fails (CI installs it), it does not skip.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use testkit::redirector::{collector_with, fixture, load::Load, redirector, LIMIT};
use testkit::{eventually, Service};

/// The one host both services run on: each series' instance, the shipped jobs' relabelling
/// having left the port out.
const HOST: &str = "127.0.0.1";

/// The monitoring files, at the repository's root.
fn monitoring() -> PathBuf {
    testkit::repo().join("monitoring")
}

#[tokio::test]
async fn every_panel_and_alert_has_data_and_nothing_fires_under_healthy_load() {
    let binary = prometheus_binary();
    let f = fixture(&[("watched", "https://example.com/watched")]).await;
    // A fold every second, so the compaction panels have folds to show.
    let (_collector, collector_admin) =
        collector_with(&f.db.url, &f.socket, &["--compact-interval", "1s"]).await;
    // This machine's cores are shared with builds and other tests: a commit can come later than
    // the default 2 s --ack-timeout, and the resend that follows is what AcknowledgementsLagging
    // counts. The pipeline is still healthy then; the test is about the rules, not that race.
    let r = redirector(&f.db.url, &f.socket, &["--ack-timeout", "10s"]).await;
    r.ready().await;

    let mut load = Load::get(r.http, "/watched");
    load.connections = 4;
    let running = load.start();
    let prometheus = Prometheus::start(&binary, r.admin, collector_admin).await;

    // Both targets scraped at least three times (a rate needs two samples of its target, and
    // the targets' scrapes are not in step), traffic at both, a fold done, every rule evaluated.
    prometheus
        .await_data("both targets up", "sum(up) == 2")
        .await;
    prometheus
        .await_data(
            "three scrapes of each target",
            "min(count_over_time(up[1m])) >= 3",
        )
        .await;
    prometheus
        .await_data(
            "redirects at a rate",
            "rate(redirector_redirects_total[1m]) > 0",
        )
        .await;
    prometheus
        .await_data(
            "clicks written at a rate",
            "rate(collector_clicks_written_total[1m]) > 0",
        )
        .await;
    prometheus
        .await_data("a fold", "collector_compactions_total > 0")
        .await;
    let rules = eventually("every rule evaluated", LIMIT, || async {
        let rules = prometheus.alerting_rules().await;
        rules
            .iter()
            .all(|rule| rule["health"] != "unknown")
            .then_some(rules)
    })
    .await;

    let mut failures = Vec::new();

    // The dashboard: every panel's queries, with Grafana's variables as Grafana would fill them
    // for the one host (its instance, which selects its redirector and collector alike), and
    // the instance variable's own query.
    let dashboard: Value = serde_json::from_str(&read(&monitoring().join("dashboard.json")))
        .expect("dashboard.json is JSON");
    let mut queries = 0;
    for panel in panels(&dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a target has an expr");
            // Per host when there are several: every query follows the instance variable, on the
            // data source the datasource variable picks.
            if !expr.contains(r#"instance=~"$instance""#) {
                failures.push(format!(
                    "panel {:?}: {expr}: ignores $instance",
                    panel["title"]
                ));
            }
            if target["datasource"]["uid"] != "${datasource}" {
                failures.push(format!(
                    "panel {:?}: not on ${{datasource}}",
                    panel["title"]
                ));
            }
            let promql = expr
                .replace("$instance", HOST)
                .replace("$__rate_interval", "1m")
                .replace("$__range", "5m");
            queries += 1;
            if let Err(why) = prometheus.query_with_data(&promql).await {
                failures.push(format!("panel {:?}: {expr}: {why}", panel["title"]));
            }
        }
    }
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    assert!(
        variables
            .iter()
            .any(|v| v["name"] == "datasource" && v["query"] == "prometheus"),
        "a Prometheus datasource variable"
    );
    let instance = variables
        .iter()
        .find(|v| v["name"] == "instance")
        .expect("an instance variable");
    assert_eq!(instance["multi"], true, "instance is multi-select");
    let definition = instance["definition"].as_str().expect("its query");
    let selector = definition
        .strip_prefix("label_values(")
        .and_then(|rest| rest.strip_suffix(", instance)"))
        .unwrap_or_else(|| panic!("instance variable: {definition}"));
    match prometheus.query_with_data(selector).await {
        Ok(series) => {
            let seen: BTreeSet<_> = series
                .iter()
                .filter_map(|s| s["metric"]["instance"].as_str())
                .collect();
            let want = BTreeSet::from([HOST]);
            if series.len() != 2 || seen != want {
                failures.push(format!(
                    "instance variable {definition}: {seen:?}, not {want:?}"
                ));
            }
        }
        Err(why) => failures.push(format!("instance variable {definition}: {why}")),
    }

    // The rules: all of alerts.yml loaded, each evaluated cleanly and quiet, and every series
    // its expression selects present (an expression over a misspelt metric is valid PromQL,
    // and silently never fires).
    let defined = read(&monitoring().join("alerts.yml"))
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    assert_eq!(rules.len(), defined, "alerting rules loaded");
    let mut selected = 0;
    for rule in &rules {
        let name = &rule["name"];
        if rule["health"] != "ok" {
            failures.push(format!(
                "rule {name}: health {}: {}",
                rule["health"], rule["lastError"]
            ));
        }
        if rule["state"] != "inactive" {
            failures.push(format!(
                "rule {name} is {} under healthy load",
                rule["state"]
            ));
        }
        let expr = rule["query"].as_str().expect("a rule has a query");
        for selector in selectors(expr) {
            selected += 1;
            if let Err(why) = prometheus
                .query_with_data(&format!("count({selector})"))
                .await
            {
                failures.push(format!("rule {name}: {selector}: {why}"));
            }
        }
    }
    let alerts = prometheus.api("/api/v1/alerts").await;
    let active = alerts["data"]["alerts"]
        .as_array()
        .unwrap_or_else(|| panic!("/api/v1/alerts without data.alerts: {alerts}"));
    if !active.is_empty() {
        failures.push(format!(
            "alerts pending or firing under healthy load: {active:#?}"
        ));
    }

    load.stop();
    let report = running.await.expect("load task");
    eprintln!(
        "{queries} dashboard queries, {} alerting rules selecting {selected} series, \
         {} redirects during the test",
        rules.len(),
        report.count(302)
    );
    assert!(
        failures.is_empty(),
        "{} problems:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(report.errors, 0, "{report:?}");
    assert!(queries > 0 && selected > 0);
}

/// The Prometheus server binary, or a failure that says how to install it.
fn prometheus_binary() -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    on_path
        .into_iter()
        .map(|dir| dir.join("prometheus"))
        .chain([PathBuf::from("/usr/bin/prometheus")])
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "Prometheus is not installed: this test runs the real server against \
                 monitoring/. Install it: `apt-get install prometheus` (Debian; it brings \
                 /usr/bin/prometheus and promtool). .ci/run installs it."
            )
        })
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Every panel of a dashboard, inside collapsed rows too.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            out.extend(panel["panels"].as_array().into_iter().flatten());
        } else {
            out.push(panel);
        }
    }
    out
}

/// The series selectors of the pipeline's metrics (and `up`) in a PromQL expression, with their
/// label matchers: `up{job="collector"}`, `redirector_send_errors_total{kind!="queue_full"}`;
/// a selector without a name (`{__name__=~"collector_.*"}`) whole; and a metric of ours named
/// in a string (`label_replace`'s), on its own.
fn selectors(expr: &str) -> Vec<String> {
    let b = expr.as_bytes();
    let skip_string = |mut i: usize| {
        let quote = b[i];
        i += 1;
        while i < b.len() && b[i] != quote {
            i += if b[i] == b'\\' { 2 } else { 1 };
        }
        i + 1
    };
    // From a `{` to past its `}`.
    let skip_matchers = |mut i: usize| {
        while i < b.len() && b[i] != b'}' {
            i = if b[i] == b'"' { skip_string(i) } else { i + 1 };
        }
        i + 1
    };
    let ours = |name: &str| {
        name == "up" || name.starts_with("redirector_") || name.starts_with("collector_")
    };
    let name_byte = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => {
                let start = i;
                i = skip_string(i);
                let inner = expr.get(start + 1..i - 1).unwrap_or_default();
                if ours(inner) && inner.bytes().all(name_byte) {
                    out.push(inner.to_owned());
                }
            }
            b'{' => {
                let start = i;
                i = skip_matchers(i);
                out.push(expr[start..i.min(b.len())].to_owned());
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let start = i;
                while i < b.len() && name_byte(b[i]) {
                    i += 1;
                }
                let name = &expr[start..i];
                if ours(name) {
                    if b.get(i) == Some(&b'{') {
                        i = skip_matchers(i);
                    }
                    out.push(expr[start..i.min(b.len())].to_owned());
                } else if b.get(i) == Some(&b'{') {
                    // Another's metric: its matchers are not a selector of their own.
                    i = skip_matchers(i);
                }
            }
            _ => i += 1,
        }
    }
    out
}

/// A Prometheus server of the test's own: a temp dir for its data, a free port, a 1 s scrape
/// and evaluation interval, the two services as its targets and alerts.yml as its rules.
struct Prometheus {
    addr: SocketAddr,
    _service: Service,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    async fn start(binary: &Path, redirector: SocketAddr, collector: SocketAddr) -> Prometheus {
        let dir = tempfile::tempdir().expect("temp dir");
        let rules = monitoring()
            .join("alerts.yml")
            .canonicalize()
            .expect("monitoring/alerts.yml");
        // The shipped jobs (their relabelling too), at the services' addresses and 1 s.
        let shipped = read(&monitoring().join("prometheus.yml"));
        let jobs = shipped
            .find("scrape_configs:")
            .map(|at| &shipped[at..])
            .expect("prometheus.yml has scrape_configs");
        let jobs = [
            ("127.0.0.1:9180", redirector.to_string()),
            ("127.0.0.1:9181", collector.to_string()),
        ]
        .iter()
        .fold(jobs.replace("15s", "1s"), |jobs, (shipped, ours)| {
            assert!(jobs.contains(shipped), "prometheus.yml targets {shipped}");
            jobs.replace(shipped, ours)
        });
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files: [{rules:?}]\n{jobs}"
            ),
        )
        .expect("writing prometheus.yml");
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let mut cmd = Command::new(binary);
        cmd.arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .current_dir(dir.path());
        let service = Service::spawn("prometheus", cmd);
        eventually("Prometheus /-/ready", LIMIT, || async {
            let (status, _) = testkit::http::get(addr, "/-/ready").await.ok()?;
            (status == 200).then_some(())
        })
        .await;
        Prometheus {
            addr,
            _service: service,
            _dir: dir,
        }
    }

    /// The JSON answer of a GET on the API.
    async fn api(&self, path: &str) -> Value {
        let (status, body) = testkit::http::get(self.addr, path)
            .await
            .unwrap_or_else(|e| panic!("GET {path} from Prometheus: {e}"));
        serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("GET {path}: HTTP {status}, not JSON ({e}): {body}"))
    }

    /// The series an instant query returns; an error if it does not parse or returns none.
    async fn query_with_data(&self, promql: &str) -> Result<Vec<Value>, String> {
        let answer = self
            .api(&format!("/api/v1/query?query={}", encode(promql)))
            .await;
        if answer["status"] != "success" {
            return Err(format!("{}: {}", answer["errorType"], answer["error"]));
        }
        let series = answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if series.is_empty() {
            return Err("no data".into());
        }
        Ok(series)
    }

    /// Waits until `promql` returns data.
    async fn await_data(&self, what: &str, promql: &str) {
        let what = format!("{what} ({promql})");
        eventually(&what, LIMIT, || async {
            self.query_with_data(promql).await.ok().map(|_| ())
        })
        .await;
    }

    /// The alerting rules as `/api/v1/rules` reports them.
    async fn alerting_rules(&self) -> Vec<Value> {
        let answer = self.api("/api/v1/rules?type=alert").await;
        answer["data"]["groups"]
            .as_array()
            .expect("rule groups")
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

/// Percent-encodes a query parameter.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn selectors_without_a_name_and_our_metrics_named_in_strings_are_found() {
    assert_eq!(
        selectors(
            r#"count({__name__=~"collector_.*", job="collector"}) and label_replace(other{a="b"}, "x", "collector_senders", "y", "(.*)")"#
        ),
        [
            r#"{__name__=~"collector_.*", job="collector"}"#,
            "collector_senders"
        ]
    );
}

#[test]
fn selectors_are_found_with_their_matchers_and_strings_are_skipped() {
    assert_eq!(
        selectors(
            r#"sum by (job, kind) (rate(redirector_send_errors_total{kind!="queue_full"}[1m])) > 0 and up{job="redirector_x"} == 1 or absent(collector_senders)"#
        ),
        [
            r#"redirector_send_errors_total{kind!="queue_full"}"#,
            r#"up{job="redirector_x"}"#,
            "collector_senders"
        ]
    );
}
