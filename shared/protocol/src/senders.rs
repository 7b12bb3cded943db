//! Each sender's seqs as this collector knows them: which datagrams are new, repeated, missing
//! or not believable, what to tell a sender that waits for acknowledgements, and which process
//! a sender id belongs to.
//!
//! Two kinds of sender. One that sends from an address of its own (a redirector) expects
//! acknowledgements and resends what is not acknowledged: its datagrams are accepted strictly
//! in seq order, a datagram past the next one expected is not accepted (the sender is asked to
//! resend from the missing one), and a repeat of a committed one is acknowledged again. One
//! without an address (`clicktap send`, an older redirector) is never acknowledged: a gap in
//! its seqs is counted as lost, as the wire format's first version had it.
//!
//! When this collector's record of a sender that expects acknowledgements is behind what the
//! sender still holds (`click_senders` emptied, restored from a backup, rolled back by a
//! failover), the sender, asked for a seq it no longer holds, answers with a resync: where its
//! window starts and how many clicks were acknowledged before it. The collector goes on from
//! there and counts the clicks it has no record of as unaccounted: committed before the record
//! was lost, or lost with it, which it cannot tell apart. No seq it still has a record of is
//! accepted again, and no sender waits for a seq it cannot send.
//!
//! A sender id belongs to the process (pid and uid, as the kernel attests them) whose datagram
//! of it this collector accepted first; another process's datagram claiming it is refused,
//! unless it comes from the same user at the same address: a redirector restarted on its state
//! region (after a crash, a kill or a restart) goes on with the id and seqs of the process it
//! replaces, from the acknowledgement socket that only its user can bind. From another address
//! of the same user, it moves there once the transport finds nobody listening at the first,
//! and the new one as hard to bind as the first ([`Senders::claimed_from_elsewhere`],
//! [`Senders::moved`]): a restart with another acknowledgement socket, not a copy of the state
//! beside a live original. The process an id was taken from is refused it for as long as it
//! lives, no longer: the transport looks ([`Senders::replaced`], [`Senders::replaced_gone`]),
//! as the kernel gives its pid to later processes. A collector that starts knows each sender's address from
//! `click_senders` ([`Senders::replying_at`]), and until a datagram names the process, only
//! one from that address (or one it moved to, as above) speaks for the id: not the first
//! process to send it. Also refused is a seq further ahead than any sender could have got
//! (from a known sender without an address: one with an address is asked to resend, and
//! resyncs if it has to; one without a record is one forgotten, going on). Memory stays
//! bounded: a process keeps at most `PER_PROCESS` ids (besides those with an address pushed
//! out, kept a minute or two past their commit), all senders at most `MAX_SENDERS` (besides
//! those whose datagrams wait for their commit, and up to `MAX_UNHEARD` whose last
//! acknowledgement did not reach them), and ids idle for 29 days are forgotten; what
//! is forgotten leaves `click_senders` with the next batch.
//!
//! Loaded from `click_senders` at start; a batch commits its senders' seqs with its rows.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::wire::{Ack, Resync};
use crate::{Creds, RejectReason};

/// The uid the kernel shows for a user not mapped into the receiver's user namespace (Linux's
/// default `kernel.overflowuid`): every redirector's, to a collector under systemd's
/// `PrivateUsers=yes`. It says nothing of who sent, so a uid recorded or seen as this one is
/// no evidence against a claim: a collector whose `PrivateUsers=` changed across its
/// restart saw each redirector's uid change with it, and refused every sender it had
/// loaded, for good, which stopped their acknowledgements until their ids were forgotten.
pub const OVERFLOW_UID: u32 = 65534;

/// An acknowledgement or resend request identical to one sent this recently is not sent again:
/// a burst of repeated or early datagrams gets one answer, not one each.
const REPEAT_AFTER: Duration = Duration::from_millis(200);
/// The furthest a seq may be past the next one expected: far more datagrams than a collector
/// can lose (its two batches and the socket's queue hold a few hundred), far fewer than a
/// forged seq would claim.
pub const MAX_JUMP: u64 = 100_000;
/// The highest seq, and the most clicks before a seq, taken: `click_senders` keeps both as
/// `bigint`, which would turn a higher one negative and the record's order backwards. A
/// sender counting from 0, a seq a datagram, never gets there; a forger can claim to.
pub const MAX_SEQ: u64 = i64::MAX as u64;
/// Sender ids one process keeps: a redirector has one per process start (a new one after a
/// day idle); a flood of fresh ids from one process replaces its own oldest, nobody else's
/// while the others are well under `MAX_SENDERS` (one with an address goes a minute or two
/// after its commit, so that a repeat after a lost acknowledgement is acknowledged again).
/// Not the processes of pid namespaces the collector cannot see: see [`HIDDEN_PROCESSES`].
pub const PER_PROCESS: usize = 4;
/// Sender ids the processes of pid namespaces the collector cannot see (other containers')
/// keep together, one user's: they all read as pid 0. Four for all of them would have each
/// one's ids push out the others': a redirector's, forgotten a minute after it went quiet,
/// would have its next datagram asked to resend from 0, and its resync count every click
/// acknowledged before as unaccounted. Bounded still, so that one of them flooding fresh ids
/// cannot fill `MAX_SENDERS` and push out the idle senders of every process.
pub const HIDDEN_PROCESSES: usize = 1024;
/// The most clicks a datagram can hold (the largest datagram of the shortest clicks): a resync
/// claiming more per skipped datagram is counted as that many (`Senders::resync`).
const MAX_CLICKS_PER_DATAGRAM: u64 =
    (crate::wire::MAX_DATAGRAM / crate::wire::MIN_CLICK_LEN) as u64;
/// The most clicks one resync may say its sender's records lost: a redirector at a million
/// clicks a second would take nine years to serve as many. A larger claim is not believed, so
/// that no peer can push `collector_clicks_unaccounted_total` near its wrap, nor its sums.
const MAX_UNACCOUNTED: u64 = 1 << 48;
/// Resend requests remembered (for senders with an address), to check that a resync answers
/// one: a flood of fresh ids pushes out the oldest (`Senders::note_asked`), whose senders are
/// asked again.
const MAX_ASKED: usize = 4_096;
/// Sender ids kept in all; past it, the least recently seen tenth is forgotten.
pub const MAX_SENDERS: usize = 100_000;
/// Senders whose last acknowledgement did not reach their socket kept, at most, whatever
/// their process's quota and `MAX_SENDERS` say (see [`Senders::acknowledged`]): the most
/// recently seen of them.
pub const MAX_UNHEARD: usize = 4_096;
/// An id not seen for this long is forgotten: a redirector idle for a day with nothing waiting
/// goes on under a new id, but one stopped on its state region with datagrams in its window
/// comes back with its old one. Forgotten, it would be asked to resend from seq 0, and its
/// resync would count every click acknowledged before its window as unaccounted. A day short
/// of the age at which click_senders rows are pruned (the collector's `PRUNE`, checked against
/// this), and only a datagram accepted or a commit counts as seen, so that memory mostly lets
/// a sender go before its row does; where not (a commit answered days after it began), the
/// writer's check of a new session passes over a sender committed longer ago than this, whose
/// missing row is no sign of a failover (`Committed::behind`).
pub const IDLE: Duration = Duration::from_secs(29 * 24 * 3600);
/// How often idle ids are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// How long the receiver reads, after it last stopped reading, before anyone is forgotten for
/// idleness: long enough for it to have read what queued meanwhile, and for senders to have
/// sent again what the full queue refused (they retry within a second).
const CAUGHT_UP: Duration = SWEEP_EVERY;

/// What a datagram is, by its sender's id and seq.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// New; `lost` datagrams of this sender were skipped before it (never for a sender that
    /// expects acknowledgements: it resends them).
    Accept { lost: u64 },
    /// Accepted before: skipped.
    Duplicate,
    /// From a sender that expects acknowledgements, past the next seq expected: not accepted,
    /// the sender resends from the missing one.
    Ahead,
    /// Not believed: the datagram is rejected whole.
    Refused(Refusal),
}

/// What a resync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resynced {
    /// The record was behind: `skipped` datagrams of `unaccounted` clicks were passed over, and
    /// the sender goes on from `first`. `claimed`, the clicks the sender's count says it
    /// skipped, is more than `unaccounted` only where the record's count of the sender's clicks
    /// was short (a row from before migration 12, whose count begins at 0 there): what the
    /// skipped datagrams can hold is counted instead.
    Skipped {
        first: u64,
        skipped: u64,
        unaccounted: u64,
        claimed: u64,
    },
    /// The record is not behind (a repeated resync, or one that crossed a resend): nothing.
    Stale,
    /// Not an answer to a resend request this collector made (to that process, at that
    /// address, for a seq below `first`): ignored. One in flight across a collector restart
    /// is; the new collector asks again. A forger's never skips anything.
    Unasked,
    Refused(Refusal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The sender id belongs to another process.
    SenderMismatch,
    /// The seq is more than `MAX_JUMP` past the next one expected, or past `MAX_SEQ`.
    SeqJump,
    /// A resync from a sender without an address (never asked to resend), or claiming more
    /// clicks than `MAX_SEQ`, or more unaccounted than any sender serves (`MAX_UNACCOUNTED`).
    /// More than the datagrams it skips can hold is counted as that many, not refused.
    BadResync,
}

impl Refusal {
    pub fn reason(self) -> RejectReason {
        match self {
            Refusal::SenderMismatch => RejectReason::SenderMismatch,
            Refusal::SeqJump => RejectReason::SeqJump,
            Refusal::BadResync => RejectReason::BadResync,
        }
    }
}

