//! Reaching PostgreSQL: a connection driven by its own task, and error text that says what
//! the server said.

/// Connects, and drives the connection on a spawned task that ends when the client is dropped
/// (or the connection fails: the client's next query then reports it).
pub async fn connect(
    config: &tokio_postgres::Config,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!("database connection ended: {}", describe(&e));
        }
    });
    Ok(client)
}

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
