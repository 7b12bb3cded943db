//! PostgreSQL error text that says what the server said.

/// tokio_postgres errors display as just "db error"; this adds the server's severity, message
/// and detail, or the underlying cause (connection refused, socket missing, ...).
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let detail = db.detail().map(|d| format!(" ({d})")).unwrap_or_default();
        return format!("{}: {}{detail}", db.severity(), db.message());
    }
    match std::error::Error::source(e) {
        Some(cause) => format!("{e}: {cause}"),
        None => e.to_string(),
    }
}