/// A message for a sender: where (`A`: its address, as the transport names it), and what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply<A> {
    pub to: A,
    pub ack: Ack,
}

/// The process a sender id belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Owner {
    pid: i32,
    uid: u32,
}

impl Owner {
    fn of(creds: Option<Creds>) -> Option<Owner> {
        creds.map(|c| Owner {
            pid: c.pid,
            uid: c.uid,
        })
    }
}

#[derive(Debug)]
struct Sender<A> {
    /// Highest seq accepted into a batch, committed or not.
    accepted: Option<u64>,
    /// Highest seq committed.
    committed: Option<u64>,
    /// Clicks in its datagrams up to `accepted`, since its seq 0 (as far as this collector's
    /// record goes): what a resync is compared with.
    clicks: u64,
    /// Where its acknowledgements go; `None` while it sends from no address of its own.
    reply: Option<A>,
    /// The last message sent to it, and when.
    told: Option<(Ack, Instant)>,
    /// Whose it is: set by the first datagram of it accepted in this collector's life.
    owner: Option<Owner>,
    /// The address `click_senders` recorded for it: until `owner` is set, only a datagram from
    /// there (or from where it moved) speaks for it. Not `reply`, which any datagram judged
    /// sets, a refused one's too.
    recorded: Option<A>,
    /// The uid that `click_senders` recorded sending from `recorded`, if any: a later process
    /// speaks for the sender only as that user, as for a known owner.
    recorded_uid: Option<u32>,
    /// Whose it was before a later process took it over: refused it while it lives (a copy of
    /// the state beside its successor must not take it back), until the transport finds it
    /// gone ([`Senders::replaced_gone`]).
    replaced: Option<Owner>,
    /// Pushed out of its process's ids, with an address: forgotten a minute or two after its
    /// datagrams are committed (see [`Senders::bind`]).
    over_quota: bool,
    /// Its last acknowledgement did not reach its socket (see [`Senders::acknowledged`]).
    unheard: bool,
    seen: Instant,
}

impl<A: Copy> Sender<A> {
    fn new(now: Instant) -> Sender<A> {
        Sender {
            accepted: None,
            committed: None,
            clicks: 0,
            reply: None,
            told: None,
            owner: None,
            recorded: None,
            recorded_uid: None,
            replaced: None,
            over_quota: false,
            unheard: false,
            seen: now,
        }
    }

    /// Whether every datagram of it accepted is committed.
    fn settled(&self) -> bool {
        self.accepted == self.committed
    }

    /// A reply of `ack`, unless the sender has no address or was told the same just now.
    fn tell(&mut self, ack: Ack, now: Instant, repeat: bool) -> Option<Reply<A>> {
        let to = self.reply?;
        let recent = |&(told, at): &(Ack, Instant)| told == ack && now - at < REPEAT_AFTER;
        if !repeat && self.told.as_ref().is_some_and(recent) {
            return None;
        }
        self.told = Some((ack, now));
        Some(Reply { to, ack })
    }
}

/// The collector's half of the acknowledgement protocol; `A` is a sender's address.
/// A resend request made: for which seq, of which process, at which address.
#[derive(Debug, Clone, Copy)]
struct Asked<A> {
    seq: u64,
    owner: Option<Owner>,
    to: A,
    /// When it was made: the same request to a sender not remembered (its `told`) is not
    /// made again within [`REPEAT_AFTER`].
    at: Instant,
    /// The request's number, in `Senders::asked_order`.
    n: u64,
}

#[derive(Debug)]
pub struct Senders<A> {
    map: HashMap<u64, Sender<A>>,
    /// The last resend request made to each sender, until a resync answers it.
    asked: HashMap<u64, Asked<A>>,
    /// The order requests were made in, oldest first, by sender and number: past
    /// `MAX_ASKED`, the oldest goes. Requests made again since or answered stay in until they
    /// reach the front, or until it is twice as long as `asked` may be.
    asked_order: VecDeque<(u64, u64)>,
    /// Resend requests remembered so far.
    asks: u64,
    /// Each process's ids, oldest first, at most `PER_PROCESS`.
    by_process: HashMap<Owner, VecDeque<u64>>,
    /// Forgotten since `forgotten` was last called: to delete from click_senders.
    forgotten: Vec<u64>,
    swept: Instant,
    /// Senders known after the last sweep.
    swept_len: usize,
    /// Since when the receiver has been reading (see [`Senders::resumed`]).
    reading_since: Instant,
}

impl<A: Copy + PartialEq> Default for Senders<A> {
    fn default() -> Senders<A> {
        Senders::committed([])
    }
}

impl<A: Copy + PartialEq> Senders<A> {
    /// The senders whose seqs were committed, each with its last committed seq and the clicks
    /// up to it.
    pub fn committed(last: impl IntoIterator<Item = (u64, u64, u64)>) -> Senders<A> {
        let now = Instant::now();
        let map = last
            .into_iter()
            .map(|(sender, seq, clicks)| {
                let mut known = Sender::new(now);
                (known.accepted, known.committed) = (Some(seq), Some(seq));
                known.clicks = clicks;
                (sender, known)
            })
            .collect();
        Senders {
            map,
            asked: HashMap::new(),
            asked_order: VecDeque::new(),
            asks: 0,
            by_process: HashMap::new(),
            forgotten: Vec::new(),
            swept: now,
            swept_len: 0,
            reading_since: now,
        }
    }

    /// The loaded senders' addresses, and the uid seen sending from each (if recorded), as
    /// `click_senders` has them: until a datagram names its process, such a sender is taken
    /// only from there by that user, or from an address it moved to
    /// ([`Senders::claimed_from_elsewhere`]).
    pub fn replying_at(
        mut self,
        addresses: impl IntoIterator<Item = (u64, A, Option<u32>)>,
    ) -> Senders<A> {
        for (sender, at, uid) in addresses {
            if let Some(s) = self.map.get_mut(&sender) {
                (s.reply, s.recorded, s.recorded_uid) = (Some(at), Some(at), uid);
            }
        }
        self
    }

    /// Judges datagram `seq` of `sender`, `clicks` clicks sent from `from` by the process of
    /// `creds`, and, if new, remembers it as accepted; also what to tell the sender, if anything.
    pub fn judge(
        &mut self,
        sender: u64,
        (seq, clicks): (u64, u64),
        from: Option<A>,
        creds: Option<Creds>,
        now: Instant,
    ) -> (Verdict, Option<Reply<A>>) {
        self.sweep(now);
        let owner = Owner::of(creds);
        let Some(s) = self.map.get_mut(&sender) else {
            let (verdict, reply) = self.first(sender, (seq, clicks), from, owner, now);
            self.note_asked(sender, owner, reply, now);
            return (verdict, reply);
        };
        if !Self::speaks_for(s, owner, from) {
            return (Verdict::Refused(Refusal::SenderMismatch), None);
        }
        let took_over = s.owner.is_some() && s.owner != owner;
        let (verdict, reply) = judge_known(s, sender, seq, from, now);
        if took_over {
            self.take_over(sender, owner);
        }
        let Some(s) = self.map.get_mut(&sender) else {
            return (verdict, reply);
        };
        if let Verdict::Accept { .. } = verdict {
            s.accepted = Some(seq);
            s.clicks = s.clicks.saturating_add(clicks).min(MAX_SEQ);
            s.owner = s.owner.or(owner);
            let owner = s.owner;
            self.used(sender, owner);
        }
        self.note_asked(sender, owner, reply, now);
        (verdict, reply)
    }

    /// Remembers a resend request in `reply`, if it is one, so that a resync can be checked
    /// against it; past `MAX_ASKED`, forgets the oldest: a request outlives as many newer ones,
    /// however many fresh ids a flood brings, time enough for its sender's resync (before,
    /// whichever came first in the map went, a live sender's as soon as any).
    fn note_asked(
        &mut self,
        sender: u64,
        owner: Option<Owner>,
        reply: Option<Reply<A>>,
        at: Instant,
    ) {
        let Some((seq, to)) = reply.and_then(|r| Some((r.ack.resend_from?, r.to))) else {
            return;
        };
        self.asks += 1;
        let n = self.asks;
        let request = Asked {
            seq,
            owner,
            to,
            n,
            at,
        };
        self.asked.insert(sender, request);
        self.asked_order.push_back((sender, n));
        let asked = &mut self.asked;
        let current = |asked: &HashMap<u64, Asked<A>>, (id, n): (u64, u64)| {
            asked.get(&id).is_some_and(|a| a.n == n)
        };
        while asked.len() > MAX_ASKED {
            match self.asked_order.pop_front() {
                Some(oldest) if current(asked, oldest) => _ = asked.remove(&oldest.0),
                Some(_) => {}
                None => break,
            }
        }
        if self.asked_order.len() > 2 * MAX_ASKED {
            self.asked_order.retain(|&request| current(asked, request));
        }
    }

    /// The first datagram of a sender this collector does not know (never seen, or forgotten):
    /// remembered only if accepted, so that refused or early ones take no memory.
    fn first(
        &mut self,
        sender: u64,
        (seq, clicks): (u64, u64),
        from: Option<A>,
        owner: Option<Owner>,
        now: Instant,
    ) -> (Verdict, Option<Reply<A>>) {
        let mut s = Sender::new(now);
        // Not remembered until accepted, it is told what the last request to it there said:
        // without, each datagram of a full window was asked for again, each request answered
        // with a resync.
        s.told = self
            .asked
            .get(&sender)
            .filter(|a| Some(a.to) == from)
            .map(|a| (Ack::new(sender, None, Some(a.seq)), a.at));
        let (verdict, reply) = judge_known(&mut s, sender, seq, from, now);
        if let Verdict::Accept { .. } = verdict {
            (s.accepted, s.owner, s.clicks) = (Some(seq), owner, clicks);
            self.map.insert(sender, s);
            self.bind(sender, owner);
        }
        (verdict, reply)
    }

