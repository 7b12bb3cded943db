//! The state region: the ring and the resend window in one mapping of memory that can outlive
//! the process, so that a redirector killed with SIGKILL loses no click it served.
//!
//! The memory is a file (`--state-file`), or a memfd that systemd keeps in the service's file
//! descriptor store (uploaded at start with `FDSTORE=1`, passed back through `LISTEN_FDS` under
//! the name `state`), or, with neither, a memfd nobody keeps (the state lives as long as the
//! process, as before). A new process adopts the region: the same sender id and seq, what the
//! window holds sent again, then what the ring holds.
//!
//! Layout (native endianness and alignment: a region is read only by a redirector on the same
//! machine): a header of [`HEADER_SIZE`] bytes (magic, layout version, geometry, sender id,
//! the window's bounds, the ring's positions), the ring's cells, the window's slot records,
//! the window's datagram bytes. A region of another layout version is refused with a message;
//! one of another geometry (another `--ring-capacity`, `--resend-window` or `--datagram-size`)
//! is adopted with its own geometry, which stays until a start finds it empty.
//!
//! Crash consistency, for a process killed at any instant:
//! - a push writes its slot, then publishes it (`ring`); an unpublished claim is torn;
//! - the drain releases ring positions only after the window published the datagram holding
//!   them, and the datagram records where it ends in the ring (its tag): a process killed in
//!   between has the next one release them, never send them twice;
//! - a new sender id (after a day idle) is journalled: `renewing` set, the id written, the
//!   window restarted, `renewing` cleared; found set, the adoption takes another new id;
//! - a new region's header sizes are written first, then its cells, then its magic: a
//!   header without magic that holds no more than sizes, in a file as long as their layout,
//!   is a layout cut short, laid out again.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nix::fcntl::{Flock, FlockArg};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
use protocol::window::{Marks, Meta, Store, Window};

use crate::ring::{Cell, Position, Ring};

const MAGIC: [u8; 8] = *b"CLKSTATE";
/// Bumped on any change of the layout: a region of another version is refused, not misread.
/// Version 2: ring slots hold a click's dimensions. Version 1's header is this one's, so a
/// version-1 region that holds nothing (what a clean stop leaves) is laid out anew.
pub const LAYOUT_VERSION: u32 = 2;
const HEADER_SIZE: usize = 256;
/// The name of the region's descriptor in systemd's file descriptor store.
pub const FDNAME: &str = "state";

/// The sizes a region is laid out for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Ring cells.
    pub ring: u64,
    /// Window slots.
    pub window: u64,
    /// Bytes of each window slot: the datagram size limit.
    pub slot_size: u64,
}

impl Geometry {
    /// Sizes a redirector could have been configured with (see `config`).
    fn is_valid(&self) -> bool {
        let datagram = protocol::wire::MIN_DATAGRAM as u64..=protocol::wire::MAX_DATAGRAM as u64;
        (1..=1 << 28).contains(&self.ring)
            && (1..=65_536).contains(&self.window)
            && datagram.contains(&self.slot_size)
    }

    fn offsets(&self) -> Option<Offsets> {
        let cells = HEADER_SIZE;
        let meta = cells.checked_add(
            usize::try_from(self.ring)
                .ok()?
                .checked_mul(Ring::CELL_SIZE)?,
        )?;
        let window = usize::try_from(self.window).ok()?;
        let records = window.checked_add(1)?;
        let bytes = meta.checked_add(records.checked_mul(std::mem::size_of::<Meta>())?)?;
        let end = bytes.checked_add(window.checked_mul(usize::try_from(self.slot_size).ok()?)?)?;
        let len = end.checked_next_multiple_of(page_size())?;
        Some(Offsets { meta, bytes, len })
    }
}

#[derive(Debug, Clone, Copy)]
struct Offsets {
    meta: usize,
    bytes: usize,
    len: usize,
}

#[repr(C)]
struct Header {
    magic: [u8; 8],
    version: u32,
    _pad: u32,
    ring: u64,
    window: u64,
    slot_size: u64,
    sender: AtomicU64,
    renewing: AtomicU64,
    marks: Marks,
    /// The boot of the process that last held the region (`boot_id`); zero when written by a
    /// build from before it was kept, which the padding before `head` was then.
    boot: [AtomicU64; 2],
    /// Set by a clean stop once the region is written back to its file ([`clean_mark`]);
    /// cleared at adoption.
    clean: AtomicU64,
    /// What the last stop counted as dropped and yet left in the region (systemd's store,
    /// which may or may not keep it): the process that adopts it reports those clicks as
    /// reclaimed. Cleared once reported (`Closing::reclaimed_reported`).
    dropped_at_stop: AtomicU64,
    /// The ring's tail when a process adopted the window under this id and the collector had
    /// not confirmed it yet (see the drain's `unconfirmed`), plus one; zero once confirmed or
    /// renewed. A later process adopting it before then keeps this tail, not its own, which
    /// would take the clicks served meanwhile for the region's.
    adopted_tail: AtomicU64,
    head: Position,
    tail: Position,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_SIZE);
// `boot`, `clean`, `dropped_at_stop` and `adopted_tail` took padding: what a version-2 region
// held before stays where it was.
const _: () = assert!(std::mem::offset_of!(Header, head) == 128);

/// Where the region lives, and so whether it outlives the process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kept {
    /// `--state-file`.
    File(PathBuf),
    /// A memfd in systemd's file descriptor store.
    FdStore,
    /// A memfd only this process holds: gone with it.
    No,
}

impl std::fmt::Display for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kept::File(path) => write!(f, "{}", path.display()),
            Kept::FdStore => f.write_str("systemd's file descriptor store"),
            Kept::No => f.write_str("this process only"),
        }
    }
}

impl Kept {
    /// Whether what a stop leaves is there for the next start. A file's is. systemd's store
    /// keeps it over a stop only with `FileDescriptorStorePreserve=yes` (systemd 254 and
    /// later), which the process cannot see: there a stop counts what it leaves as dropped, an
    /// upper bound (a next start that gets it back sends it, and counts it as reclaimed). A
    /// crash or a kill leaves it either way.
    pub fn survives_stop(&self) -> bool {
        matches!(self, Kept::File(_))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}: {1}")]
    Io(String, io::Error),
    #[error(
        "{0} is in use by another redirector (it is locked): two redirectors must not share \
         one state; give each its own --state-file"
    )]
    Locked(String),
    #[error(
        "{0} is not a redirector state region ({1}): refusing to overwrite it; move it aside \
         or point --state-file elsewhere"
    )]
    NotState(String, &'static str),
    #[error(
        "{0} has layout version {1}, this redirector reads version {LAYOUT_VERSION} (and lays \
         out anew an empty one of an older version): start the redirector that wrote it (an \
         older build, or after a rollback a newer one) with its collector up, to send what it \
         holds, and stop it cleanly; or let it go, its clicks lost: move the --state-file \
         aside, or for the state systemd kept, `systemctl clean --what=fdstore redirector`"
    )]
    Version(String, u32),
    #[error("the state region's geometry is too large for this machine: {0:?}")]
    TooLarge(Geometry),
}

/// A mapped region, unmapped when the last of the ring and the window's store lets it go.
pub(crate) struct Mapping {
    base: *mut u8,
    len: usize,
    /// Holds the lock (a file), or the memfd.
    _fd: Flock<OwnedFd>,
}

// SAFETY: the mapping is plain shared memory; what is written where is the ring's and the
// window's business (each documents its own rules).
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: mapped by `Mapping::map` with this length; nothing refers to it any more.
        unsafe {
            let _ = munmap(std::ptr::NonNull::new_unchecked(self.base.cast()), self.len);
        }
    }
}

