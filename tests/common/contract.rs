//! The arming contract `Poller::arm` documents, on every backend: an arm
//! *replaces* the registration's interest, and a delivery disarms *both*
//! directions. A runtime that keeps a reader and a writer waiting on one
//! registration relies on both halves (it arms the union, and after a delivery
//! re-arms what is still wanted), so a change to either must fail here.

use super::*;
use pollshot::Interest;

/// How long the "nothing is reported" checks wait, per deliver. A correct poller
/// reports nothing however long this is; a poller that kept the other direction
/// armed reports the event at once, well within it.
const QUIET: Duration = Duration::from_millis(20);

/// Armed for both directions with a full send buffer, the registration fires
/// readable (the peer wrote). That delivery disarmed the writable side too: when
/// the peer drains the buffer, nothing is reported until WRITABLE is armed again;
/// that arm reports writable only (its interest), though the byte read by nobody is
/// still there; an arm for READABLE then reports the byte (level-triggered: nothing
/// was lost).
pub fn contract_delivery_disarms_both_directions<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (peer, sock) = D::socketpair();
    let filled = sock.fill();
    assert!(filled > 0, "the send buffer took nothing");
    let t = sock.register(&p).unwrap();
    p.arm(t, Interest::BOTH).unwrap();
    assert_no_events(&p, 2, QUIET); // full, nothing to read: not ready

    peer.write_all(b"x");
    let ev = expect_one(&p, t);
    assert!(ev.is_readable(), "the peer wrote: {ev:?}");
    assert!(!ev.is_writable(), "the send buffer is full: {ev:?}");

    // Room again, but the readable delivery ended the arming for both directions.
    assert_eq!(peer.drain(), filled, "the peer reads what was sent");
    assert!(!sock.would_block_write(), "the send buffer has room again");
    assert_no_events(&p, 3, QUIET);

    // Re-arm what is still wanted: the room is reported now, and only the room.
    p.arm(t, Interest::WRITABLE).unwrap();
    let ev = expect_one(&p, t);
    assert!(ev.is_writable(), "re-armed WRITABLE with room: {ev:?}");
    assert!(
        !ev.is_readable() && !ev.is_read_closed(),
        "armed WRITABLE only, the unread byte is not reported: {ev:?}"
    );
    assert_no_events(&p, 2, QUIET);

    // The byte nobody read is still there: READABLE reports it, and only it.
    p.arm(t, Interest::READABLE).unwrap();
    let ev = expect_one(&p, t);
    assert!(ev.is_readable() && !ev.is_writable(), "{ev:?}");
    let mut buf = [0u8; 8];
    assert_eq!(sock.read_some(&mut buf), 1);
    p.deregister(t).unwrap();
}

/// Arm READABLE, then WRITABLE (a full send buffer): the second arm replaced the
/// first, so data that arrives afterwards is not reported; arming READABLE again
/// reports it, and not writable (the buffer is still full, and not asked for).
pub fn contract_arm_replaces_the_interest<B: Backend, D: Fd>() {
    let p = poller::<B>();
    let (peer, sock) = D::socketpair();
    sock.fill();
    let t = sock.register(&p).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    p.arm(t, Interest::WRITABLE).unwrap();

    peer.write_all(b"late");
    assert_no_events(&p, 3, QUIET);

    p.arm(t, Interest::READABLE).unwrap();
    let ev = expect_one(&p, t);
    assert!(ev.is_readable(), "armed READABLE with data: {ev:?}");
    assert!(!ev.is_writable(), "not asked for (and full): {ev:?}");
    let mut buf = [0u8; 8];
    assert_eq!(sock.read_some(&mut buf), 4);

    // And the other way round: WRITABLE replaced by READABLE with room to write
    // and nothing to read reports nothing.
    assert!(peer.drain() > 0);
    p.arm(t, Interest::WRITABLE).unwrap();
    p.arm(t, Interest::READABLE).unwrap();
    assert_no_events(&p, 3, QUIET);
    p.deregister(t).unwrap();
}