    /// Takes a resync of `sender`, sent from `from` by the process of `creds`, in answer to a
    /// resend request made to that process at that address: if the record of it is behind
    /// `first`, the seqs before `first` count as accepted, with `clicks_before` clicks up to
    /// them, and the difference as unaccounted: at most what the seqs skipped could hold.
    /// Refused as not a sender's if that difference is past what any sender serves
    /// ([`MAX_UNACCOUNTED`]), not when it is past what the seqs could hold: the record's count
    /// may be short, and refused, the sender would be asked again and refused again, held for
    /// good. Where the window starts is not checked against the seqs received: after a
    /// failover, acknowledgements of commits the failover lost move it past them.
    pub fn resync(
        &mut self,
        resync: &Resync,
        from: Option<A>,
        creds: Option<Creds>,
        now: Instant,
    ) -> Resynced {
        let (sender, first) = (resync.sender, resync.first);
        let owner = Owner::of(creds);
        let Some(last) = first.checked_sub(1) else {
            return Resynced::Stale;
        };
        // Neither past what the record keeps (a datagram's seq is refused there too): a `last`
        // past it, from a record near it, got past the clicks' bound below, and was written
        // as a negative seq the database's GREATEST kept behind, a failover at every check.
        if from.is_none() || resync.clicks_before > MAX_SEQ || last > MAX_SEQ {
            return Resynced::Refused(Refusal::BadResync);
        }
        let s = self.map.get(&sender);
        if s.is_some_and(|s| !Self::speaks_for(s, owner, from)) {
            return Resynced::Refused(Refusal::SenderMismatch);
        }
        if s.is_some_and(|s| s.accepted.is_some_and(|a| a >= last)) {
            return Resynced::Stale;
        }
        let asked = self.asked.get(&sender);
        if !asked.is_some_and(|a| a.seq < first && a.owner == owner && Some(a.to) == from) {
            return Resynced::Unasked;
        }
        let (accepted, clicks) = s.map_or((None, 0), |s| (s.accepted, s.clicks));
        let skipped = accepted.map_or(first, |a| last - a);
        let claimed = resync.clicks_before.saturating_sub(clicks);
        if claimed > MAX_UNACCOUNTED {
            return Resynced::Refused(Refusal::BadResync);
        }
        let unaccounted = claimed.min(skipped.saturating_mul(MAX_CLICKS_PER_DATAGRAM));
        self.asked.remove(&sender);
        let s = self.map.entry(sender).or_insert_with(|| Sender::new(now));
        (s.accepted, s.clicks, s.seen, s.reply) = (Some(last), resync.clicks_before, now, from);
        if s.owner.is_none() {
            s.owner = owner;
            self.bind(sender, owner);
        } else if s.owner != owner {
            self.take_over(sender, owner);
        }
        Resynced::Skipped {
            first,
            skipped,
            unaccounted,
            claimed,
        }
    }

    /// Whether `sender` is known (not forgotten, or seen again since).
    pub fn knows(&self, sender: u64) -> bool {
        self.map.contains_key(&sender)
    }

    /// Clicks in `sender`'s datagrams up to the last one accepted, since its seq 0.
    pub fn clicks_through(&self, sender: u64) -> u64 {
        self.map.get(&sender).map_or(0, |s| s.clicks)
    }

    /// Whether the process `owner`, sending from `from`, may speak for the known sender `s`: its
    /// owner, or (for a sender with an address) a later process of the same user at the same
    /// address, which took the id over with the state region it adopted. Whose a sender is
    /// not known yet (loaded at start) is anyone's of its recorded user, if any, at its
    /// recorded address, if it has one.
    fn speaks_for(s: &Sender<A>, owner: Option<Owner>, from: Option<A>) -> bool {
        match (s.owner, owner) {
            (None, claimed) => {
                s.recorded.is_none() || (s.recorded == from && Self::recorded_user(s, claimed))
            }
            (known, claimed) if known == claimed => true,
            (Some(known), Some(claimed)) => {
                from.is_some()
                    && s.reply == from
                    && known.uid == claimed.uid
                    && s.replaced != Some(claimed)
            }
            (Some(_), None) => false,
        }
    }

    /// Whether `claimed` is of the user `click_senders` recorded for the loaded sender `s`
    /// (any, where none was recorded, or where either uid is [`OVERFLOW_UID`]: the address
    /// alone decides then).
    fn recorded_user(s: &Sender<A>, claimed: Option<Owner>) -> bool {
        s.recorded_uid.map_or(true, |uid| {
            claimed.is_some_and(|c| c.uid == uid || c.uid == OVERFLOW_UID || uid == OVERFLOW_UID)
        })
    }

    /// Where the known `sender`'s acknowledgements go, if a later process of its owner's user
    /// claims it from another address of its own, which it may not take over from there: a
    /// redirector restarted on its state region with another `--ack-socket`, or a copy of the
    /// state running beside the original. The transport looks whether anyone still listens
    /// at the address returned (nobody does after a restart) and whether binding the claim's
    /// address takes what binding that one did; if so, the claim [`moved`] it.
    ///
    /// [`moved`]: Senders::moved
    pub fn claimed_from_elsewhere(
        &self,
        sender: u64,
        from: Option<A>,
        creds: Option<Creds>,
    ) -> Option<A> {
        let s = self.map.get(&sender)?;
        let claimed = Owner::of(creds)?;
        let (at, successor) = match s.owner {
            Some(known) => (s.reply, known != claimed && known.uid == claimed.uid),
            // Loaded at start, no process known yet: the addresses are the proof.
            None => (s.recorded, Self::recorded_user(s, Some(claimed))),
        };
        let elsewhere = from.is_some() && at.is_some() && at != from;
        (elsewhere && successor && s.replaced != Some(claimed))
            .then_some(at)
            .flatten()
    }

    /// `sender`'s acknowledgements go to `to` from now on, so that the process claiming it from
    /// there takes it over: nobody listens at the address where they went (the transport
    /// looked, after [`Senders::claimed_from_elsewhere`]), so its owner is gone.
    pub fn moved(&mut self, sender: u64, to: A) {
        if let Some(s) = self.map.get_mut(&sender) {
            (s.reply, s.recorded) = (Some(to), s.recorded.and(Some(to)));
        }
    }

    /// Whether a datagram of `sender` from the process of `creds` would take the id over: the
    /// id is known and owned by another process. The transport looks whether that process
    /// still exists first: a datagram of a process that died, read after its successor's,
    /// would otherwise hand the id back to the dead one once it is let go
    /// ([`Senders::replaced_gone`]), and the successor be refused it for as long as it lives.
    pub fn would_take_over(&self, sender: u64, creds: Option<Creds>) -> bool {
        let owner = self.map.get(&sender).and_then(|s| s.owner);
        owner.is_some() && owner != Owner::of(creds)
    }

    /// The pid of the process `sender` was taken from, refused the id until the transport finds
    /// it gone and says so ([`Senders::replaced_gone`]); none for a process of a pid namespace
    /// the collector cannot see (its pid reads as 0).
    pub fn replaced(&self, sender: u64) -> Option<i32> {
        let pid = self.map.get(&sender)?.replaced?.pid;
        (pid > 0).then_some(pid)
    }

    /// The process `sender` was taken from no longer exists (the transport looked): its pid is
    /// no longer refused the id. The kernel gives pids again (they wrap at `pid_max`, 32,768 on
    /// some hosts); refused for good, a later redirector given that pid would be refused until
    /// the collector restarted, its clicks held until its ring filled.
    pub fn replaced_gone(&mut self, sender: u64) {
        if let Some(s) = self.map.get_mut(&sender) {
            s.replaced = None;
        }
    }

    /// `sender` moves to the process `owner` (see [`Senders::speaks_for`]).
    fn take_over(&mut self, sender: u64, owner: Option<Owner>) {
        let Some(s) = self.map.get_mut(&sender) else {
            return;
        };
        let before = std::mem::replace(&mut s.owner, owner);
        s.replaced = before;
        // The process replaced alone: a pass over every process's ids cost each take-over
        // a walk of up to `MAX_SENDERS` entries, which processes taking an id over and over in
        // rotation could make of every datagram.
        if let Some(was) = before {
            if let Some(ids) = self.by_process.get_mut(&was) {
                ids.retain(|&id| id != sender);
                if ids.is_empty() {
                    self.by_process.remove(&was);
                }
            }
        }
        self.bind(sender, owner);
    }

    /// `sender`, of `owner`, had a datagram accepted: it becomes the newest of its process's
    /// ids (taken back among them if it was pushed out), so that the quota pushes out the
    /// least recently used. By first use alone, the processes of other pid namespaces, which
    /// share a quota, pushed out their longest-running redirector's id once 1,024 others had
    /// come and gone, however busy it was, and forgot it at its first quiet minute.
    fn used(&mut self, sender: u64, owner: Option<Owner>) {
        let Some(owner) = owner else { return };
        if let Some(ids) = self.by_process.get_mut(&owner) {
            if ids.back() == Some(&sender) {
                return;
            }
            ids.retain(|&id| id != sender);
        }
        self.bind(sender, Some(owner));
    }