impl Mapping {
    fn map(fd: Flock<OwnedFd>, len: usize, what: &str) -> Result<Mapping, Error> {
        let size = std::num::NonZeroUsize::new(len).ok_or(Error::NotState(what.into(), "empty"))?;
        // SAFETY: a fresh shared mapping of a file we hold; no Rust reference aliases it yet.
        let base = unsafe {
            mmap(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                fd.as_fd(),
                0,
            )
        }
        .map_err(|e| Error::Io(format!("mapping {what}"), e.into()))?;
        Ok(Mapping {
            base: base.as_ptr().cast(),
            len,
            _fd: fd,
        })
    }

    fn sync(&self) -> io::Result<()> {
        self.sync_first(self.len)
    }

    /// Unmaps, and gives the descriptor (and its lock) back.
    fn into_fd(self) -> Flock<OwnedFd> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: mapped by `map` with this length; `self` is gone, so nothing refers to it.
        unsafe {
            let _ = munmap(std::ptr::NonNull::new_unchecked(this.base.cast()), this.len);
        }
        // SAFETY: read once out of a value that is never dropped.
        unsafe { std::ptr::read(&this._fd) }
    }

    /// The header's page alone.
    fn sync_header(&self) -> io::Result<()> {
        self.sync_first(page_size().min(self.len))
    }

    fn sync_first(&self, len: usize) -> io::Result<()> {
        // SAFETY: the start of the mapping, as `map` made it.
        let base = unsafe { std::ptr::NonNull::new_unchecked(self.base.cast()) };
        // SAFETY: as above, `len` at most the mapping's; `msync` only writes pages back.
        unsafe { nix::sys::mman::msync(base, len, nix::sys::mman::MsFlags::MS_SYNC) }
            .map_err(io::Error::from)
    }

    /// `count` values of `T` at `offset`, for as long as the mapping lives.
    ///
    /// SAFETY: the caller makes sure the range lies in the mapping, is aligned for `T`, and
    /// that `Arc<Mapping>` is kept alive by whoever holds the slice.
    unsafe fn slice<T>(&self, offset: usize, count: usize) -> &'static mut [T] {
        std::slice::from_raw_parts_mut(self.base.add(offset).cast::<T>(), count)
    }
}

/// The window's slots in the region.
pub struct WindowStore {
    bytes: &'static mut [u8],
    meta: &'static mut [Meta],
    marks: &'static Marks,
    _region: Arc<Mapping>,
}

// SAFETY: only the drain task holds the store; the slices are disjoint from the ring's.
unsafe impl Send for WindowStore {}

impl Store for WindowStore {
    fn parts(&self) -> (&[u8], &[Meta], &Marks) {
        (self.bytes, self.meta, self.marks)
    }

    fn parts_mut(&mut self) -> (&mut [u8], &mut [Meta], &Marks) {
        (self.bytes, self.meta, self.marks)
    }
}

/// An adopted (or new) region, split into its parts.
pub struct Region {
    pub ring: Arc<Ring>,
    pub window: Window<WindowStore>,
    pub sender: Sender,
    pub geometry: Geometry,
    pub kept: Kept,
    /// Clicks found in the ring and the window at adoption (a killed or stopped process's).
    pub recovered: u64,
    /// Of `recovered`, what the last stop had counted as dropped (`Closing::stopped_cleanly`):
    /// sent after all, so counted twice unless reported apart.
    pub reclaimed: u64,
    /// Pushes found cut off by the death of the last process.
    pub torn: u64,
    /// Clicks a region that outlived a reboot without a clean stop held: not trusted, so
    /// neither sent nor kept (`stale_region`).
    pub stale: u64,
    /// What a clean stop marks.
    pub closing: Closing,
    /// The region's descriptor, for systemd's store (when it was not passed from there).
    pub upload: Option<OwnedFd>,
}

/// A clean stop, marked in the region so that the next process trusts it after a reboot.
#[derive(Clone)]
pub struct Closing {
    header: &'static Header,
    region: Arc<Mapping>,
}

// SAFETY: atomics, and `msync` of the mapping.
unsafe impl Send for Closing {}
unsafe impl Sync for Closing {}

impl Closing {
    /// Marks the region this boot's and not clean, and writes its header back, before this
    /// process sends anything from it: a crash then leaves it untrusted after a reboot, even
    /// where the clean mark of the last stop was on the disk. A boot that cannot be read (a
    /// unit's `ProcSubset=pid` hides `/proc/sys`) is recorded as unknown, which is trusted.
    fn hold(&self) -> io::Result<()> {
        self.header.clean.store(0, Ordering::Release);
        let boot = boot_id().unwrap_or_default();
        self.header.boot[0].store(boot[0], Ordering::Release);
        self.header.boot[1].store(boot[1], Ordering::Release);
        self.region.sync_header()
    }

    /// Once the start has reported what the last stop counted as dropped (`Region::reclaimed`),
    /// before anything is sent: a process killed before then leaves the count to the next
    /// start, as the stop leaves its own to the log before it marks the region.
    pub fn reclaimed_reported(&self) {
        self.header.dropped_at_stop.store(0, Ordering::Release);
    }

    /// Once nothing writes to the region any more: records that the stop counted `dropped` of
    /// what it holds as dropped, writes it back to its file, then marks it clean and writes
    /// that back too. A region found after a reboot unmarked may hold pages the kernel wrote
    /// back at different times (`stale_region`).
    pub fn stopped_cleanly(&self, dropped: u64) -> io::Result<()> {
        self.header
            .dropped_at_stop
            .store(dropped, Ordering::Release);
        self.region.sync()?;
        let h = self.header;
        let [first, end] = h.marks.get();
        let [head, tail] = [h.head.get(), h.tail.get()];
        let mark = clean_mark([h.sender.load(Ordering::Acquire), first, end, head, tail]);
        h.clean.store(mark, Ordering::Release);
        self.region.sync()
    }
}

/// The header's words a clean mark vouches for, in [`clean_mark`]'s order: the sender id, the
/// window's marks and the ring's positions.
const VOUCHED: [usize; 5] = [
    std::mem::offset_of!(Header, sender),
    std::mem::offset_of!(Header, marks),
    std::mem::offset_of!(Header, marks) + 8,
    std::mem::offset_of!(Header, head),
    std::mem::offset_of!(Header, tail),
];

