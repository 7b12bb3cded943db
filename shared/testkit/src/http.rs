//! The tests' one HTTP client: a request on a fresh connection, answered whole. Both services'
//! listeners (the redirector's, and the admin listener of each) speak HTTP/1.1 through hyper.

use std::io;
use std::net::SocketAddr;

use http_body_util::BodyExt;
use hyper::{Method, Response};

/// One `method` request for `path` on a fresh connection to `addr`: the answer with its body.
/// An error is returned, not raised, so that a wait can ask again while a listener starts;
/// one not answered whole within [`crate::LIMIT`] is an error too (`TimedOut`), so that a
/// service that never answers fails the test rather than holding it.
pub async fn request(addr: SocketAddr, method: Method, path: &str) -> io::Result<Response<String>> {
    request_with(addr, method, path, &[]).await
}

/// [`request`] with these `headers` too.
pub async fn request_with(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> io::Result<Response<String>> {
    let answered = tokio::time::timeout(crate::LIMIT, answer(addr, method, path, headers));
    answered.await.unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{path} on {addr}: no answer within {:?}", crate::LIMIT),
        ))
    })
}

async fn answer(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
) -> io::Result<Response<String>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(io::Error::other)?;
    tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "test");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(io::Error::other)?;
    let response = sender
        .send_request(request)
        .await
        .map_err(io::Error::other)?;
    let (head, body) = response.into_parts();
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    Ok(Response::from_parts(
        head,
        String::from_utf8_lossy(&body).into_owned(),
    ))
}

/// `GET path`: the status and the body.
pub async fn get(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let response = request(addr, Method::GET, path).await?;
    Ok((response.status().as_u16(), response.into_body()))
}