    /// Records that `sender` belongs to `owner`; past `PER_PROCESS` ids of one process, the
    /// least recently used ([`Senders::used`]) leaves them. It is forgotten, unless it has an address: forgotten then, a commit
    /// of its datagrams still to come would go unacknowledged, or one just made be lost with
    /// its acknowledgement, and its resend be written twice. Such a one goes at the first sweep
    /// a minute after it was last seen, its commit at the latest: long after the repeat that
    /// follows a lost acknowledgement (see [`Senders::sweep`]). The id bound is the newest,
    /// never the one pushed out.
    fn bind(&mut self, sender: u64, owner: Option<Owner>) {
        let Some(owner) = owner else { return };
        if let Some(s) = self.map.get_mut(&sender) {
            s.over_quota = false;
        }
        let ids = self.by_process.entry(owner).or_default();
        ids.push_back(sender);
        let quota = match owner.pid {
            0 => HIDDEN_PROCESSES,
            _ => PER_PROCESS,
        };
        let oldest = (ids.len() > quota).then(|| ids.pop_front()).flatten();
        let Some(oldest) = oldest else { return };
        match self.map.get_mut(&oldest) {
            Some(s) if s.reply.is_some() => s.over_quota = true,
            _ => self.forget(oldest),
        }
    }

    fn forget(&mut self, sender: u64) {
        let Some(s) = self.map.remove(&sender) else {
            return;
        };
        if let Some(owner) = s.owner {
            if let Some(ids) = self.by_process.get_mut(&owner) {
                ids.retain(|&id| id != sender);
                if ids.is_empty() {
                    self.by_process.remove(&owner);
                }
            }
        }
        self.forgotten.push(sender);
    }

    /// Once a minute: forgets ids idle for `IDLE`, ids pushed out of their process's ids and
    /// not seen for a minute, and the least recently seen tenth while there are more than
    /// `MAX_SENDERS`, those pushed out first; never one with datagrams waiting for their
    /// commit. (A sender whose datagrams wait for a database that is away is not idle, and one
    /// pushed out by a flood of others would be as wronged: forgotten, its commit would go
    /// unacknowledged, and its resend be written twice. Those are at most the senders of the
    /// datagrams in the receiver's two batches, so memory stays bounded.)
    fn sweep(&mut self, now: Instant) {
        // Over the bound, a sweep comes once a tenth more are known than after the last: not at
        // every datagram while the senders waiting for their commit alone are over it.
        let due = self.map.len() > MAX_SENDERS.max(self.swept_len + MAX_SENDERS / 10);
        if now - self.swept < SWEEP_EVERY && !due {
            return;
        }
        self.swept = now;
        // Datagrams that queued while the receiver was not reading are not judged yet: their
        // senders are not idle, whatever their `seen` says.
        let caught_up = now - self.reading_since >= CAUGHT_UP;
        let unheard = self.unheard_kept();
        let mut by_age: Vec<(bool, Instant, u64)> = self
            .map
            .iter()
            .filter(|(id, s)| s.settled() && (now - s.seen >= IDLE || !unheard.contains(id)))
            .map(|(&id, s)| (!s.over_quota, s.seen, id))
            .collect();
        by_age.sort_unstable();
        let over = self.map.len().saturating_sub(MAX_SENDERS * 9 / 10);
        let mut excess = if self.map.len() > MAX_SENDERS {
            over
        } else {
            0
        };
        for (in_quota, seen, id) in by_age {
            let idle = now - seen;
            let done = idle >= IDLE || (!in_quota && idle >= SWEEP_EVERY);
            if excess > 0 || (caught_up && done) {
                excess = excess.saturating_sub(1);
                self.forget(id);
            }
        }
        self.swept_len = self.map.len();
    }

    /// The senders [`Senders::acknowledged`] keeps: those not heard, the most recently seen
    /// [`MAX_UNHEARD`] of them.
    fn unheard_kept(&self) -> std::collections::HashSet<u64> {
        let mut unheard: Vec<(Instant, u64)> = self
            .map
            .iter()
            .filter(|(_, s)| s.unheard && s.settled())
            .map(|(&id, s)| (s.seen, id))
            .collect();
        if unheard.len() > MAX_UNHEARD {
            unheard.select_nth_unstable_by(MAX_UNHEARD, |a, b| b.cmp(a));
            unheard.truncate(MAX_UNHEARD);
        }
        unheard.into_iter().map(|(_, id)| id).collect()
    }

    /// Records that `sender`'s datagrams up to `seq` are committed; the acknowledgement to
    /// send, if the sender expects one. Its idle time starts again: its datagrams may have
    /// waited long for the database, and the sender with them.
    pub fn commit(&mut self, sender: u64, seq: u64, now: Instant) -> Option<Reply<A>> {
        let s = self.map.get_mut(&sender)?;
        let committed = s.committed.map_or(seq, |c| c.max(seq));
        s.committed = Some(committed);
        s.seen = now;
        s.tell(Ack::new(sender, Some(committed), None), now, true)
    }

    /// Whether the acknowledgement just sent to `sender` reached its socket. One that did not
    /// (its redirector stopped before its commit came, or its queue was full) is not forgotten
    /// for a flood of ids or pushed out of its process's ids until it is heard again, only
    /// when idle for [`IDLE`], up to [`MAX_UNHEARD`] of them: its redirector resends what
    /// was committed when it comes back, and a collector that had forgotten it took that for
    /// new and wrote it twice.
    pub fn acknowledged(&mut self, sender: u64, heard: bool) {
        if let Some(s) = self.map.get_mut(&sender) {
            s.unheard = !heard;
        }
    }

    /// The receiver reads again, after it stopped (both batches with a writer waiting for the
    /// database): nobody is forgotten for idleness until it has read for [`CAUGHT_UP`].
    pub fn resumed(&mut self, now: Instant) {
        self.reading_since = now;
    }

    /// The ids forgotten since the last call, to delete from click_senders.
    pub fn forgotten(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.forgotten)
    }

    /// Senders known.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The verdict on datagram `seq` of the known (or new) sender `s`, and its reply; updates