/// What a clean stop marks: the words it vouches for ([`VOUCHED`]) mixed into one, its top
/// bit set. A build from before the clean mark (layout 2 too) never clears it, but moves one of
/// those words as soon as it serves (a push moves `tail`, a datagram `end`): a region such a
/// build served from after a clean stop, then left unmarked across a reboot, no longer matches,
/// and is stale. The mark of the builds before this one, 1, vouched for no words: it is taken
/// as it is, so that their clean stops are trusted across the reboot of an upgrade.
fn clean_mark(vouched: [u64; 5]) -> u64 {
    let mixed = vouched.iter().fold(0u64, |mark, &word| {
        (mark.rotate_left(27) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    });
    mixed | 1 << 63
}

/// Whether a region's `clean` word vouches for the words it holds ([`clean_mark`], never 0:
/// an unmarked region is not clean).
fn is_marked_clean(clean: u64, vouched: [u64; 5]) -> bool {
    const BEFORE_THE_WORDS: u64 = 1;
    clean == BEFORE_THE_WORDS || clean == clean_mark(vouched)
}

/// The sender id in the region, and its journalled renewal.
pub struct Sender {
    header: &'static Header,
    _region: Arc<Mapping>,
}

// SAFETY: atomics only.
unsafe impl Send for Sender {}
unsafe impl Sync for Sender {}

impl Sender {
    pub fn id(&self) -> u64 {
        self.header.sender.load(Ordering::Acquire)
    }

    /// Goes on under a new id from seq 0: the window (empty) restarts with it.
    pub fn renew(&self, window: &mut Window<WindowStore>) -> u64 {
        let id = protocol::wire::random_sender();
        self.header.renewing.store(1, Ordering::Release);
        self.header.sender.store(id, Ordering::Release);
        window.restart();
        self.confirmed();
        self.header.renewing.store(0, Ordering::Release);
        id
    }

    /// The ring's tail at the adoption of this id's window that the collector has not
    /// confirmed yet: as an earlier process recorded it, if one did and it lies within the
    /// ring's positions now (`head..=tail`), otherwise `tail`, recorded for a later process.
    pub fn unconfirmed_tail(&self, head: u64, tail: u64) -> u64 {
        let recorded = self
            .header
            .adopted_tail
            .load(Ordering::Acquire)
            .checked_sub(1);
        if let Some(at) = recorded.filter(|at| (head..=tail).contains(at)) {
            return at;
        }
        self.header.adopted_tail.store(tail + 1, Ordering::Release);
        tail
    }

    /// The collector confirmed the adopted window: nothing unconfirmed is left to record.
    pub fn confirmed(&self) {
        self.header.adopted_tail.store(0, Ordering::Release);
    }
}

impl Region {
    /// The region at `path`, created if missing (or empty), locked for this process.
    pub fn file(path: &Path, want: Geometry) -> Result<Region, Error> {
        let what = path.display().to_string();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::Io(what.clone(), e))?;
        let fd = lock(OwnedFd::from(file), &what)?;
        Region::open(fd, want, Kept::File(path.to_owned()), &what)
    }

    /// The region systemd kept in the file descriptor store.
    pub fn stored(fd: OwnedFd, want: Geometry) -> Result<Region, Error> {
        let what = format!("the state systemd kept ({FDNAME:?})");
        let fd = lock(reopen(&fd, &what)?, &what)?;
        Region::open(fd, want, Kept::FdStore, &what)
    }

    /// A new region in a memfd: kept by systemd if `store` (its descriptor is in `upload`),
    /// otherwise gone with the process.
    pub fn memfd(want: Geometry, store: bool) -> Result<Region, Error> {
        let memfd = nix::sys::memfd::memfd_create(
            c"redirector-state",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )
        .map_err(|e| Error::Io("memfd_create".into(), e.into()))?;
        let upload = store
            .then(|| memfd.try_clone())
            .transpose()
            .map_err(|e| Error::Io("memfd".into(), e))?;
        let what = "a new memfd";
        let fd = lock(reopen(&memfd, what)?, what)?;
        let kept = if store { Kept::FdStore } else { Kept::No };
        let mut region = Region::open(fd, want, kept, what)?;
        region.upload = upload;
        Ok(region)
    }

    /// A region only this process holds, of `ring` cells and `window` slots of the default
    /// datagram size: for tests and benches.
    pub fn in_process(ring: u64, window: u64) -> Result<Region, Error> {
        let geometry = Geometry {
            ring,
            window,
            slot_size: protocol::wire::DEFAULT_DATAGRAM as u64,
        };
        Region::memfd(geometry, false)
    }

    fn open(fd: Flock<OwnedFd>, want: Geometry, kept: Kept, what: &str) -> Result<Region, Error> {
        let mut found = read_header(&fd, what, Some(want))?;
        // A stale region is counted, then laid out anew as configured: as a new one.
        let (fd, lost) = match found {
            Some(f) if f.stale => {
                found = None;
                count_stale(fd, f, what)?
            }
            _ => (fd, 0),
        };
        let geometry = match found {
            // Nothing held: laid out as configured now, under a new sender id.
            None | Some(Found { held: 0, .. }) => want,
            Some(Found { geometry, .. }) => geometry,
        };
        let offsets = geometry.offsets().ok_or(Error::TooLarge(geometry))?;
        let adopt = match found {
            Some(f) if f.geometry == geometry && f.len == offsets.len => true,
            Some(f) if f.held > 0 => {
                return Err(Error::NotState(
                    what.into(),
                    "its size does not fit its header",
                ))
            }
            _ => false,
        };
        // Allocated, not sparse: a full tmpfs fails here, at start, instead of raising SIGBUS
        // at the first touch of a page (and again in every restart that adopts it). A file
        // adopted too, which a copy (`rsync -S`) or a restore may have left sparse (not a
        // copy-on-write one, a reflink or on btrfs: its writes need room of their own).
        // Allocated before it is emptied too: a start that fails for want of room leaves what
        // the file held (a stale region's clicks, counted again at the next start).
        let len = offsets.len as i64;
        let allocate = || nix::fcntl::posix_fallocate(fd.as_raw_fd(), 0, len);
        let sized = if adopt {
            // Only one with holes: a file system may want room for all of it before it looks at
            // what is allocated already (XFS), and a full disk would fail a start that needs none.
            let allocated = nix::sys::stat::fstat(fd.as_raw_fd()).map(|st| st.st_blocks * 512);
            allocated.and_then(|a| if a < len { allocate() } else { Ok(()) })
        } else {
            allocate()
                .and_then(|()| nix::unistd::ftruncate(fd.as_fd(), 0))
                .and_then(|()| allocate())
        };
        sized.map_err(|e| Error::Io(format!("sizing {what}"), e.into()))?;
        let map = Arc::new(Mapping::map(fd, offsets.len, what)?);
        if !adopt {
            format(&map, geometry);
        }
        let corrupt = |why| Error::NotState(what.into(), why);
        let mut region = Region::adopt(map, geometry, offsets, kept).map_err(corrupt)?;
        region.stale = lost;
        region.closing.hold().map_err(|e| {
            let what = format!("writing {what}'s header back (after {lost} stale clicks)");
            Error::Io(what, e)
        })?;
        Ok(region)
    }

    /// The region in `map`; refused (why) if its window holds a datagram no redirector
    /// writes (see `Window::check`).
    fn adopt(
        map: Arc<Mapping>,
        geometry: Geometry,
        at: Offsets,
        kept: Kept,
    ) -> Result<Region, &'static str> {
        // SAFETY: the offsets come from the geometry the mapping was sized for; the header,
        // cells, records and bytes are disjoint and each aligned (HEADER_SIZE and the cell
        // and record sizes are multiples of 8).
        let header: &'static Header = unsafe { &*map.base.cast::<Header>() };
        let (cells, meta, bytes) = unsafe {
            (
                map.slice::<Cell>(HEADER_SIZE, geometry.ring as usize),
                map.slice::<Meta>(at.meta, geometry.window as usize + 1),
                map.slice::<u8>(at.bytes, (geometry.window * geometry.slot_size) as usize),
            )
        };
        let ring = Ring::new(&header.head, &header.tail, cells, map.clone());
        let store = WindowStore {
            bytes,
            meta,
            marks: &header.marks,
            _region: map.clone(),
        };
        let sender_id = header.sender.load(Ordering::Acquire);
        Window::check(&store, geometry.slot_size as usize, sender_id)?;
        let mut window = Window::adopt(store, geometry.slot_size as usize);
        let sender = Sender {
            header,
            _region: map.clone(),
        };
        // With nothing in the window, go on under a new id: nothing of the old one is left to
        // send, and a collector that knew the old id at another address or user (a changed
        // --ack-socket or User=) would refuse it.
        if header.renewing.load(Ordering::Acquire) != 0 || sender.id() == 0 || window.is_empty() {
            sender.renew(&mut window);
        }
        // The window published a datagram whose ring positions were not released yet.
        if let Some(tag) = window.last_tag() {
            if tag > ring.head() && tag <= ring.tail() {
                ring.release(tag);
            }
        }
        ring.repair();
        let torn = ring.mark_torn();
        let recovered = window.clicks() + ring.len() as u64 - ring.torn();
        let reclaimed = header
            .dropped_at_stop
            .load(Ordering::Acquire)
            .min(recovered);
        Ok(Region {
            ring: Arc::new(ring),
            window,
            sender,
            geometry,
            kept,
            recovered,
            reclaimed,
            torn,
            stale: 0,
            closing: Closing {
                header,
                region: map.clone(),
            },
            upload: None,
        })
    }
}

