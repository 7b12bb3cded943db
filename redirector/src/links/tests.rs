use super::*;

/// A head whose snapshot's horizon is 1000.
fn head(epoch: i64, pruned_id: i64, pruned_xid: i64, top: i64, xip: &[i64]) -> Head {
    Head {
        epoch,
        pruned_id,
        pruned_xid,
        top,
        xip: xip.to_vec(),
        horizon: 1000,
        now: 0.0,
        standby: false,
        behind: false,
        replayed_at: None,
    }
}

/// A position whose read had the horizon 1000.
fn at(last_id: i64, in_progress: &[i64], epoch: i64) -> Position {
    Position {
        last_id,
        in_progress: in_progress.to_vec(),
        horizon: 1000,
        epoch,
    }
}

#[test]
fn a_full_load_only_when_the_log_cannot_catch_up() {
    let h = head(1, 10, 500, 20, &[]);
    assert_eq!(h.needs_full_load(None), Some("first load"));
    assert_eq!(h.needs_full_load(Some(&at(10, &[501], 1))), None);
    assert!(h
        .needs_full_load(Some(&at(10, &[], 0)))
        .unwrap()
        .contains("truncated"));
    // Rows above our position were pruned.
    assert!(h
        .needs_full_load(Some(&at(9, &[], 1)))
        .unwrap()
        .contains("pruned"));
    // A transaction we still had to read was pruned, though its ids are below ours.
    assert!(h
        .needs_full_load(Some(&at(15, &[499], 1)))
        .unwrap()
        .contains("pruned"));
    // So was one beyond our last read's horizon.
    let beyond = Position {
        horizon: 400,
        ..at(10, &[], 1)
    };
    assert!(h.needs_full_load(Some(&beyond)).unwrap().contains("pruned"));
    // Ids past what the log has or pruned: a server behind the one read last (a lagging
    // standby) catches up, it is not loaded from (which would serve an older state).
    assert_eq!(h.needs_full_load(Some(&at(25, &[], 1))), None);
}

#[test]
fn the_position_moves_forward_and_remembers_transactions_in_progress() {
    let h = head(2, 0, 0, 30, &[7, 9]);
    assert_eq!(h.position(None), at(30, &[7, 9], 2));
    // A log pruned empty shows top 0: the position never moves back.
    let empty = head(2, 40, 9, 0, &[]);
    assert_eq!(empty.position(Some(&at(45, &[], 2))), at(45, &[], 2));
    // A full load over a pruned log is past what was pruned, or it would load again and again.
    assert_eq!(empty.position(None), at(40, &[], 2));
    assert_eq!(empty.needs_full_load(Some(&empty.position(None))), None);
}

#[test]
fn lookup_tells_unloaded_from_unknown() {
    let links = LinkTable::default();
    assert!(matches!(links.lookup("a", None), Lookup::NotLoaded));
    let mut batch = Batch::new(&links.table, true);
    let mut value = Vec::new();
    target::encode(&LinkOptions::default(), b"http://x/", &mut value).unwrap();
    batch.set(b"a", Some(&value));
    batch.finish();
    links.set_loaded();
    assert!(matches!(
        links.lookup("a", Some("q=1")),
        Lookup::Found(Answer::Redirect { location, .. }) if location == "http://x/?q=1"
    ));
    assert!(matches!(links.lookup("b", None), Lookup::Unknown));
}