/// what it knows of the sender but not its accepted seq.
fn judge_known<A: Copy>(
    s: &mut Sender<A>,
    sender: u64,
    seq: u64,
    from: Option<A>,
    now: Instant,
) -> (Verdict, Option<Reply<A>>) {
    let expected = s.accepted.map_or(0, |a| a.saturating_add(1));
    // One that expects acknowledgements is asked to resend instead: a long-lived sender whose
    // record this collector lost is far ahead, and resyncs. One without an address that this
    // collector has no record of is judged below.
    let jump = s.accepted.is_some() && seq.saturating_sub(expected) > MAX_JUMP;
    if seq > MAX_SEQ || (from.is_none() && jump) {
        return (Verdict::Refused(Refusal::SeqJump), None);
    }
    s.reply = from;
    let (verdict, reply) = match (from, s.accepted) {
        // Without a record, a seq past `MAX_JUMP` is no new sender's whose first datagrams were
        // lost, but one this collector forgot (idle, or pushed out) going on: taken from
        // there, nothing counted lost. Refused, it would be for good: such a sender resends
        // nothing and is asked for nothing.
        (None, accepted) => match crate::seq::judge(accepted, seq, seq <= MAX_JUMP) {
            crate::seq::Seen::Again => (Verdict::Duplicate, None),
            crate::seq::Seen::New { lost } => (Verdict::Accept { lost }, None),
        },
        (Some(_), Some(accepted)) if seq <= accepted => {
            // Committed already: the sender missed the acknowledgement (or this collector
            // restarted), so it is told again. Pending: its commit will tell.
            let reply = match s.committed {
                Some(committed) if seq <= committed => {
                    s.tell(Ack::new(sender, Some(committed), None), now, false)
                }
                _ => None,
            };
            (Verdict::Duplicate, reply)
        }
        (Some(_), _) if seq == expected => (Verdict::Accept { lost: 0 }, None),
        (Some(_), _) => {
            let ask = Ack::new(sender, s.committed, Some(expected));
            (Verdict::Ahead, s.tell(ask, now, false))
        }
    };
    // Only what will be committed, and so write the sender's row, counts as seen (see `IDLE`):
    // a repeat or a datagram ahead of its turn from a sender that then stops writes nothing.
    if let Verdict::Accept { .. } = verdict {
        s.seen = now;
    }
    (verdict, reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sender's address; the transport's kind does not matter here.
    type Addr = &'static str;

    fn addr() -> Option<Addr> {
        Some("sender")
    }

    fn creds(pid: i32) -> Option<Creds> {
        Some(Creds {
            pid,
            uid: 1000,
            gid: 1000,
        })
    }

    fn ack(committed: Option<u64>, resend_from: Option<u64>) -> Option<Reply<Addr>> {
        let to = addr().unwrap();
        Some(Reply {
            to,
            ack: Ack::new(7, committed, resend_from),
        })
    }

    #[test]
    fn a_sender_with_an_address_is_taken_in_order_and_told_what_is_committed() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        let c = creds(10);
        assert_eq!(
            s.judge(7, (1, 1), addr(), c, now),
            (Verdict::Ahead, ack(None, Some(0)))
        );
        assert_eq!(
            s.judge(7, (0, 1), addr(), c, now).0,
            Verdict::Accept { lost: 0 }
        );
        assert_eq!(
            s.judge(7, (1, 1), addr(), c, now).0,
            Verdict::Accept { lost: 0 }
        );
        assert_eq!(
            s.judge(7, (1, 1), addr(), c, now),
            (Verdict::Duplicate, None),
            "pending"
        );
        assert_eq!(
            s.judge(7, (3, 1), addr(), c, now),
            (Verdict::Ahead, ack(None, Some(2)))
        );
        assert_eq!(
            s.judge(7, (3, 1), addr(), c, now),
            (Verdict::Ahead, None),
            "asked once"
        );
        assert_eq!(s.commit(7, 1, now), ack(Some(1), None));
        assert_eq!(
            s.judge(7, (0, 1), addr(), c, now),
            (Verdict::Duplicate, None),
            "just told"
        );
        let later = now + REPEAT_AFTER;
        assert_eq!(
            s.judge(7, (0, 1), addr(), c, later),
            (Verdict::Duplicate, ack(Some(1), None))
        );
        assert_eq!(
            s.commit(8, 0, now),
            None,
            "an unknown sender is told nothing"
        );
    }

    #[test]
    fn a_sender_whose_record_was_lost_resyncs_and_the_gap_is_counted_once() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        let c = creds(10);
        assert_eq!(
            s.judge(7, (500, 10), addr(), c, now),
            (Verdict::Ahead, ack(None, Some(0))),
            "asks for what it has no record of"
        );
        let resync = Resync::new(7, 500, 4_990);
        let skipped = Resynced::Skipped {
            first: 500,
            skipped: 500,
            unaccounted: 4_990,
            claimed: 4_990,
        };
        assert_eq!(s.resync(&resync, addr(), c, now), skipped);
        assert_eq!(s.resync(&resync, addr(), c, now), Resynced::Stale, "once");
        assert_eq!(s.judge(7, (499, 10), addr(), c, now).0, Verdict::Duplicate);
        assert_eq!(
            s.judge(7, (500, 10), addr(), c, now).0,
            Verdict::Accept { lost: 0 }
        );
        assert_eq!(s.clicks_through(7), 5_000);
        let forger = creds(11);
        assert_eq!(
            s.resync(&Resync::new(7, 900, 9_000), Some("elsewhere"), forger, now),
            Resynced::Refused(Refusal::SenderMismatch)
        );
        assert_eq!(
            s.resync(&Resync::new(7, 900, 9_000), addr(), forger, now),
            Resynced::Unasked,
            "a successor at the same address is asked first, like anyone"
        );
    }

    /// A sender this collector has no record of, its window full: its datagrams draw one
    /// resend request, not one each (each would be answered with a resync), until the
    /// request may be repeated.
    #[test]
    fn an_unknown_senders_window_is_asked_for_once() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        let c = creds(10);
        let asked = (Verdict::Ahead, ack(None, Some(0)));
        assert_eq!(s.judge(7, (500, 10), addr(), c, now), asked);
        for seq in 501..1_012 {
            assert_eq!(
                s.judge(7, (seq, 10), addr(), c, now),
                (Verdict::Ahead, None),
                "asked already: {seq}"
            );
        }
        let later = now + REPEAT_AFTER;
        assert_eq!(s.judge(7, (500, 10), addr(), c, later), asked, "again");
        let resync = Resync::new(7, 500, 4_990);
        assert!(matches!(
            s.resync(&resync, addr(), c, later),
            Resynced::Skipped { .. }
        ));
    }

    /// Resend requests past `MAX_ASKED` forget the oldest: under a flood of fresh ids, each
    /// ahead of its turn, a request made after them stays for as many more, time for its
    /// sender's resync.
    #[test]
    fn past_max_asked_the_oldest_request_is_forgotten() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        // Each id one ahead of its turn, from a process of its own: asked from seq 0.
        let ahead_at = |s: &mut Senders<Addr>, id: u64, now| {
            let verdict = s.judge(id, (1, 1), addr(), creds(id as i32), now).0;
            assert_eq!(verdict, Verdict::Ahead, "{id}");
        };
        let ahead = |s: &mut Senders<Addr>, id: u64| ahead_at(s, id, now);
        let answered = |s: &mut Senders<Addr>, id: u64| {
            let resync = Resync::new(id, 1, 0);
            s.resync(&resync, addr(), creds(id as i32), now) != Resynced::Unasked
        };
        let live = 1;
        ahead(&mut s, live);
        for id in 2..=MAX_ASKED as u64 {
            ahead(&mut s, id);
        }
        // Asked again (a request is repeated after a while), its request the newest: a flood of
        // as many more keeps it.
        ahead_at(&mut s, live, now + Duration::from_secs(1));
        for id in 0..MAX_ASKED as u64 - 1 {
            ahead(&mut s, 10_000 + id);
        }
        assert!(s.asked.len() <= MAX_ASKED);
        assert!(answered(&mut s, live), "the live sender's is kept");
        let went = (2..=MAX_ASKED as u64).filter(|&id| !answered(&mut s, id));
        assert_eq!(went.count(), MAX_ASKED - 1, "the oldest requests went");
        let kept = (0..MAX_ASKED as u64 - 1).filter(|&id| answered(&mut s, 10_000 + id));
        assert_eq!(kept.count(), MAX_ASKED - 1, "the newest are kept");
        // One sender asked again and again keeps one request, and the order stays bounded.
        for i in 0..3 * MAX_ASKED as u64 {
            ahead_at(&mut s, 50_000, now + Duration::from_secs(2 + i));
        }
        assert_eq!(s.asked.len(), 1);
        assert!(s.asked_order.len() <= 2 * MAX_ASKED + 1);
    }

    #[test]
    fn a_resync_claiming_more_clicks_than_any_sender_serves_is_refused() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        let c = creds(10);
        let far = 1 << 60;
        assert_eq!(s.judge(9, (far, 1), addr(), c, now).0, Verdict::Ahead);
        assert_eq!(
            s.resync(&Resync::new(9, far + 1, u64::MAX), addr(), c, now),
            Resynced::Refused(Refusal::BadResync),
            "more clicks than the record keeps"
        );
        let fresh = 1 << 49;
        assert_eq!(s.judge(8, (fresh, 1), addr(), c, now).0, Verdict::Ahead);
        assert_eq!(
            s.resync(&Resync::new(8, fresh, MAX_SEQ), addr(), c, now),
            Resynced::Refused(Refusal::BadResync),
            "more clicks than any redirector serves, though its seqs could hold them"
        );
        assert_eq!(s.judge(7, (1, 10), addr(), c, now).0, Verdict::Ahead);
        assert_eq!(
            s.resync(&Resync::new(7, 2, 10), addr(), c, now),
            Resynced::Skipped {
                first: 2,
                skipped: 2,
                unaccounted: 10,
                claimed: 10,
            }
        );
        assert_eq!(
            s.judge(7, (2, u64::MAX), addr(), c, now).0,
            Verdict::Accept { lost: 0 }
        );
        assert_eq!(
            s.clicks_through(7),
            MAX_SEQ,
            "held at the most the record keeps, not wrapped"
        );
    }

    /// A row from before migration 12 counts a sender's clicks from 0 there: a resync of it
    /// claims every click before as skipped, more than its skipped datagrams can hold. Counted
    /// as what they can hold, and the sender goes on; refused, it was asked again and refused
    /// again, for good.
    #[test]
    fn a_resync_of_a_record_whose_count_is_short_counts_what_the_skipped_seqs_hold() {
        let mut s = Senders::<Addr>::committed([(7, 99, 0)]);
        let now = Instant::now();
        let c = creds(10);
        assert_eq!(s.judge(7, (101, 10), addr(), c, now).0, Verdict::Ahead);
        assert_eq!(
            s.resync(&Resync::new(7, 101, 10_000_000), addr(), c, now),
            Resynced::Skipped {
                first: 101,
                skipped: 1,
                unaccounted: MAX_CLICKS_PER_DATAGRAM,
                claimed: 10_000_000,
            }
        );
        assert_eq!(
            s.judge(7, (101, 10), addr(), c, now).0,
            Verdict::Accept { lost: 0 },
            "the sender goes on"
        );
        assert_eq!(
            s.clicks_through(7),
            10_000_010,
            "the sender's count from now on"
        );
    }

    #[test]
    fn seqs_and_click_counts_past_what_the_record_keeps_are_refused() {
        let mut s = Senders::<Addr>::committed([(7, 99, 1_000)]);
        let now = Instant::now();
        let c = creds(10);
        let jump = Verdict::Refused(Refusal::SeqJump);
        assert_eq!(s.judge(7, (MAX_SEQ + 1, 1), addr(), c, now).0, jump);
        assert_eq!(
            s.judge(8, (MAX_SEQ + 1, 1), addr(), c, now).0,
            jump,
            "a new id"
        );
        assert_eq!(s.judge(8, (MAX_SEQ + 1, 1), None, c, now).0, jump);
        let far = 1 << 49;
        assert_eq!(
            s.judge(7, (far, 1), addr(), c, now),
            (Verdict::Ahead, ack(Some(99), Some(100)))
        );
        assert_eq!(
            s.resync(&Resync::new(7, far, MAX_SEQ + 1), addr(), c, now),
            Resynced::Refused(Refusal::BadResync),
            "more clicks than the record keeps, fewer than the skipped datagrams could hold"
        );
        assert_eq!(
            s.resync(&Resync::new(7, far, MAX_SEQ), addr(), c, now),
            Resynced::Refused(Refusal::BadResync),
            "as many as it keeps, more than a resync may count"
        );
        assert_eq!(
            s.resync(
                &Resync::new(7, far, 1_000 + MAX_UNACCOUNTED),
                addr(),
                c,
                now
            ),
            Resynced::Skipped {
                first: far,
                skipped: far - 100,
                unaccounted: MAX_UNACCOUNTED,
                claimed: MAX_UNACCOUNTED,
            },
            "as many as a resync may count"
        );
        // A record near the end of the seqs: a resync may not move it past them.
        let near = MAX_SEQ - 10;
        let mut s = Senders::<Addr>::committed([(6, near, 1_000)]);
        assert_eq!(s.judge(6, (near + 2, 1), addr(), c, now).0, Verdict::Ahead);
        assert_eq!(
            s.resync(&Resync::new(6, MAX_SEQ + 1_000, 1_000), addr(), c, now),
            Resynced::Refused(Refusal::BadResync),
            "past the seqs the record keeps"
        );
        assert_eq!(
            s.resync(&Resync::new(6, MAX_SEQ + 1, 1_000), addr(), c, now),
            Resynced::Skipped {
                first: MAX_SEQ + 1,
                skipped: 10,
                unaccounted: 0,
                claimed: 0,
            },
            "up to the last seq the record keeps"
        );
    }

    #[test]
    fn a_record_rolled_back_counts_only_what_it_lacks_and_far_seqs_are_asked_for() {
        let mut s = Senders::<Addr>::committed([(7, 99, 1_000)]);
        let now = Instant::now();
        let c = creds(10);
        let far = 99 + 2 * MAX_JUMP;
        assert_eq!(
            s.judge(7, (far, 10), addr(), c, now),
            (Verdict::Ahead, ack(Some(99), Some(100))),
            "a sender with an address is asked, not refused"
        );
        let elsewhere = Some("elsewhere");
        assert_eq!(
            s.resync(&Resync::new(7, 300, 3_000), elsewhere, c, now),
            Resynced::Unasked,
            "asked at another address"
        );
        assert_eq!(
            s.resync(&Resync::new(8, 300, 3_000), addr(), c, now),
            Resynced::Unasked,
            "never asked"
        );
        assert_eq!(
            s.resync(&Resync::new(7, 100, 1_000), addr(), c, now),
            Resynced::Stale,
            "the record is not behind"
        );
        let implausible = Resync::new(7, 300, u64::MAX);
        assert_eq!(
            s.resync(&implausible, addr(), c, now),
            Resynced::Refused(Refusal::BadResync)
        );
        assert_eq!(
            s.resync(&Resync::new(7, 300, 3_000), None, c, now),
            Resynced::Refused(Refusal::BadResync),
            "a sender without an address is never asked to resend"
        );
        assert_eq!(
            s.resync(&Resync::new(7, 300, 3_000), addr(), c, now),
            Resynced::Skipped {
                first: 300,
                skipped: 200,
                unaccounted: 2_000,
                claimed: 2_000,
            }
        );
        assert_eq!(
            s.resync(&Resync::new(7, 0, 0), addr(), c, now),
            Resynced::Stale
        );
    }

    #[test]
    fn a_sender_without_an_address_gets_gaps_counted_and_nothing_back() {
        let mut s = Senders::<Addr>::committed([(7, 4, 0)]);
        let now = Instant::now();
        assert_eq!(
            s.judge(7, (4, 1), None, None, now),
            (Verdict::Duplicate, None)
        );
        assert_eq!(
            s.judge(7, (8, 1), None, None, now),
            (Verdict::Accept { lost: 3 }, None)
        );
        assert_eq!(
            s.judge(9, (2, 1), None, None, now),
            (Verdict::Accept { lost: 2 }, None)
        );
        assert_eq!(s.commit(7, 8, now), None);
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn a_restarted_collector_acknowledges_what_was_committed_before_it() {
        let mut s = Senders::<Addr>::committed([(7, 4, 0)]);
        let now = Instant::now();
        let c = creds(10);
        assert_eq!(
            s.judge(7, (3, 1), addr(), c, now),
            (Verdict::Duplicate, ack(Some(4), None))
        );
        assert_eq!(
            s.judge(7, (6, 1), addr(), c, now),
            (Verdict::Ahead, ack(Some(4), Some(5)))
        );
        assert_eq!(
            s.judge(7, (5, 1), addr(), c, now).0,
            Verdict::Accept { lost: 0 }
        );
    }

    #[test]
    fn a_later_process_of_the_same_user_at_the_same_address_takes_the_id_over() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        assert_eq!(
            s.judge(7, (0, 1), addr(), creds(10), now).0,
            Verdict::Accept { lost: 0 }
        );
        let mismatch = Verdict::Refused(Refusal::SenderMismatch);
        assert_eq!(
            s.judge(7, (1, 1), Some("elsewhere"), creds(11), now).0,
            mismatch,
            "another address: a copy of the state, not its successor"
        );
        let other_uid = Some(Creds {
            pid: 11,
            uid: 0,
            gid: 0,
        });
        assert_eq!(
            s.judge(7, (1, 1), addr(), other_uid, now).0,
            mismatch,
            "another user"
        );
        assert_eq!(
            s.judge(7, (1, 1), addr(), creds(11), now).0,
            Verdict::Accept { lost: 0 },
            "the successor goes on"
        );
        assert_eq!(
            s.judge(7, (2, 1), addr(), creds(10), now).0,
            mismatch,
            "the process it replaced does not take it back"
        );
        let successor = Owner::of(creds(11)).unwrap();
        assert_eq!(s.by_process.keys().collect::<Vec<_>>(), [&successor]);
        assert_eq!(s.replaced(7), Some(10));
        s.replaced_gone(7);
        assert_eq!(s.replaced(7), None);
        assert_eq!(
            s.judge(7, (2, 1), addr(), creds(10), now).0,
            Verdict::Accept { lost: 0 },
            "once the process replaced is gone, its pid is a later process's"
        );
        assert_eq!(s.replaced(7), Some(11), "whose successor it is, in turn");
    }

    /// A later process of the same user, at another address: the address it replaces is
    /// named, so that the transport can look whether anyone still listens there; once moved,
    /// the claim takes the id over from its own address, and the process replaced cannot
    /// take it back from the old one.
    #[test]
    fn a_later_process_of_the_same_user_elsewhere_takes_the_id_over_once_moved() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        let (first, next, elsewhere) = (creds(10), creds(11), Some("elsewhere"));
        s.judge(7, (0, 1), addr(), first, now);
        assert_eq!(
            s.claimed_from_elsewhere(7, addr(), next),
            None,
            "the same address"
        );
        assert_eq!(
            s.claimed_from_elsewhere(7, elsewhere, first),
            None,
            "its owner"
        );
        let other_uid = Some(Creds {
            uid: 0,
            ..next.unwrap()
        });
        assert_eq!(
            s.claimed_from_elsewhere(7, elsewhere, other_uid),
            None,
            "another user"
        );
        assert_eq!(
            s.claimed_from_elsewhere(8, elsewhere, next),
            None,
            "unknown"
        );
        assert_eq!(s.claimed_from_elsewhere(7, elsewhere, next), addr());
        let mismatch = Verdict::Refused(Refusal::SenderMismatch);
        assert_eq!(s.judge(7, (1, 1), elsewhere, next, now).0, mismatch);
        s.moved(7, "elsewhere");
        assert_eq!(
            s.judge(7, (1, 1), elsewhere, next, now).0,
            Verdict::Accept { lost: 0 },
            "the successor goes on from its own address"
        );
        let replaced = Owner::of(first).unwrap();
        assert!(
            !s.by_process.contains_key(&replaced),
            "the process replaced holds no ids any more"
        );
        assert_eq!(s.claimed_from_elsewhere(7, addr(), first), None, "replaced");
        assert_eq!(s.judge(7, (2, 1), addr(), first, now).0, mismatch);
    }

    /// A sender loaded at start with its address (`click_senders.reply_to`) is taken from
    /// there only, or from an address it moved to, not by the first process to send its id:
    /// that was anyone's after a collector restart, and the redirector whose id it was was
    /// refused for good. As the user recorded, where one was. One loaded without an address
    /// is anyone's, as before.
    #[test]
    fn a_sender_loaded_with_its_address_is_taken_from_there_only() {
        let now = Instant::now();
        let loaded = || {
            let at = [(7, "sender", Some(1000))];
            Senders::<Addr>::committed([(7, 4, 40), (8, 4, 40)]).replying_at(at)
        };
        let mismatch = Verdict::Refused(Refusal::SenderMismatch);
        let (forger, redirector) = (creds(66), creds(10));
        let other_user = Some(Creds {
            uid: 0,
            ..redirector.unwrap()
        });

        let mut s = loaded();
        assert_eq!(
            s.judge(7, (5, 1), None, forger, now).0,
            mismatch,
            "no address"
        );
        assert_eq!(s.judge(7, (5, 1), Some("forger"), forger, now).0, mismatch);
        let asked = Resync::new(7, 9, 90);
        assert_eq!(
            s.resync(&asked, Some("forger"), forger, now),
            Resynced::Refused(Refusal::SenderMismatch)
        );
        let accepted = Verdict::Accept { lost: 0 };
        assert_eq!(
            s.judge(7, (5, 1), addr(), other_user, now).0,
            mismatch,
            "at its address, as another user"
        );
        assert_eq!(s.judge(7, (5, 1), addr(), redirector, now).0, accepted);
        assert_eq!(
            s.judge(8, (5, 1), None, forger, now).0,
            accepted,
            "loaded without an address: anyone's, as before"
        );

        // A collector whose `PrivateUsers=` changed across its restart: the uid recorded, or
        // the one seen now, is the overflow uid, which says nothing; the address decides.
        let overflow = Some(Creds {
            uid: OVERFLOW_UID,
            ..redirector.unwrap()
        });
        let mut private = loaded();
        assert_eq!(private.judge(7, (5, 1), addr(), overflow, now).0, accepted);
        assert_eq!(private.judge(7, (6, 1), None, forger, now).0, mismatch);
        let mut s = Senders::<Addr>::committed([(7, 4, 40)]).replying_at([(
            7,
            "sender",
            Some(OVERFLOW_UID),
        )]);
        assert_eq!(s.judge(7, (5, 1), Some("forger"), forger, now).0, mismatch);
        assert_eq!(s.judge(7, (5, 1), addr(), redirector, now).0, accepted);

        // Restarted elsewhere while the collector restarted too: moved, as a known one.
        let mut s = loaded();
        let elsewhere = Some("elsewhere");
        assert_eq!(s.claimed_from_elsewhere(7, elsewhere, other_user), None);
        assert_eq!(s.claimed_from_elsewhere(7, elsewhere, redirector), addr());
        assert_eq!(s.claimed_from_elsewhere(7, None, redirector), None);
        s.moved(7, "elsewhere");
        assert_eq!(s.judge(7, (5, 1), elsewhere, redirector, now).0, accepted);
    }

    #[test]
    fn an_id_belongs_to_the_process_that_sent_it_first_and_forged_seqs_are_refused() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        assert_eq!(
            s.judge(7, (0, 1), None, creds(10), now).0,
            Verdict::Accept { lost: 0 }
        );
        let mismatch = Verdict::Refused(Refusal::SenderMismatch);
        assert_eq!(
            s.judge(7, (1, 1), None, creds(11), now).0,
            mismatch,
            "another pid"
        );
        let other_uid = Some(Creds {
            pid: 10,
            uid: 0,
            gid: 0,
        });
        assert_eq!(
            s.judge(7, (1, 1), None, other_uid, now).0,
            mismatch,
            "another uid"
        );
        assert_eq!(
            s.judge(7, (1, 1), None, creds(10), now).0,
            Verdict::Accept { lost: 0 }
        );
        let jump = Verdict::Refused(Refusal::SeqJump);
        assert_eq!(
            s.judge(7, (9_000_000_000_000_000_000, 1), None, creds(10), now)
                .0,
            jump
        );
        assert_eq!(
            s.judge(8, (MAX_JUMP + 1, 1), None, creds(12), now).0,
            Verdict::Accept { lost: 0 },
            "a first seq: a sender forgotten, going on, nothing known lost"
        );
        assert_eq!(
            s.judge(9, (MAX_JUMP, 1), None, creds(12), now).0,
            Verdict::Accept { lost: MAX_JUMP },
            "near its start: its first datagrams lost"
        );
        assert_eq!(
            s.judge(7, (2 + MAX_JUMP, 1), None, creds(10), now).0,
            Verdict::Accept { lost: MAX_JUMP }
        );
        assert_eq!(s.len(), 3, "refused ids take no memory");
    }

    #[test]
    fn a_flood_of_fresh_ids_keeps_each_process_to_a_few_and_forgets_the_rest() {
        let mut s = Senders::<Addr>::committed([(1, 5, 0)]);
        let now = Instant::now();
        for id in 100..10_100 {
            assert_eq!(
                s.judge(id, (0, 1), None, creds(66), now).0,
                Verdict::Accept { lost: 0 }
            );
        }
        assert_eq!(
            s.len(),
            1 + PER_PROCESS,
            "the flooder's last ids, and the other sender"
        );
        let forgotten = s.forgotten();
        assert_eq!(forgotten.len(), 10_000 - PER_PROCESS);
        assert!(!forgotten.contains(&1));
        assert!(s.forgotten().is_empty(), "reported once");
    }

    /// A process past its quota of ids while their datagrams wait for their commit: none that
    /// expects an acknowledgement is forgotten before its commit, so each commit is
    /// acknowledged (forgotten, a sender would resend and have its clicks written twice); once
    /// committed, the oldest go.
    #[test]
    fn a_process_past_its_few_ids_keeps_those_waiting_for_their_commit() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        let ids = 1..=PER_PROCESS as u64 + 2;
        for id in ids.clone() {
            s.judge(id, (0, 1), addr(), creds(66), now);
        }
        assert_eq!(s.len(), PER_PROCESS + 2, "all wait for their commit");
        assert!(s.forgotten().is_empty());
        let committed = now + SWEEP_EVERY / 2;
        for id in ids {
            let acked = s.commit(id, 0, committed).map(|r| r.ack.committed);
            assert_eq!(acked, Some(Some(0)), "sender {id}'s commit is acknowledged");
        }
        let again = s.judge(1, (0, 1), addr(), creds(66), committed + REPEAT_AFTER);
        let acked = again.1.map(|r| r.ack.committed);
        assert_eq!(
            (again.0, acked),
            (Verdict::Duplicate, Some(Some(0))),
            "a resend after a lost acknowledgement is acknowledged again, not written twice"
        );
        s.judge(98, (0, 1), addr(), creds(67), now + SWEEP_EVERY);
        assert!(
            s.forgotten().is_empty(),
            "swept half a minute after the commit"
        );
        s.judge(99, (0, 1), addr(), creds(67), now + 2 * SWEEP_EVERY);
        assert_eq!(s.len(), PER_PROCESS + 2);
        assert_eq!(
            s.forgotten(),
            [1, 2],
            "the oldest two, a minute after their commit"
        );
    }

    /// One with an address pushed out just after its commit is kept as one waiting for it
    /// is: its acknowledgement may be lost, and the repeat that then comes is acknowledged
    /// again. Nor does it go while the receiver reads what queued while it was not reading.
    #[test]
    fn an_id_pushed_out_just_after_its_commit_is_kept_for_a_repeat() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        for id in 1..=PER_PROCESS as u64 {
            s.judge(id, (0, 1), addr(), creds(66), now);
            s.commit(id, 0, now);
        }
        s.judge(5, (0, 1), addr(), creds(66), now);
        let (verdict, reply) = s.judge(1, (0, 1), addr(), creds(66), now + REPEAT_AFTER);
        assert_eq!(verdict, Verdict::Duplicate, "a repeat, not written twice");
        assert_eq!(reply.map(|r| r.ack.committed), Some(Some(0)));
        let resumed = now + SWEEP_EVERY;
        s.resumed(resumed);
        s.judge(98, (0, 1), addr(), creds(67), resumed + CAUGHT_UP / 2);
        assert!(s.forgotten().is_empty(), "not caught up yet");
        s.judge(99, (0, 1), addr(), creds(67), resumed + CAUGHT_UP * 2);
        assert_eq!(s.forgotten(), [1]);
    }

    /// The id a datagram binds to its process is never the one its quota pushes out, even when
    /// every older id of the process waits for its commit: a settled id taken over, and a new
    /// sender without an address (which, forgotten, would have each datagram counted as lost).
    #[test]
    fn the_id_just_bound_stays_when_the_older_ones_all_wait_for_their_commit() {
        let mut s = Senders::<Addr>::committed([(100, 5, 6)]);
        let now = Instant::now();
        let waiting = 1..=PER_PROCESS as u64;
        for id in waiting.clone() {
            s.judge(id, (0, 1), addr(), creds(66), now);
        }
        s.judge(100, (6, 1), addr(), creds(65), now);
        s.commit(100, 6, now);
        assert_eq!(
            s.judge(100, (7, 1), addr(), creds(66), now).0,
            Verdict::Accept { lost: 0 },
            "taken over by the process whose ids all wait"
        );
        let acked = s.commit(100, 7, now).map(|r| r.ack.committed);
        assert_eq!(acked, Some(Some(7)), "the id taken over is acknowledged");
        assert!(s.knows(100));
        s.judge(200, (0, 1), None, creds(66), now);
        assert_eq!(
            s.judge(200, (1, 1), None, creds(66), now).0,
            Verdict::Accept { lost: 0 },
            "the sender without an address is still known"
        );
        for id in waiting {
            let acked = s.commit(id, 0, now).map(|r| r.ack.committed);
            assert_eq!(acked, Some(Some(0)), "sender {id}'s commit is acknowledged");
        }
        s.judge(99, (0, 1), addr(), creds(67), now + SWEEP_EVERY);
        assert_eq!(s.forgotten(), [1, 2], "pushed out by 100 and 200");
        assert!(s.knows(100) && s.knows(200));
    }

    /// The quota pushes out the id least recently used, not the one first registered: a busy
    /// id stays among its process's ids however many come after it, and one pushed out is
    /// taken back at its next datagram, not forgotten at its first quiet minute.
    #[test]
    fn the_quota_pushes_out_the_id_least_recently_used() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        for id in 1..=PER_PROCESS as u64 {
            s.judge(id, (0, 1), addr(), creds(0), now);
            s.commit(id, 0, now);
        }
        let later = now + SWEEP_EVERY / 4;
        for id in 100..100 + HIDDEN_PROCESSES as u64 {
            s.judge(1, (id - 99, 1), addr(), creds(0), later);
            s.judge(id, (0, 1), addr(), creds(0), later);
            s.commit(id, 0, later);
        }
        s.commit(1, HIDDEN_PROCESSES as u64, later);
        assert!(!s.map[&1].over_quota, "used all along");
        assert!(
            s.map[&2].over_quota,
            "first registered after 1, unused since"
        );
        // 2 again: taken back, and another of the least recently used pushed out instead.
        s.judge(2, (1, 1), addr(), creds(0), later);
        s.commit(2, 1, later);
        assert!(!s.map[&2].over_quota);
        s.judge(99, (0, 1), addr(), creds(67), later + 2 * SWEEP_EVERY);
        let forgotten = s.forgotten();
        assert!(
            !forgotten.contains(&1) && !forgotten.contains(&2),
            "{forgotten:?}"
        );
        assert!(
            forgotten.contains(&3) && forgotten.contains(&100),
            "{forgotten:?}"
        );
    }

    /// One whose last acknowledgement did not reach its socket (its redirector stopped before
    /// the commit) is kept when pushed out, however long it is away short of `IDLE`: its
    /// resend of what was committed is a repeat, acknowledged again, not taken for new and
    /// written twice. Heard again, it goes as any other.
    #[test]
    fn an_id_whose_acknowledgement_went_unheard_is_kept_for_its_resend() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        // 1, 2 and 3 pushed out; 1 unheard, 3 unheard then heard again.
        for id in 1..=PER_PROCESS as u64 + 3 {
            s.judge(id, (0, 1), addr(), creds(66), now);
            s.commit(id, 0, now);
            s.acknowledged(id, id != 1 && id != 3);
        }
        s.acknowledged(3, true);
        let away = now + 10 * SWEEP_EVERY;
        s.judge(99, (0, 1), addr(), creds(67), away);
        let mut forgotten = s.forgotten();
        forgotten.sort();
        assert_eq!(forgotten, [2, 3], "pushed out and heard");
        let (verdict, reply) = s.judge(1, (0, 1), addr(), creds(68), away);
        assert_eq!(verdict, Verdict::Duplicate, "a repeat, not written twice");
        assert_eq!(reply.map(|r| r.ack.committed), Some(Some(0)));
    }

    /// Of more than `MAX_UNHEARD` senders not heard, the most recently seen are kept: a flood of
    /// ids at addresses nobody reads does not grow memory past the bound.
    #[test]
    fn the_senders_kept_unheard_are_bounded() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        let n = MAX_UNHEARD as u64 + 5;
        for id in 0..n {
            let at = now + Duration::from_millis(id);
            s.judge(id, (0, 1), addr(), creds(1000 + id as i32), at);
            s.commit(id, 0, at);
            s.acknowledged(id, false);
        }
        let kept = s.unheard_kept();
        assert_eq!(kept.len(), MAX_UNHEARD);
        assert!(
            (0..5).all(|id| !kept.contains(&id)),
            "the least recently seen go"
        );
    }

    /// An id pushed out of its process's ids while it waited, then taken over by a later
    /// process: it is that process's now, and its commit does not forget it.
    #[test]
    fn an_id_pushed_out_then_taken_over_stays_with_its_new_process() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        for id in 1..=PER_PROCESS as u64 + 1 {
            s.judge(id, (0, 1), addr(), creds(65), now);
        }
        assert_eq!(
            s.judge(1, (1, 1), addr(), creds(66), now).0,
            Verdict::Accept { lost: 0 }
        );
        let acked = s.commit(1, 1, now).map(|r| r.ack.committed);
        assert_eq!(acked, Some(Some(1)));
        s.judge(99, (0, 1), addr(), creds(67), now + SWEEP_EVERY);
        assert!(s.knows(1), "kept by the process that took it over");
        assert!(s.forgotten().is_empty());
    }

    /// Processes of pid namespaces the collector cannot see (other containers') all read as
    /// pid 0: they share no quota, or each one's ids would push out the others', and a
    /// redirector's, forgotten once quiet, would resync and count its history unaccounted.
    #[test]
    fn processes_of_other_pid_namespaces_do_not_share_one_quota() {
        let mut s = Senders::<Addr>::default();
        let now = Instant::now();
        let ids = 1..=PER_PROCESS as u64 + 2;
        for id in ids.clone() {
            s.judge(id, (0, 1), addr(), creds(0), now);
            s.commit(id, 0, now);
        }
        s.judge(99, (0, 1), addr(), creds(67), now + 3 * SWEEP_EVERY);
        assert_eq!(s.forgotten(), [0u64; 0], "none pushed out");
        assert!(ids.clone().all(|id| s.knows(id)));
        // Bounded together: a flood of fresh ids from one of them.
        for id in 1000..3000 {
            s.judge(id, (0, 1), None, creds(0), now + 3 * SWEEP_EVERY);
        }
        assert_eq!(
            s.len(),
            HIDDEN_PROCESSES + PER_PROCESS + 3,
            "the flood's last, 99's"
        );
    }

    #[test]
    fn ids_idle_for_29_days_are_forgotten() {
        let mut s = Senders::<Addr>::committed([(1, 5, 0)]);
        let start = Instant::now();
        s.judge(2, (0, 1), None, creds(3), start);
        s.commit(2, 0, start);
        let later = start + IDLE;
        // Datagrams hours apart, the receiver reading all along.
        s.judge(
            3,
            (0, 1),
            None,
            creds(3),
            later - Duration::from_secs(2 * 3600),
        );
        s.judge(4, (0, 1), None, creds(5), later);
        assert_eq!(s.len(), 2);
        let mut forgotten = s.forgotten();
        forgotten.sort();
        assert_eq!(forgotten, [1, 2]);
    }

    /// A redirector stopped for weeks on its state region, datagrams still in its window, comes
    /// back to a collector that still knows it: its next seq is taken as it comes, with no
    /// resend from seq 0, nor a resync that would count its acknowledged clicks as unaccounted.
    #[test]
    fn a_sender_back_after_weeks_away_is_still_known() {
        let mut s = Senders::<Addr>::committed([(1, 5, 40)]);
        let start = Instant::now();
        let back = start + Duration::from_secs(21 * 24 * 3600);
        // Another sender's datagram a moment before: the receiver has been reading.
        s.judge(2, (0, 1), addr(), creds(3), back - CAUGHT_UP);
        let (verdict, reply) = s.judge(1, (6, 1), addr(), creds(5), back);
        assert_eq!(verdict, Verdict::Accept { lost: 0 });
        assert_eq!(reply, None, "no resend asked for");
        assert!(s.forgotten().is_empty());
        assert_eq!(s.clicks_through(1), 41);
    }

    /// A sender seen since its last commit only in repeats of what is committed (a redirector
    /// that missed its last acknowledgement, back weeks later, then renewing its id) or ahead
    /// of its turn is idle since that commit, which last wrote its row: it is forgotten a day
    /// before that row is pruned.
    #[test]
    fn only_datagrams_accepted_count_as_seen() {
        let mut s = Senders::<Addr>::default();
        let start = Instant::now();
        s.judge(1, (0, 1), addr(), creds(3), start);
        s.commit(1, 0, start);
        let back = start + Duration::from_secs(20 * 24 * 3600);
        assert_eq!(
            s.judge(1, (0, 1), addr(), creds(3), back).0,
            Verdict::Duplicate
        );
        assert_eq!(s.judge(1, (5, 1), addr(), creds(3), back).0, Verdict::Ahead);
        s.judge(2, (0, 1), addr(), creds(5), start + IDLE);
        assert_eq!(s.forgotten(), [1]);
    }

    /// A flood of senders past `MAX_SENDERS` pushes out the least recently seen, but not one
    /// whose datagrams wait for their commit, however long ago it was seen.
    #[test]
    fn past_the_most_senders_the_oldest_go_but_not_one_waiting_for_its_commit() {
        let start = Instant::now();
        let loaded = (1..=MAX_SENDERS as u64).map(|id| (id, 5, 0));
        let mut s = Senders::<Addr>::committed(loaded);
        let waiting = 0;
        s.judge(waiting, (0, 1), None, creds(3), start);
        assert!(s.forgotten().is_empty());
        s.judge(MAX_SENDERS as u64 + 1, (0, 1), None, creds(5), start);
        let forgotten = s.forgotten();
        assert_eq!(forgotten.len(), MAX_SENDERS / 10 + 1, "back to nine tenths");
        assert!(s.knows(waiting), "its datagram waits for its commit");
    }

    /// A flood of fresh ids from one process with an address, committed a batch at a time:
    /// past the most senders, the ids the flood pushed out of its process's while they waited
    /// go first, not the other senders (older, and so first by age alone).
    #[test]
    fn past_the_most_senders_a_flood_with_an_address_forgets_its_own() {
        let start = Instant::now();
        let others = MAX_SENDERS as u64 - 20_000;
        let mut s = Senders::<Addr>::committed((1..=others).map(|id| (id, 5, 0)));
        let later = start + Duration::from_secs(1);
        let flood: Vec<u64> = (others + 1..=others + 30_000).collect();
        for batch in flood.chunks(1_000) {
            for &id in batch {
                s.judge(id, (0, 1), addr(), creds(66), later);
            }
            for &id in batch {
                s.commit(id, 0, later);
            }
        }
        let forgotten = s.forgotten();
        assert!(forgotten.len() >= MAX_SENDERS / 10, "{}", forgotten.len());
        assert!(forgotten.iter().all(|&id| id > others), "only the flood's");
        assert!(s.len() <= MAX_SENDERS);
    }

    /// A database away for days holds the datagrams accepted before it went, and the
    /// receiver reads nothing meanwhile: for a while after it reads again nobody is forgotten
    /// for idleness, the senders waiting for their commit are kept after that, and a commit
    /// counts as seen.
    #[test]
    fn a_sender_waiting_for_its_commit_is_not_forgotten_however_long_it_waits() {
        let mut s = Senders::<Addr>::committed([(1, 5, 0), (8, 5, 0)]);
        let start = Instant::now();
        s.judge(2, (0, 1), None, creds(3), start);
        let back = start + 2 * IDLE;
        s.resumed(back);
        s.judge(4, (0, 1), None, creds(5), back);
        assert!(s.forgotten().is_empty(), "reading again: nobody yet");
        // Sender 8's datagram, queued during the pause, is read a moment later.
        s.judge(8, (6, 1), None, creds(9), back + Duration::from_millis(1));
        s.judge(6, (0, 1), None, creds(7), back + CAUGHT_UP);
        assert_eq!(s.forgotten(), [1], "the idle one only");
        s.commit(2, 0, back);
        s.judge(10, (0, 1), None, creds(11), back + IDLE - SWEEP_EVERY);
        assert!(s.forgotten().is_empty(), "seen at its commit");
        assert_eq!(s.len(), 5);
    }
}
