//! The repository's own tests, beside no service: the systemd units and the install steps
//! (`tests/ops_systemd.rs`), `scripts/dev` (`tests/ops_dev_script.rs`), the monitoring rules and
//! dashboard against a real Prometheus scraping both services (`tests/monitoring.rs`). No code.