/// Clicks the region in `fd` holds, its pushes cut short by a kill included (a start that
/// adopts it counts those as torn), read without taking it over: for one this start does not
/// use (a `--state-file` set, clicks not sent by the pipeline), to say what it keeps.
pub fn held_in(fd: &OwnedFd) -> Result<u64, Error> {
    let what = format!("the state systemd kept ({FDNAME:?})");
    let fd = lock(reopen(fd, &what)?, &what)?;
    match read_header(&fd, &what, None)? {
        None => Ok(0),
        Some(found) => Ok(counted(fd, found, &what)?.1),
    }
}

/// Counts what the stale region in `fd` held, and says so in the log before it is laid out
/// anew, which a kill or a failed start may cut short: the count is then in the log, if in no
/// metric.
fn count_stale(
    fd: Flock<OwnedFd>,
    found: Found,
    what: &str,
) -> Result<(Flock<OwnedFd>, u64), Error> {
    let (fd, lost) = counted(fd, found, what)?;
    tracing::warn!(
        stale = lost,
        "{what} outlived a reboot without a clean stop: its pages may be of different ages, \
         older than what the collector committed; its {lost} clicks are not sent, and counted \
         as dropped (stale_region); laid out anew, under a new sender id"
    );
    Ok((fd, lost))
}

/// What the region in `fd` holds (`held_clicks`, or what its header says where its file does
/// not fit its sizes).
fn counted(fd: Flock<OwnedFd>, found: Found, what: &str) -> Result<(Flock<OwnedFd>, u64), Error> {
    let (fd, held) = match found.geometry.offsets() {
        Some(at) if at.len == found.len => {
            let map = Arc::new(Mapping::map(fd, at.len, what)?);
            let lost = held_clicks(&map, found.geometry, at);
            // `held_clicks` keeps no clone of it.
            let unmapped = || Error::Io(format!("unmapping {what}"), io::Error::other("in use"));
            let map = Arc::into_inner(map).ok_or_else(unmapped)?;
            (map.into_fd(), lost)
        }
        // Ring positions and datagrams, each bounded by its sizes: a garbage header's count
        // would wrap the counter it is added to.
        _ => {
            let g = found.geometry;
            (fd, found.held.min(g.ring.saturating_add(g.window)))
        }
    };
    Ok((fd, held))
}

/// What a stale region held, as far as its ring's positions and its window's records say:
/// what it is counted as losing. Only its window is read as a window would be (which reads
/// any records without fault); nothing is adopted.
fn held_clicks(map: &Arc<Mapping>, geometry: Geometry, at: Offsets) -> u64 {
    // SAFETY: as in `Region::adopt`.
    let (header, meta, bytes) = unsafe {
        (
            &*map.base.cast::<Header>(),
            map.slice::<Meta>(at.meta, geometry.window as usize + 1),
            map.slice::<u8>(at.bytes, (geometry.window * geometry.slot_size) as usize),
        )
    };
    let store = WindowStore {
        bytes,
        meta,
        marks: &header.marks,
        _region: map.clone(),
    };
    let window = Window::adopt(store, geometry.slot_size as usize);
    let ring = Ring::new(&header.head, &header.tail, &[], map.clone());
    // The ring's positions up to the window's last datagram are in it (as `adopt` releases).
    let from = match window.last_tag() {
        Some(tag) if tag > ring.head() && tag <= ring.tail() => tag,
        _ => ring.head(),
    };
    let in_ring = ring.tail().saturating_sub(from).min(geometry.ring);
    window.clicks().saturating_add(in_ring)
}

/// Whether a region held in boot `was` (zero: unknown), marked `clean` or not, is stale in
/// boot `now` (`None`: unknown): see `read_header`.
fn is_stale(was: [u64; 2], now: Option<[u64; 2]>, clean: bool) -> bool {
    was != [0, 0] && now.is_some_and(|now| now != was) && !clean
}

/// Whether this boot's id can be read: where it cannot, a `--state-file` found after a host
/// crash is trusted as it is found.
pub fn boot_known() -> bool {
    boot_id().is_some()
}

/// This boot's id (`/proc/sys/kernel/random/boot_id`, a UUID) as two words; `None` where it
/// cannot be read.
fn boot_id() -> Option<[u64; 2]> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    let id = u128::from_str_radix(&hex, 16).ok()?;
    Some([(id >> 64) as u64, id as u64])
}

/// Locks `fd` for this process alone (`flock` on its open file description).
fn lock(fd: OwnedFd, what: &str) -> Result<Flock<OwnedFd>, Error> {
    Flock::lock(fd, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| match e {
        nix::errno::Errno::EWOULDBLOCK => Error::Locked(what.into()),
        e => Error::Io(format!("locking {what}"), e.into()),
    })
}

/// The same file under an open file description of this process's own. A lock belongs to the
/// open file description, and systemd's stored copy of a descriptor shares the one it was
/// given: locked there, the lock would pass to whoever got the copy, and outlive a kill.
fn reopen(fd: &OwnedFd, what: &str) -> Result<OwnedFd, Error> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(OwnedFd::from)
        .map_err(|e| Error::Io(format!("reopening {what}"), e))
}

/// What a region's header says.
#[derive(Debug, Clone, Copy)]
struct Found {
    geometry: Geometry,
    /// Clicks and datagrams held in the ring and the window.
    held: u64,
    /// The region's size.
    len: usize,
    /// Not to be trusted: see `read_header`.
    stale: bool,
}

