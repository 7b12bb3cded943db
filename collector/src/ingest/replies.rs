//! Where acknowledgements and resend requests leave from: a socket of each peer's own, not the
//! socket clicks arrive on.
//!
//! A datagram queued at a receiver counts against its sender's send buffer until it is read.
//! Answered from one socket, a peer that never reads (or reads slowly) would fill that socket's
//! buffer with its unread answers, and every other sender's acknowledgements would fail behind
//! them. From a socket per peer address, such a peer fills only its own socket's buffer (the
//! kernel stops at its receive queue's length, `net.unix.max_dgram_qlen`); every other peer's
//! answers go out as before. At most `MAX_PEERS` sockets are kept, the least recently used
//! closed first, so a flood of addresses costs a bounded number of descriptors.
//!
//! A sender of an older build is connected to the collector's socket, and such a socket takes
//! datagrams from its peer only (EPERM from any other): it is answered from the collector's
//! socket, as before.

use std::collections::HashMap;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;

use nix::sys::socket::{self, MsgFlags, UnixAddr};
use std::time::Instant;

use crate::ingest::senders::Reply;
use crate::ingest::socket::Inbox;

/// Reply sockets kept at once: a host's redirectors, with room to spare.
const MAX_PEERS: usize = 64;

struct Peer {
    socket: UnixDatagram,
    used: Instant,
}

#[derive(Default)]
pub(crate) struct Replies {
    peers: HashMap<UnixAddr, Peer>,
}

impl Replies {
    /// Sends `reply` without waiting, from its peer's socket. An error means it was not sent
    /// (the peer is gone, or its queue is full); acknowledgements are cumulative, so the next
    /// one covers it.
    pub(crate) fn send(&mut self, inbox: &Inbox, reply: &Reply, now: Instant) -> io::Result<()> {
        let bytes = reply.ack.encode();
        let socket = self.socket_for(reply.to, now)?;
        match socket::sendto(
            socket.as_raw_fd(),
            &bytes,
            &reply.to,
            MsgFlags::MSG_DONTWAIT,
        ) {
            Ok(_) => Ok(()),
            Err(nix::errno::Errno::EPERM) => inbox.send_to(&bytes, &reply.to),
            Err(e) => Err(e.into()),
        }
    }

    /// Reply sockets open.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.peers.len()
    }

    fn socket_for(&mut self, to: UnixAddr, now: Instant) -> io::Result<&UnixDatagram> {
        if !self.peers.contains_key(&to) && self.peers.len() >= MAX_PEERS {
            let oldest = self
                .peers
                .iter()
                .min_by_key(|(_, p)| p.used)
                .map(|(a, _)| *a);
            oldest.map(|a| self.peers.remove(&a));
        }
        let peer = match self.peers.entry(to) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let socket = UnixDatagram::unbound()?;
                socket.set_nonblocking(true)?;
                e.insert(Peer { socket, used: now })
            }
        };
        peer.used = now;
        Ok(&peer.socket)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use protocol::wire::Ack;

    /// A peer that never reads fills its own reply socket, not another's.
    #[tokio::test]
    async fn a_peer_that_never_reads_does_not_hold_up_another() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(&dir.path().join("c.sock"), 0o600, Vec::new()).unwrap();
        let silent_path = dir.path().join("silent.sock");
        let _silent = UnixDatagram::bind(&silent_path).unwrap();
        let reader_path = dir.path().join("reader.sock");
        let reader = UnixDatagram::bind(&reader_path).unwrap();
        reader.set_nonblocking(true).unwrap();
        let (silent, reading) = (
            UnixAddr::new(&silent_path).unwrap(),
            UnixAddr::new(&reader_path).unwrap(),
        );
        let mut replies = Replies::default();
        let now = Instant::now();
        let reply = |to, seq| Reply {
            to,
            ack: Ack::new(7, Some(seq), None),
        };
        let mut refused = 0;
        for seq in 0..5_000 {
            refused += u32::from(replies.send(&inbox, &reply(silent, seq), now).is_err());
        }
        assert!(refused > 0, "the silent peer's queue never filled");
        let mut buf = [0u8; 64];
        for seq in 0..100 {
            replies.send(&inbox, &reply(reading, seq), now).unwrap();
            let n = reader.recv(&mut buf).unwrap();
            assert_eq!(
                protocol::wire::decode_ack(&buf[..n]).unwrap().committed,
                Some(seq)
            );
        }
        assert_eq!(replies.len(), 2);
    }

    #[tokio::test]
    async fn keeps_a_bounded_number_of_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(&dir.path().join("c.sock"), 0o600, Vec::new()).unwrap();
        let mut replies = Replies::default();
        let mut bound = Vec::new();
        for i in 0..MAX_PEERS + 10 {
            let path = dir.path().join(format!("p{i}.sock"));
            bound.push(UnixDatagram::bind(&path).unwrap());
            let reply = Reply {
                to: UnixAddr::new(&path).unwrap(),
                ack: Ack::new(1, Some(0), None),
            };
            replies.send(&inbox, &reply, Instant::now()).unwrap();
        }
        assert_eq!(replies.len(), MAX_PEERS);
    }
}
