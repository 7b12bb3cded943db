//! The user namespace the collector runs in, as far as `--allow-uid` cares.
//!
//! The kernel gives a datagram's `SCM_CREDENTIALS` uid as the receiver's user namespace sees
//! the sender: a uid the namespace's `uid_map` does not map arrives as the overflow uid
//! (65534). systemd's `PrivateUsers=yes` (collector.service) makes such a namespace, mapping
//! only root and the service's own user: the redirector's uid is not in it, so an
//! `--allow-uid` naming that uid could never match, and every datagram would be refused as
//! unauthorized. The collector checks this at start and refuses to run instead.

use std::fmt;

/// Where the kernel shows this process's uid mapping.
const UID_MAP: &str = "/proc/self/uid_map";

/// The uid the kernel reports for a uid its namespace does not map (`kernel.overflowuid`,
/// 65534 unless changed; `/proc/sys` is hidden from the unit by `ProcSubset=pid`).
const OVERFLOW_UID: u32 = 65534;

/// One line of `uid_map` (`inside outside count`), as far as this namespace sees it: `count`
/// uids from `inside` are uids of the parent namespace's (from `outside`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    inside: u32,
    count: u32,
}

/// The uids this process's user namespace maps, as `/proc/self/uid_map` lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UidMap {
    text: String,
    ranges: Vec<Range>,
}

impl UidMap {
    /// Parses the text of a `uid_map` file: lines of three decimal numbers.
    pub(crate) fn parse(text: &str) -> Result<UidMap, String> {
        let mut ranges = Vec::new();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let fields: Vec<u32> = line
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("{line:?}: {e}"))?;
            let &[inside, _outside, count] = fields.as_slice() else {
                return Err(format!("{line:?}: not three numbers"));
            };
            ranges.push(Range { inside, count });
        }
        Ok(UidMap {
            text: text.split_whitespace().collect::<Vec<_>>().join(" "),
            ranges,
        })
    }

    /// This process's map; `None` where the kernel has no user namespaces (no such file):
    /// every uid is then seen as it is.
    pub(crate) fn read() -> std::io::Result<Option<UidMap>> {
        match std::fs::read_to_string(UID_MAP) {
            Ok(text) => UidMap::parse(&text)
                .map(Some)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Whether a sender's uid can arrive as `uid` here: some line maps it inside.
    pub(crate) fn maps(&self, uid: u32) -> bool {
        self.ranges
            .iter()
            .any(|r| uid >= r.inside && u64::from(uid) < u64::from(r.inside) + u64::from(r.count))
    }

    /// The first of `allowed` that no sender's credentials can ever carry here.
    pub(crate) fn first_unmapped(&self, allowed: &[u32]) -> Option<u32> {
        allowed.iter().copied().find(|&uid| !self.maps(uid))
    }
}

/// An `--allow-uid` uid the collector's user namespace does not map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unmapped {
    pub(crate) uid: u32,
    pub(crate) map: UidMap,
}

impl fmt::Display for Unmapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "--allow-uid {uid}: uid {uid} is not mapped in the collector's user namespace \
             ({UID_MAP}: {map:?}), so no datagram can ever carry it: the kernel gives every \
             sender outside the map as the overflow uid {OVERFLOW_UID}, and every datagram \
             would be refused as unauthorized. Under systemd this namespace is PrivateUsers=yes \
             (as collector.service sets it), which maps only root and the service's own user. \
             Either drop --allow-uid (COLLECTOR_ALLOW_UID) and let the socket's group and mode \
             decide who may send (collector.socket: group clicks, 0660), or run the collector \
             without PrivateUsers= (a drop-in with PrivateUsers=no) so that uid {uid} is seen \
             as it is",
            uid = self.uid,
            map = self.map.text,
        )
    }
}

/// Checks `allowed` (the `--allow-uid` list) against `map`: `Err` names the first uid that can
/// never be seen.
pub(crate) fn check(allowed: &[u32], map: &UidMap) -> Result<(), Unmapped> {
    match map.first_unmapped(allowed) {
        Some(uid) => Err(Unmapped {
            uid,
            map: map.clone(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_initial_namespace_maps_every_uid() {
        let map = UidMap::parse("         0          0 4294967295\n").unwrap();
        assert!(map.maps(0) && map.maps(998) && map.maps(65534) && map.maps(u32::MAX - 1));
        assert_eq!(check(&[998, 0], &map), Ok(()));
    }

    /// What PrivateUsers=yes gives a service running as uid 997: root and itself.
    #[test]
    fn private_users_maps_root_and_the_service_only() {
        let map = UidMap::parse("0 0 1\n997 997 1\n").unwrap();
        assert!(map.maps(0) && map.maps(997));
        assert!(!map.maps(1) && !map.maps(996) && !map.maps(998) && !map.maps(65534));
        let err = check(&[997, 998], &map).unwrap_err();
        assert_eq!(err.uid, 998);
        let text = err.to_string();
        for needle in [
            "--allow-uid 998",
            "PrivateUsers=",
            "0 0 1 997 997 1",
            "65534",
        ] {
            assert!(text.contains(needle), "{needle:?} in {text}");
        }
        assert_eq!(check(&[997], &map), Ok(()));
    }

    /// `unshare --map-root-user` run by uid 1000: that user is root inside, and uid 1000 is
    /// not mapped inside (the map is read from its inside column).
    #[test]
    fn the_map_is_read_from_inside() {
        let map = UidMap::parse("0 1000 1").unwrap();
        assert!(map.maps(0));
        assert!(!map.maps(1000));
        let ranges = UidMap::parse("100 200 10").unwrap();
        assert!(!ranges.maps(99) && ranges.maps(100) && ranges.maps(109) && !ranges.maps(110));
    }

    #[test]
    fn a_malformed_map_is_an_error() {
        assert!(UidMap::parse("0 0").is_err());
        assert!(UidMap::parse("0 x 1").is_err());
        assert!(UidMap::parse("0 0 1 2").is_err());
        assert_eq!(UidMap::parse("").unwrap().first_unmapped(&[0]), Some(0));
    }

    #[test]
    fn this_process_map_is_readable() {
        let map = UidMap::read()
            .unwrap()
            .expect("a kernel with user namespaces");
        assert!(map.maps(nix::unistd::getuid().as_raw()));
    }
}
