//! Datagrams in: the socket and its stop fence (`socket`), the receive loop (`receive`), what
//! one datagram does (`intake`), the senders' records (`senders`) and the replies to them
//! (`replies`), the `--mirror`, and the start-up check of `--allow-uid` (`userns`).

pub mod intake;
pub(crate) mod mirror;
pub(crate) mod receive;
pub(crate) mod replies;
pub mod senders;
pub(crate) mod socket;
pub(crate) mod userns;
