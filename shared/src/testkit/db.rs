//! Reading the clicks back.

use super::{eventually, LIMIT};

/// Rows in `clicks` for `code`, or for every code if `None`.
pub async fn rows(client: &tokio_postgres::Client, code: Option<&str>) -> u64 {
    let sql = "SELECT count(*) FROM clicks WHERE $1::text IS NULL OR code = $1";
    let row = client
        .query_one(sql, &[&code])
        .await
        .unwrap_or_else(|e| panic!("counting clicks: {}", crate::db::describe(&e)));
    row.get::<_, i64>(0) as u64
}

/// Waits until `clicks` holds `expected` rows for `code` (every code if `None`), and checks it
/// holds no more: more rows than clicks sent is a duplicate.
pub async fn await_rows(client: &tokio_postgres::Client, code: Option<&str>, expected: u64) {
    let what = format!("{expected} rows in clicks for {code:?}");
    let got = eventually(&what, LIMIT, || async {
        let n = rows(client, code).await;
        (n >= expected).then_some(n)
    })
    .await;
    assert_eq!(got, expected, "more rows in clicks than clicks sent");
}
