//! The redirector: answers `GET /{code}` with a redirect from an in-memory link table and
//! hands each click, through a fixed ring and a drain task, to the collector's datagram socket
//! without making the request wait.
#![warn(unreachable_pub)]

pub(crate) mod admin;
pub mod config;
pub(crate) mod direct;
pub mod drain;
pub(crate) mod http;
pub mod links;
pub mod metrics;
pub mod ring;
pub mod service;
pub(crate) mod session;
pub mod state;
pub mod table;
pub mod target;
