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
        received: None,
        replayed: None,
        replayed_at: None,
        log_table: 7,
        links_triggered: true,
        wal: None,
        top_change: None,
    }
}

/// A position whose read had the horizon 1000.
fn at(last_id: i64, in_progress: &[i64], epoch: i64) -> Position {
    Position {
        last_id,
        in_progress: in_progress.to_vec(),
        horizon: 1000,
        epoch,
        log_table: 7,
        wal: None,
        last_change: None,
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
    // The log's tables made again: their ids and epoch start again.
    let remade = Position {
        log_table: 8,
        ..at(10, &[501], 1)
    };
    assert!(h
        .needs_full_load(Some(&remade))
        .unwrap()
        .contains("made again"));
    // Ids past what the log has or pruned: a server behind the one read last (a lagging
    // standby) catches up, it is not loaded from (which would serve an older state).
    assert_eq!(h.needs_full_load(Some(&at(25, &[], 1))), None);
}

/// A server below the WAL position of a read already applied is behind the table, whatever
/// its log says; one that does not say (or a position that does not) is not judged.
#[test]
fn a_server_below_the_wal_position_read_is_behind() {
    let read = Position {
        wal: Some(5000),
        ..at(10, &[], 1)
    };
    let on = |wal| Head {
        wal,
        ..head(1, 0, 0, 10, &[])
    };
    assert!(on(Some(4999)).behind(&read));
    assert!(!on(Some(5000)).behind(&read));
    assert!(!on(None).behind(&read));
    assert!(!on(Some(1)).behind(&at(10, &[], 1)));
    // The position keeps the furthest WAL read: never moves back.
    assert_eq!(on(Some(4000)).position(Some(&read)).wal, Some(5000));
    assert_eq!(on(Some(6000)).position(Some(&read)).wal, Some(6000));
}

/// A server whose change of the id last applied is another, or gone from a primary that did
/// not prune it, lacks changes the table applied.
#[test]
fn a_server_whose_last_applied_change_is_another_or_gone_lacks_it() {
    let read = Position {
        last_change: Some("500 1".into()),
        ..at(10, &[], 1)
    };
    let h = head(1, 0, 0, 10, &[]);
    assert!(!h.lacks_applied(&read, Some("500 1")));
    assert!(h.lacks_applied(&read, Some("500 2")), "another change");
    assert!(h.lacks_applied(&read, None), "gone, not pruned");
    assert!(!head(1, 10, 0, 0, &[]).lacks_applied(&read, None), "pruned");
    let standby = Head {
        standby: true,
        ..head(1, 0, 0, 5, &[])
    };
    assert!(
        !standby.lacks_applied(&read, None),
        "a standby not there yet"
    );
    assert!(standby.lacks_applied(&read, Some("7 1")));
    let remade = Head {
        log_table: 8,
        ..head(1, 0, 0, 10, &[])
    };
    assert!(
        !remade.lacks_applied(&read, Some("7 1")),
        "loaded in full for that"
    );
    // The position keeps which change its last id is.
    let top = Head {
        top_change: Some("600 3".into()),
        ..head(1, 0, 0, 12, &[])
    };
    let last = |h: Head| h.position(Some(&read)).last_change;
    assert_eq!(last(top).as_deref(), Some("600 3"));
    assert_eq!(last(head(1, 0, 0, 4, &[])).as_deref(), Some("500 1"));
    // Pruned past it: no change of that id may come again.
    let pruned = head(1, 20, 0, 4, &[]);
    let past = pruned.position(Some(&read));
    assert_eq!(past.last_change.as_deref(), Some(PRUNED));
    assert!(
        pruned.lacks_applied(&past, Some("9 9")),
        "an id pruned, handed out again"
    );
    assert!(!pruned.lacks_applied(&past, None));
    assert!(
        head(1, 19, 0, 4, &[]).lacks_applied(&past, None),
        "a primary before the prune"
    );
    // Another log's position says nothing of this one's ids.
    let remade = Head {
        log_table: 8,
        ..head(1, 0, 0, 3, &[])
    };
    assert_eq!(remade.position(Some(&read)).last_id, 3);
}

#[test]
fn the_position_moves_forward_and_remembers_transactions_in_progress() {
    let h = head(2, 0, 0, 30, &[7, 9]);
    assert_eq!(h.position(None), at(30, &[7, 9], 2));
    // A log pruned empty shows top 0: the position never moves back.
    let empty = head(2, 40, 9, 0, &[]);
    assert_eq!(empty.position(Some(&at(45, &[], 2))), at(45, &[], 2));
    // A full load over a pruned log is past what was pruned, or it would load again and again.
    let pruned = Position {
        last_change: Some(PRUNED.into()),
        ..at(40, &[], 2)
    };
    assert_eq!(empty.position(None), pruned);
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

/// A read of a hot standby at `now` that had received WAL up to `received` and replayed it up
/// to `replayed`, the last commit it replayed at `replayed_at`.
fn standby_read(now: f64, received: i64, replayed: i64, replayed_at: Option<f64>) -> Head {
    Head {
        now,
        standby: true,
        received: Some(received),
        replayed: Some(replayed),
        replayed_at,
        ..head(1, 0, 0, 0, &[])
    }
}

#[test]
fn a_standby_behind_on_replay_is_as_current_as_what_it_replayed() {
    let mut reads = VecDeque::new();
    let mut at = |head: Head, before| current_to(&mut reads, &head, before, false);
    // Caught up: its clock. Then stopped, at 100: the read before it stopped (of the last 64).
    assert_eq!(at(standby_read(10.0, 100, 100, Some(1.0)), None), 10.0);
    assert_eq!(at(standby_read(11.0, 200, 100, Some(1.0)), None), 10.0);
    assert_eq!(at(standby_read(50.0, 300, 100, Some(1.0)), None), 10.0);
    // Replaying a run of WAL without commits, late: the last read whose WAL it replayed.
    assert_eq!(at(standby_read(51.0, 400, 200, Some(1.0)), None), 11.0);
    assert_eq!(at(standby_read(52.0, 500, 400, Some(1.0)), None), 51.0);
    // Replaying commits late: their time, if later; never past its clock.
    assert_eq!(at(standby_read(53.0, 600, 450, Some(51.5)), None), 51.5);
    assert_eq!(at(standby_read(54.0, 700, 450, Some(99.0)), None), 54.0);
    // What the table was before, if the read left some of it as it was.
    assert_eq!(
        at(standby_read(55.0, 800, 450, Some(51.5)), Some(53.0)),
        53.0
    );
    // A primary, or a first read that knows nothing: its clock.
    let primary = Head {
        now: 56.0,
        ..head(1, 0, 0, 0, &[])
    };
    assert_eq!(at(primary, Some(1.0)), 56.0);
    let mut first = VecDeque::new();
    let read = standby_read(57.0, 900, 800, None);
    assert_eq!(current_to(&mut first, &read, None, false), 57.0);
    // A full load replaces the table: how current it was counts only if nothing else is known.
    let mut first = VecDeque::new();
    let read = standby_read(58.0, 900, 800, Some(30.0));
    assert_eq!(current_to(&mut first, &read, Some(40.0), true), 30.0);
    let mut first = VecDeque::new();
    let read = standby_read(59.0, 900, 800, None);
    assert_eq!(current_to(&mut first, &read, Some(40.0), true), 40.0);
}

/// A comparison that removes links from many shards holds the old and the new version of
/// one shard at a time, not of every shard it rebuilt until the end.
#[test]
fn a_comparison_lets_go_of_each_shard_once_its_unseen_links_are_removed() {
    use crate::table::{shard_of, Changes, SHARDS};
    let table = Table::default();
    let mut by_shard: Vec<Changes> = (0..SHARDS).map(|_| Changes::default()).collect();
    let codes: Vec<String> = (0..4 * SHARDS).map(|n| format!("c{n}")).collect();
    for code in &codes {
        let i = shard_of(table.hasher().hash(code.as_bytes()));
        by_shard[i]
            .puts
            .push(code.as_bytes(), b"https://example.com/");
    }
    for (i, changes) in by_shard.into_iter().enumerate() {
        table.apply(i, changes);
    }
    let mut seen = Seen::new(&table);
    // Every other code is still in `links`.
    for code in codes.iter().step_by(2) {
        seen.mark(&table, code.as_bytes());
    }
    let old: Vec<_> = (0..SHARDS)
        .map(|i| Arc::downgrade(&table.shard(i)))
        .collect();
    let unseen_in = |i: usize| {
        codes
            .iter()
            .skip(1)
            .step_by(2)
            .any(|c| shard_of(table.hasher().hash(c.as_bytes())) == i)
    };
    let first = (0..SHARDS)
        .find(|&i| unseen_in(i))
        .expect("a shard with an unseen link");
    let later = (first + 1..SHARDS)
        .find(|&i| unseen_in(i))
        .expect("another one");
    let mut removed = seen.remove_unseen_in(first, &table);
    assert!(
        old[first].upgrade().is_none(),
        "the old shard {first} is still held after its replacement was published"
    );
    assert!(
        old[later].upgrade().is_some(),
        "shard {later} is not done yet"
    );
    removed += seen.remove_unseen(&table);
    assert_eq!(removed as usize, codes.len() / 2);
    assert_eq!(table.len(), codes.len() / 2);
    for (n, code) in codes.iter().enumerate() {
        assert_eq!(table.get(code.as_bytes()).is_some(), n % 2 == 0, "{code}");
    }
}