/// The header of the region in `fd`, checked against its magic and version; `None` for an
/// empty file or a layout cut short (a new region). `want`, the geometry this start lays out,
/// stands in for a cut-short header's sizes not written yet (none for a memfd of our own).
fn read_header(
    fd: &Flock<OwnedFd>,
    what: &str,
    want: Option<Geometry>,
) -> Result<Option<Found>, Error> {
    let io = |e: nix::errno::Errno| Error::Io(what.into(), e.into());
    let len = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(io)?.st_size as usize;
    if len == 0 {
        return Ok(None);
    }
    let mut h = [0u8; HEADER_SIZE];
    if len < HEADER_SIZE || nix::sys::uio::pread(fd.as_fd(), &mut h, 0).map_err(io)? < HEADER_SIZE {
        return Err(Error::NotState(what.into(), "shorter than a header"));
    }
    let version = u32::from_ne_bytes(h[8..12].try_into().expect("4 bytes"));
    let u64_at = |at: usize| u64::from_ne_bytes(h[at..at + 8].try_into().expect("8 bytes"));
    let geometry = Geometry {
        ring: u64_at(std::mem::offset_of!(Header, ring)),
        window: u64_at(std::mem::offset_of!(Header, window)),
        slot_size: u64_at(std::mem::offset_of!(Header, slot_size)),
    };
    let after_sizes = std::mem::offset_of!(Header, sender);
    // Each size as `format` writes it (one store after another): not yet, or one a redirector
    // lays out.
    let partial = Geometry {
        ring: geometry.ring.max(1),
        window: geometry.window.max(1),
        slot_size: geometry.slot_size.max(protocol::wire::MIN_DATAGRAM as u64),
    };
    let sizes_only =
        matches!(version, 0 | 1 | LAYOUT_VERSION) && h[12..16] == [0; 4] && partial.is_valid();
    if h[..8] == [0; 8]
        && h[after_sizes..].iter().all(|&b| b == 0)
        && (sizes_only || h.iter().all(|&b| b == 0))
    {
        // Sized and never laid out: a process killed in `format`, which writes the header's
        // sizes first and its magic last, or before it (zeros). A new region, if the file is
        // as long as the layout of those sizes (any not written yet as configured now): it
        // was sized for it before `format` began. Not any file that starts with zeros (a file
        // system's image): a start configured otherwise than the one killed before its sizes
        // were written is refused too, and says to move the file aside.
        let or = |size: u64, configured: u64| if size == 0 { configured } else { size };
        let laid_out = |w: Geometry| {
            let g = Geometry {
                ring: or(geometry.ring, w.ring),
                window: or(geometry.window, w.window),
                slot_size: or(geometry.slot_size, w.slot_size),
            };
            g.offsets().is_some_and(|o| o.len == len)
        };
        if want.map_or(true, laid_out) {
            return Ok(None);
        }
        return Err(Error::NotState(
            what.into(),
            "no magic number, and not the size of a layout cut short",
        ));
    }
    if h[..8] != MAGIC {
        return Err(Error::NotState(what.into(), "no magic number"));
    }
    // `Marks` is `first` then `end`.
    let marks = std::mem::offset_of!(Header, marks);
    let in_window = u64_at(marks + 8).saturating_sub(u64_at(marks));
    let in_ring = u64_at(std::mem::offset_of!(Header, tail))
        .saturating_sub(u64_at(std::mem::offset_of!(Header, head)));
    let held = in_ring.saturating_add(in_window);
    match version {
        LAYOUT_VERSION => {}
        1 if held == 0 => return Ok(None),
        version => return Err(Error::Version(what.into(), version)),
    }
    if !geometry.is_valid() {
        return Err(Error::NotState(
            what.into(),
            "its header's sizes are out of range",
        ));
    }
    // Outlived a reboot that its last process did not stop cleanly before: a file's pages are
    // then what the kernel had written back by the crash, each of its own age, possibly older
    // than what the collector committed (the window's seqs taken again) or torn between pages,
    // the header's too. Not adopted, so not checked either. A memfd never outlives a boot; a
    // region of a build from before the boot was kept, or held where it could not be read
    // (zero), is trusted, and so is any where this boot's cannot be read.
    let was = [0, 8].map(|at| u64_at(std::mem::offset_of!(Header, boot) + at));
    let clean = is_marked_clean(
        u64_at(std::mem::offset_of!(Header, clean)),
        VOUCHED.map(u64_at),
    );
    let stale = is_stale(was, boot_id(), clean);
    if stale {
        return Ok(Some(Found {
            geometry,
            held,
            len,
            stale,
        }));
    }
    // What no redirector leaves, even killed midway: pushes claim at most a lap ahead of the
    // head, which never passes the tail; a sender id is renewed, or zero, only with nothing
    // in the window. Adopted, the first would spin every push or stall the drain, the second
    // stop the drain.
    let (head, tail) = (
        u64_at(std::mem::offset_of!(Header, head)),
        u64_at(std::mem::offset_of!(Header, tail)),
    );
    if head > tail || tail - head > geometry.ring {
        return Err(Error::NotState(
            what.into(),
            "its ring's positions are out of range",
        ));
    }
    if tail > MAX_POSITION || u64_at(marks + 8) > MAX_POSITION {
        return Err(Error::NotState(
            what.into(),
            "its positions are past any a redirector reaches",
        ));
    }
    if in_window > geometry.window {
        return Err(Error::NotState(
            what.into(),
            "its window's bounds are out of range",
        ));
    }
    let renewing = u64_at(std::mem::offset_of!(Header, renewing)) != 0;
    if in_window > 0 && (renewing || u64_at(std::mem::offset_of!(Header, sender)) == 0) {
        return Err(Error::NotState(
            what.into(),
            "its window holds datagrams of no sender",
        ));
    }
    Ok(Some(Found {
        geometry,
        held,
        len,
        stale,
    }))
}

/// The furthest a ring position or a window seq goes in a region adopted: no redirector gets
/// there (146,000 years at a million clicks a second); near 2^63 the ring's stamps (twice a
/// position) would wrap, and the collector refuses seqs past 2^63 - 1.
const MAX_POSITION: u64 = 1 << 62;

/// Lays out a zeroed region: the header, and the ring's cells free for the first lap. The
/// window's slots and bounds start at zero; the sender id is set at adoption.
fn format(map: &Mapping, geometry: Geometry) {
    // The header's sizes first, then the cells, and its magic last, after everything it
    // vouches for: a process killed before then leaves a header of its sizes alone (or some
    // of them), which `read_header` takes for a new region, the file being as long as their
    // layout, and the next process lays out again. Sizes written after the cells left a
    // header of zeros to a kill among them (the OOM killer, as the cells' pages are first
    // touched), which a start configured with other sizes could not tell from a foreign file.
    // SAFETY: a freshly sized, zeroed mapping nothing else refers to yet.
    let header = unsafe { &mut *map.base.cast::<Header>() };
    header.version = LAYOUT_VERSION;
    header.ring = geometry.ring;
    header.window = geometry.window;
    header.slot_size = geometry.slot_size;
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    // SAFETY: as in `Region::adopt`.
    Ring::format(unsafe { map.slice::<Cell>(HEADER_SIZE, geometry.ring as usize) });
    std::sync::atomic::compiler_fence(Ordering::SeqCst);
    header.magic = MAGIC;
}

/// What a reboot leaves of the region in the file at `path`: another boot's id in it.
#[cfg(test)]
pub(crate) fn as_if_rebooted(path: &Path) {
    let other = boot_id().expect("this boot's id").map(|word| !word);
    let bytes = [other[0].to_ne_bytes(), other[1].to_ne_bytes()].concat();
    poke(path, std::mem::offset_of!(Header, boot), &bytes);
}

/// Writes `bytes` at byte `at` of the file at `path`: what a test does to a region behind
/// its redirector's back.
#[cfg(test)]
pub(crate) fn poke(path: &Path, at: usize, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    nix::sys::uio::pwrite(&file, bytes, at as i64).unwrap();
}

/// [`poke`]s one `u64` (a header's word, say: `offset_of!(Header, tail)`).
#[cfg(test)]
pub(crate) fn poke_word(path: &Path, at: usize, word: u64) {
    poke(path, at, &word.to_ne_bytes());
}

/// What a push killed after it claimed the ring's next cell (moved the tail) and before it
/// published it leaves, done to the region in the file at `path`.
#[cfg(test)]
pub(crate) fn claim_unpublished(path: &Path) {
    let tail = std::mem::offset_of!(Header, tail) as i64;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut bytes = [0; 8];
    nix::sys::uio::pread(&file, &mut bytes, tail).unwrap();
    let next = u64::from_ne_bytes(bytes) + 1;
    nix::sys::uio::pwrite(&file, &next.to_ne_bytes(), tail).unwrap();
}

fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::Read;
    use protocol::dimensions::Dimensions;
    use protocol::wire::Encoder;

    const GEOMETRY: Geometry = Geometry {
        ring: 8,
        window: 4,
        slot_size: 1024,
    };

    /// Datagram `seq` of `sender` holding `codes`, as the drain seals it.
    fn sealed(sender: u64, seq: u64, codes: &[&str]) -> Vec<u8> {
        let mut encoder = Encoder::new(sender, GEOMETRY.slot_size as usize).unwrap();
        encoder.resume_as(sender, seq);
        for code in codes {
            encoder.push(code, 1).unwrap();
        }
        encoder.datagram().to_vec()
    }

    fn codes(ring: &Ring) -> Vec<String> {
        (ring.head()..ring.tail())
            .map(|pos| match ring.read(pos) {
                Read::Click(slot) => slot.code().unwrap().to_owned(),
                Read::Torn => "torn".into(),
                Read::Empty => "empty".into(),
            })
            .collect()
    }

    #[test]
    fn a_later_process_adopts_the_ring_the_window_and_the_sender() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let (sender, seq) = {
            let mut region = Region::file(&path, GEOMETRY).unwrap();
            assert_eq!((region.recovered, region.torn), (0, 0));
            for code in ["a", "b", "c"] {
                region.ring.push(code, 1, &Dimensions::default()).unwrap();
            }
            // The drain sealed "a" and "b" into a datagram and was killed before it released
            // them from the ring: the window's tag says they are taken.
            let datagram = sealed(region.sender.id(), 0, &["a", "b"]);
            region.window.push(0, &datagram, 2, 2);
            (region.sender.id(), region.window.next_seq())
        };
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(region.sender.id(), sender, "the same sender id");
        assert_eq!(region.window.next_seq(), seq, "the same seq");
        assert_eq!(
            codes(&region.ring),
            ["c"],
            "a and b are in the window, not twice"
        );
        assert_eq!((region.window.len(), region.window.clicks()), (1, 2));
        assert_eq!((region.recovered, region.torn), (3, 0));
        assert_eq!(region.kept, Kept::File(path));
        assert_eq!(
            region.ring.pushed(),
            0,
            "adopted clicks are not this process's pushes"
        );
        region.ring.push("d", 1, &Dimensions::default()).unwrap();
        assert_eq!(region.ring.pushed(), 1);
    }

    /// A region file adopted sparse (copied with `cp` or `rsync -S`, restored) is allocated
    /// whole, as one laid out anew: a full disk fails the start, rather than a write to a hole
    /// raising SIGBUS, in every restart.
    #[test]
    fn a_sparse_file_is_allocated_when_adopted() {
        use nix::fcntl::{fallocate, FallocateFlags};
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let allocated = || std::fs::metadata(&path).unwrap().blocks() * 512;
        let len = {
            let region = Region::file(&path, GEOMETRY).unwrap();
            region.ring.push("a", 1, &Dimensions::default()).unwrap();
            std::fs::metadata(&path).unwrap().len()
        };
        assert!(allocated() >= len);
        // A hole where the window's last datagram would go: zeros, as the file holds there.
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let hole = FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE;
        let page = page_size() as i64;
        fallocate(file.as_raw_fd(), hole, len as i64 - page, page).unwrap();
        assert!(allocated() < len, "a hole punched");
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(codes(&region.ring), ["a"], "adopted");
        assert!(allocated() >= len, "allocated whole again");
    }

    /// Three clicks, two of them sealed into a datagram, in a region left by a process that
    /// was not stopped cleanly; the sender id.
    fn left_with_three_clicks(path: &Path, stopped_cleanly: bool) -> u64 {
        let mut region = Region::file(path, GEOMETRY).unwrap();
        for code in ["a", "b", "c"] {
            region.ring.push(code, 1, &Dimensions::default()).unwrap();
        }
        let datagram = sealed(region.sender.id(), 0, &["a", "b"]);
        region.window.push(0, &datagram, 2, 2);
        if stopped_cleanly {
            region.closing.stopped_cleanly(0).unwrap();
        }
        region.sender.id()
    }

    /// The ring's tail at an adoption not confirmed yet is the first adoption's for every later
    /// one until the collector confirms it or the id is renewed; a recorded tail outside the
    /// ring's positions (a damaged region) is not believed.
    #[test]
    fn an_unconfirmed_adoptions_tail_is_kept_until_confirmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        left_with_three_clicks(&path, false);
        let region = Region::file(&path, GEOMETRY).unwrap();
        let (head, tail) = (region.ring.head(), region.ring.tail());
        assert_eq!(region.sender.unconfirmed_tail(head, tail), tail);
        region.ring.push("d", 1, &Dimensions::default()).unwrap();
        drop(region);
        let region = Region::file(&path, GEOMETRY).unwrap();
        let later = region.ring.tail();
        assert_eq!(later, tail + 1);
        assert_eq!(
            region.sender.unconfirmed_tail(head, later),
            tail,
            "the first's"
        );
        region.sender.confirmed();
        assert_eq!(region.sender.unconfirmed_tail(head, later), later);
        let mut region = region;
        region.window.discard();
        region.sender.renew(&mut region.window);
        assert_eq!(region.sender.unconfirmed_tail(head, later + 1), later + 1);
        assert_eq!(
            region.sender.unconfirmed_tail(later + 2, later + 3),
            later + 3,
            "a recorded tail behind the ring's head"
        );
    }

    /// After a reboot, a region its process did not stop cleanly is not trusted: what it held
    /// is counted, not sent, and the next process goes on under a new sender id from an empty
    /// ring and window. A crash without a reboot leaves it trusted (the test above).
    #[test]
    fn a_region_that_outlived_a_reboot_unclean_is_counted_not_sent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let sender = left_with_three_clicks(&path, false);
        as_if_rebooted(&path);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!((region.stale, region.recovered, region.torn), (3, 0, 0));
        assert_eq!((region.ring.len(), region.window.len()), (0, 0));
        assert_ne!(region.sender.id(), sender, "a new sender id");
        drop(region);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(region.stale, 0, "this boot's now: not counted again");
    }

    /// A stale region is not checked as one to adopt (a crash can tear its header between
    /// pages) and is laid out anew as configured now: here one that would be refused as
    /// corrupt, of another geometry.
    #[test]
    fn a_stale_region_is_laid_out_anew_as_configured_not_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        left_with_three_clicks(&path, false);
        poke_word(&path, std::mem::offset_of!(Header, renewing), 1);
        as_if_rebooted(&path);
        let now = Geometry {
            ring: 16,
            ..GEOMETRY
        };
        let region = Region::file(&path, now).unwrap();
        assert_eq!((region.stale, region.recovered), (3, 0));
        assert_eq!(region.geometry, now);
    }

    /// A stale file whose size does not fit its header's sizes is counted by its header (ring
    /// positions and datagrams held), then laid out anew, not refused; the next start finds
    /// it of this boot, and nothing stale.
    #[test]
    fn a_stale_file_that_does_not_fit_its_sizes_is_counted_by_its_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        left_with_three_clicks(&path, false);
        as_if_rebooted(&path);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        file.set_len(len + page_size() as u64).unwrap();
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(region.stale, 3 + 1, "three ring positions, one datagram");
        drop(region);
        assert_eq!(Region::file(&path, GEOMETRY).unwrap().stale, 0);
    }

    /// Stale only when both boots are known and differ, and no clean stop was marked.
    #[test]
    fn stale_takes_two_known_boots_that_differ_and_no_clean_stop() {
        let (a, b) = ([1, 2], [3, 4]);
        assert!(is_stale(a, Some(b), false));
        assert!(!is_stale(a, Some(b), true), "stopped cleanly");
        assert!(!is_stale(a, Some(a), false), "the same boot: a kill");
        assert!(
            !is_stale(a, None, false),
            "this boot unknown (ProcSubset=pid)"
        );
        assert!(
            !is_stale([0, 0], Some(b), false),
            "held where the boot was unknown"
        );
    }

    /// A clean mark vouches for the region as its stop left it: a build from before the mark
    /// that served from the region since (a rollback: it never clears the mark, but its push
    /// moved the tail) leaves it untrusted after a reboot. The mark of the builds before this
    /// one, 1, is trusted as it is.
    #[test]
    fn a_clean_mark_vouches_only_for_the_region_its_stop_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        left_with_three_clicks(&path, true);
        poke_word(&path, std::mem::offset_of!(Header, tail), 4);
        as_if_rebooted(&path);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!((region.stale, region.recovered), (4, 0));

        let path = dir.path().join("before the words");
        let sender = left_with_three_clicks(&path, true);
        poke_word(&path, std::mem::offset_of!(Header, clean), 1);
        as_if_rebooted(&path);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!((region.stale, region.recovered), (0, 3));
        assert_eq!(region.sender.id(), sender);
    }

    /// A process that adopted a region stopped cleanly and was then killed leaves it
    /// unmarked again (written back before it sends anything): after a reboot, not trusted.
    #[test]
    fn adopting_a_region_clears_its_clean_mark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        left_with_three_clicks(&path, true);
        drop(Region::file(&path, GEOMETRY).unwrap());
        as_if_rebooted(&path);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!((region.stale, region.recovered), (3, 0));
    }

    /// What a stop counted as dropped and left in the region (systemd's store may keep it) is
    /// reported as reclaimed by the process that adopts it, once (by the next, if that one is
    /// killed before it reported them), and never as more than the region holds.
    #[test]
    fn what_a_stop_counted_as_dropped_is_reclaimed_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let region = Region::file(&path, GEOMETRY).unwrap();
        for code in ["a", "b", "c"] {
            region.ring.push(code, 1, &Dimensions::default()).unwrap();
        }
        region.closing.stopped_cleanly(3).unwrap();
        drop(region);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!((region.recovered, region.reclaimed), (3, 3));
        drop(region);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(
            region.reclaimed, 3,
            "a start killed before it reported them leaves them to the next"
        );
        region.closing.reclaimed_reported();
        drop(region);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(
            (region.recovered, region.reclaimed),
            (3, 0),
            "reclaimed once"
        );
        region.closing.stopped_cleanly(1_000).unwrap();
        drop(region);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(region.reclaimed, 3, "bounded by what the region holds");
    }

    /// A clean stop writes the region back and says so: after a reboot it is adopted.
    #[test]
    fn a_region_stopped_cleanly_is_adopted_after_a_reboot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let sender = left_with_three_clicks(&path, true);
        as_if_rebooted(&path);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!((region.stale, region.recovered), (0, 3));
        assert_eq!(region.sender.id(), sender);
    }

    /// A region whose header or window says what no redirector leaves, even killed midway, is
    /// refused with the reason, never adopted: adopted, each once spun every push, stopped the
    /// drain, or panicked it.
    #[test]
    fn a_region_no_redirector_could_leave_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let Offsets { meta, bytes, .. } = GEOMETRY.offsets().unwrap();
        let marks = std::mem::offset_of!(Header, marks);
        // A record's `len` then `clicks`, u32s; a datagram's first byte, its version.
        let (len, clicks, version) = (meta, meta + 4, bytes);
        let cases: [(usize, u64, &str); 9] = [
            (std::mem::offset_of!(Header, head), 5, "ring's positions"),
            (
                std::mem::offset_of!(Header, tail),
                3 + GEOMETRY.ring,
                "ring's positions",
            ),
            (std::mem::offset_of!(Header, renewing), 1, "no sender"),
            (len, GEOMETRY.slot_size + 1, "longer than a slot"),
            (marks + 8, MAX_POSITION + 1, "past any a redirector reaches"),
            (version, 7, "a version this build does not read"),
            (len, 1, "does not decode"),
            (clicks, 3, "other than its record says"),
            (
                std::mem::offset_of!(Header, sender),
                12_345,
                "other than its record says",
            ),
        ];
        for (at, value, why) in cases {
            std::fs::remove_file(&path).ok();
            left_with_three_clicks(&path, false);
            let bytes = match at {
                _ if at == version => vec![value as u8],
                _ if at == len || at == clicks => (value as u32).to_ne_bytes().to_vec(),
                _ => value.to_ne_bytes().to_vec(),
            };
            poke(&path, at, &bytes);
            let err = Region::file(&path, GEOMETRY).err().expect(why);
            assert!(matches!(err, Error::NotState(..)), "{err}");
            assert!(err.to_string().contains(why), "{err}");
        }
        // A window whose bounds span more seqs than its slots (its `first` lowered below two
        // datagrams acknowledged): read as it is, its oldest seqs would pass for acknowledged.
        std::fs::remove_file(&path).ok();
        let mut region = Region::file(&path, GEOMETRY).unwrap();
        let id = region.sender.id();
        for seq in 0..GEOMETRY.window + 2 {
            if seq == GEOMETRY.window {
                region.window.acknowledge(1).unwrap();
            }
            region.ring.push("a", 1, &Dimensions::default()).unwrap();
            region
                .window
                .push(seq, &sealed(id, seq, &["a"]), 1, seq + 1);
            region.window.mark_sent();
        }
        drop(region);
        assert!(
            Region::file(&path, GEOMETRY).is_ok(),
            "as a redirector left it"
        );
        poke_word(&path, marks, 0);
        let err = Region::file(&path, GEOMETRY)
            .err()
            .expect("bounds past its slots");
        assert!(err.to_string().contains("window's bounds"), "{err}");
        // Two datagrams whose records do not add up: the second's clicks before, and its tag.
        for (field, value) in [(24, 3u64), (16, 1)] {
            std::fs::remove_file(&path).ok();
            let mut region = Region::file(&path, GEOMETRY).unwrap();
            for code in ["a", "b", "c", "d"] {
                region.ring.push(code, 1, &Dimensions::default()).unwrap();
            }
            let id = region.sender.id();
            region.window.push(0, &sealed(id, 0, &["a", "b"]), 2, 2);
            region.window.push(1, &sealed(id, 1, &["c", "d"]), 2, 4);
            drop(region);
            assert!(
                Region::file(&path, GEOMETRY).is_ok(),
                "as a redirector left it"
            );
            // `Meta`: len and clicks (u32s), sent and padding, the tag, the clicks before.
            poke(&path, meta + 32 + field, &value.to_ne_bytes());
            let err = Region::file(&path, GEOMETRY)
                .err()
                .expect("records that do not add up");
            assert!(
                err.to_string().contains("do not follow one another"),
                "{err}"
            );
        }
        std::fs::remove_file(&path).ok();
        left_with_three_clicks(&path, false);
        for position in [
            std::mem::offset_of!(Header, head),
            std::mem::offset_of!(Header, tail),
        ] {
            poke_word(&path, position, MAX_POSITION + 1);
        }
        let err = Region::file(&path, GEOMETRY)
            .err()
            .expect("a ring past 2^62");
        assert!(err.to_string().contains("past any"), "{err}");
    }

    #[test]
    fn a_push_cut_off_by_a_kill_is_counted_torn_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        {
            let region = Region::file(&path, GEOMETRY).unwrap();
            region.ring.push("a", 1, &Dimensions::default()).unwrap();
            region.ring.push("b", 2, &Dimensions::default()).unwrap();
        }
        // A push that claimed position 2 and died before it published.
        claim_unpublished(&path);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!((region.recovered, region.torn), (2, 1));
        assert_eq!(codes(&region.ring), ["a", "b", "torn"]);
        drop(region);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(region.torn, 0, "marked: not counted again");
    }

    #[test]
    fn a_release_cut_short_by_a_kill_is_repaired_not_read_as_torn() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        {
            let region = Region::file(&path, GEOMETRY).unwrap();
            for _ in 0..GEOMETRY.ring {
                region.ring.push("a", 1, &Dimensions::default()).unwrap();
            }
        }
        // Killed between moving `head` past all of them and freeing their cells.
        let head = std::mem::offset_of!(Header, head);
        poke_word(&path, head, GEOMETRY.ring);
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!((region.recovered, region.torn), (0, 0));
        for _ in 0..GEOMETRY.ring {
            region.ring.push("b", 2, &Dimensions::default()).unwrap();
        }
        assert_eq!(codes(&region.ring), vec!["b"; GEOMETRY.ring as usize]);
    }

    #[test]
    fn a_second_redirector_on_the_same_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let _first = Region::file(&path, GEOMETRY).unwrap();
        let err = Region::file(&path, GEOMETRY).err().unwrap();
        assert!(matches!(err, Error::Locked(_)), "{err}");
        assert!(
            err.to_string().contains("in use by another redirector"),
            "{err}"
        );
    }

    /// An upgrade from version 1: empty (a clean stop), the region is laid out anew; holding
    /// clicks, it is refused, never misread with this version's larger slots.
    #[test]
    fn a_version_one_region_is_laid_out_anew_only_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        let set_version_one = || poke(&path, 8, &1u32.to_ne_bytes());
        drop(Region::file(&path, GEOMETRY).unwrap());
        set_version_one();
        let region = Region::file(&path, GEOMETRY).unwrap();
        region.ring.push("a", 1, &Dimensions::default()).unwrap();
        drop(region);
        set_version_one();
        let err = Region::file(&path, GEOMETRY).err().unwrap();
        assert!(matches!(err, Error::Version(_, 1)), "{err}");
    }

    /// A click's dimensions go through the region's slots whole.
    #[test]
    fn a_slot_keeps_the_dimensions() {
        use protocol::dimensions::{Agent, Country, Device};
        let region = Region::in_process(4, 1).unwrap();
        let long = "r".repeat(protocol::dimensions::MAX_REFERRER_LEN);
        let full = Dimensions {
            agent: Agent::Preview,
            referrer: Some(&long),
            device: Some(Device::Tablet),
            country: Country::parse(b"NZ"),
        };
        for d in [full, Dimensions::default()] {
            region.ring.push("a", 1, &d).unwrap();
        }
        let read = |pos| match region.ring.read(pos) {
            Read::Click(slot) => format!("{:?}", slot.dimensions()),
            _ => panic!("published"),
        };
        assert_eq!(read(0), format!("{full:?}"));
        assert_eq!(read(1), format!("{:?}", Dimensions::default()));
    }

    #[test]
    fn another_layout_version_or_a_foreign_file_is_refused_never_misread() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        drop(Region::file(&path, GEOMETRY).unwrap());
        poke(&path, 8, &3u32.to_ne_bytes());
        let err = Region::file(&path, GEOMETRY).err().unwrap();
        assert!(matches!(err, Error::Version(_, 3)), "{err}");
        assert!(err.to_string().contains("layout version 3"), "{err}");

        let foreign = dir.path().join("notes.txt");
        std::fs::write(&foreign, "not a state region").unwrap();
        let err = Region::file(&foreign, GEOMETRY).err().unwrap();
        assert!(matches!(err, Error::NotState(..)), "{err}");
        assert_eq!(
            std::fs::read(&foreign).unwrap(),
            b"not a state region",
            "untouched"
        );
    }

    #[test]
    fn a_region_killed_while_laid_out_is_laid_out_again_and_bad_sizes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        std::fs::write(&path, vec![0u8; 8192]).unwrap();
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(region.geometry, GEOMETRY, "zeros: a new region");
        drop(region);
        // Killed between the header's sizes and its magic: the sizes of an earlier
        // configuration, no magic, nothing else.
        let mut header = vec![0u8; 8192];
        header[8..12].copy_from_slice(&LAYOUT_VERSION.to_ne_bytes());
        for (field, value) in [
            (std::mem::offset_of!(Header, ring), 16u64),
            (std::mem::offset_of!(Header, window), 3),
            (std::mem::offset_of!(Header, slot_size), GEOMETRY.slot_size),
        ] {
            header[field..field + 8].copy_from_slice(&value.to_ne_bytes());
        }
        std::fs::write(&path, &header).unwrap();
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(
            region.geometry, GEOMETRY,
            "sizes without magic: a new region"
        );
        drop(region);
        // Killed between two of the sizes: the window's not written yet.
        let window = std::mem::offset_of!(Header, window);
        header[window..window + 8].copy_from_slice(&0u64.to_ne_bytes());
        std::fs::write(&path, &header).unwrap();
        let region = Region::file(&path, GEOMETRY).unwrap();
        assert_eq!(region.geometry, GEOMETRY, "some sizes: a new region");
        drop(region);
        // Not sizes a redirector lays out: some other file, refused and left alone.
        header[window..window + 8].copy_from_slice(&70_000u64.to_ne_bytes());
        std::fs::write(&path, &header).unwrap();
        let err = Region::file(&path, GEOMETRY).err().unwrap();
        assert!(err.to_string().contains("no magic number"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), header, "untouched");
        std::fs::write(&path, vec![0u8; 8192]).unwrap();
        let region = Region::file(&path, GEOMETRY).unwrap();
        region.ring.push("a", 1, &Dimensions::default()).unwrap();
        drop(region);
        poke_word(&path, std::mem::offset_of!(Header, window), 0);
        let err = Region::file(&path, GEOMETRY).err().unwrap();
        assert!(err.to_string().contains("sizes are out of range"), "{err}");
        // Zeros, but not as long as a layout: a file system's image, say. Refused, untouched.
        let image = vec![0u8; 1 << 20];
        std::fs::write(&path, &image).unwrap();
        let err = Region::file(&path, GEOMETRY).err().unwrap();
        assert!(
            err.to_string().contains("not the size of a layout"),
            "{err}"
        );
        assert!(std::fs::read(&path).unwrap() == image, "untouched");
    }

    #[test]
    fn a_region_passed_on_by_descriptor_is_locked_for_one_process_only() {
        let first = Region::memfd(GEOMETRY, true).unwrap();
        let upload = first.upload.as_ref().unwrap();
        // What systemd passes back is a copy of the uploaded descriptor.
        let err = Region::stored(upload.try_clone().unwrap(), GEOMETRY)
            .err()
            .unwrap();
        assert!(matches!(err, Error::Locked(_)), "{err}");
        let upload = upload.try_clone().unwrap();
        drop(first);
        let again = Region::stored(upload, GEOMETRY).unwrap();
        assert_eq!(again.kept, Kept::FdStore);
    }

    #[test]
    fn another_geometry_is_kept_while_it_holds_clicks_and_relaid_once_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        Region::file(&path, GEOMETRY)
            .unwrap()
            .ring
            .push("a", 1, &Dimensions::default())
            .unwrap();
        let bigger = Geometry {
            ring: 16,
            ..GEOMETRY
        };
        let region = Region::file(&path, bigger).unwrap();
        assert_eq!(
            region.geometry, GEOMETRY,
            "held clicks: read with its own layout"
        );
        assert_eq!(codes(&region.ring), ["a"]);
        region.ring.release(region.ring.tail());
        drop(region);
        let region = Region::file(&path, bigger).unwrap();
        assert_eq!(region.geometry, bigger, "empty: laid out as configured");
        assert_eq!(region.ring.capacity(), 16);
    }
}
