#!/usr/bin/env python3
"""Writes the hand-made seed inputs under fuzz/seeds/<target>/.

Each seed is a scenario from docs/cases.md or the state table of docs/design.md,
encoded the way `arbitrary` 1.x decodes the harness's input types (fuzz/src/lib.rs,
real.rs, kq.rs): an enum variant is a little-endian u32 v with (v * variants) >> 32 == index,
then its fields in order (u8: 1 byte, bool: 1 byte, u32: 4 bytes LE); a Vec taken
as the rest of the input is a 1 byte before each element, 0 to stop.

Run it from anywhere; it rewrites the seeds. Corpus files the fuzzer found and
`cargo fuzz cmin` kept live beside these, named by their hash.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def variant(index, count):
    v = -(-(index << 32) // count)  # smallest v with (v * count) >> 32 == index
    assert (v * count) >> 32 == index
    return struct.pack("<I", v)


def enc(spec, count, op):
    name, *fields = op
    out = variant(spec.index(name), count)
    for f in fields:
        out += struct.pack("<I", f[0]) if isinstance(f, tuple) else bytes([f & 0xFF])
    return out


def vec(spec, ops):
    out = b""
    for op in ops:
        out += b"\x01" + enc(spec, len(spec), op)
    return out + b"\x00"


MACHINE = ["Open", "Dup", "Close", "Levels", "Register", "Arm", "Disarm",
           "Deregister", "Wait", "Accept", "Deliver", "Fire", "Stale", "Notify",
           "StaleWait", "Fork", "Refuse"]
REAL = ["Open", "Dup", "Close", "Write", "Read", "Fill", "DrainPeer",
        "ShutdownPeer", "ClosePeer", "Register", "Arm", "Disarm", "Deregister",
        "Deliver", "Notify"]
KQ = ["Open", "Dup", "Close", "Levels", "Command", "Renew", "Wait", "Delivered"]
R, W, B = 0, 1, 2  # interests
RD, WR, RDHUP, HUP, ERR = 1, 2, 4, 8, 16  # level bits


def machine(wrap, below, ops):
    return bytes([wrap, below]) + vec(MACHINE, ops)


SEEDS = {
    "state_machine": {
        # Arm, deliver, re-arm (level-triggered: still ready), disarm, deregister.
        "rows_basic": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Levels", 0, RD),
            ("Deliver", 0), ("Arm", 0, R), ("Arm", 0, R), ("Deliver", 1),
            ("Arm", 0, W), ("Disarm", 0), ("Disarm", 0), ("Deregister", 0),
            ("Deregister", 0), ("Arm", 0, R)]),
        # P01: an event fetched for B; B deregistered, closed, its number reused,
        # registered and armed before the event is handled.
        "p01_fetched_event_for_reused_number": machine(0, 0, [
            ("Open", 0), ("Open", 0), ("Register", 0), ("Register", 1),
            ("Arm", 0, R), ("Arm", 1, R), ("Levels", 0, RD), ("Levels", 1, RD),
            ("Wait", 0), ("Deregister", 1), ("Close", 1), ("Open", 0),
            ("Register", 1), ("Arm", 2, R), ("Accept", 0), ("Deliver", 1)]),
        # P04: a dup registered, closed without deregistering; the number comes back
        # as a dup of the same description: ADD answers EEXIST, becomes MOD.
        "p04_dup_reuses_number": machine(0, 0, [
            ("Open", 0), ("Dup", 0), ("Register", 0), ("Arm", 0, R), ("Close", 0),
            ("Deregister", 0), ("Dup", 0), ("Register", 0), ("Arm", 1, R),
            ("Levels", 0, RD), ("Deliver", 0)]),
        # P05: fired, closed, number reused by another description, old handle
        # armed again: MOD answers ENOENT, becomes ADD.
        "p05_rearm_after_close_and_reuse": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Levels", 0, RD),
            ("Deliver", 0), ("Close", 0), ("Open", 0), ("Arm", 0, R),
            ("Levels", 0, RD), ("Deliver", 0)]),
        # An event in flight while another thread disarms and re-arms.
        "inflight_disarm_rearm": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, B), ("Levels", 0, RD | WR),
            ("Wait", 0), ("Disarm", 0), ("Arm", 0, B), ("Accept", 0),
            ("Deliver", 1), ("Fire", 0, 2), ("Arm", 0, R), ("Accept", 2)]),
        # An arm that races a delivery in flight: satisfied by it.
        "inflight_same_arm": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, W), ("Levels", 0, WR),
            ("Wait", 1), ("Arm", 0, W), ("Accept", 1), ("Deliver", 0)]),
        # Generations wrap during the run, with stale tags injected.
        "wraparound_stale": machine(1, 1, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Disarm", 0),
            ("Arm", 0, W), ("Stale", 0, 0, 0), ("Stale", 0, 1, 1),
            ("Arm", 0, R), ("Levels", 0, RD), ("Stale", 0, 2, 0), ("Deliver", 2),
            ("Deregister", 0), ("Register", 0), ("Stale", 0, 3, 1),
            ("Arm", 1, R), ("Accept", 1), ("Deliver", 0)]),
        # A regular file: always ready, one synthetic event per arm.
        "regular_file_always_ready": machine(0, 0, [
            ("Open", 1), ("Register", 0), ("Arm", 0, R), ("Deliver", 0),
            ("Arm", 0, W), ("Disarm", 0), ("Arm", 0, B), ("Notify",),
            ("Deliver", 1), ("Deregister", 0)]),
        # A deliver whose first wait fetches only stale events (a tag of the
        # arming a disarm replaced, then of the first registration of a reused
        # slot): nothing from them; it waits again and delivers the current arming.
        "stale_only_wait_waits_again": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Disarm", 0),
            ("Arm", 0, W), ("Levels", 0, WR), ("StaleWait", 0, 0, 0),
            ("Arm", 0, R), ("Levels", 0, RD), ("StaleWait", 0, 1, 1),
            ("Deregister", 0), ("Register", 0), ("Arm", 1, R),
            ("StaleWait", 1, 2, 2)]),
        # fork + reinit_after_fork: the armed socket re-added armed, the idle one
        # fresh (its next arm an add), the armed regular file's synthetic event
        # queued again; another thread's fetched events are gone in the child.
        "fork_child_reinit": machine(0, 0, [
            ("Open", 0), ("Open", 0), ("Open", 1), ("Register", 0),
            ("Register", 1), ("Register", 2), ("Arm", 0, R), ("Arm", 1, R),
            ("Disarm", 1), ("Arm", 2, R), ("Levels", 0, RD), ("Wait", 1),
            ("Fork",), ("Deliver", 0), ("Arm", 1, R), ("Levels", 1, RD),
            ("Fork",), ("Deliver", 2), ("Close", 0), ("Fork",), ("Deliver", 0)]),
        # Hang-up while quiet: at most one stale kernel event, nothing delivered.
        "hangup_while_quiet": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Disarm", 0),
            ("Levels", 0, HUP), ("Deliver", 0), ("Deliver", 1), ("Arm", 0, R),
            ("Deliver", 0)]),
        # AFD: a disarm cancels the pending poll (one cancelled packet, dropped);
        # the re-arm's poll, issued with data queued, completes at once.
        "afd_cancel_then_rearm_with_data": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Disarm", 0),
            ("Levels", 0, RD), ("Arm", 0, R), ("Deliver", 0), ("Deliver", 1)]),
        # AFD: a re-arm for another interest after the poll completed (queued,
        # not dequeued): the cancel answers STATUS_NOT_FOUND, the old packet is
        # dropped by its mark.
        "afd_rearm_after_completion": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, B), ("Levels", 0, RD | WR),
            ("Arm", 0, R), ("Deliver", 0), ("Levels", 0, 0), ("Arm", 0, W),
            ("Disarm", 0), ("Levels", 0, WR), ("Arm", 0, W), ("Deliver", 1)]),
        # AFD: closing one of two handles completes nothing; closing the last
        # completes the poll with LOCAL_CLOSE; the number reused, the re-arm
        # polls the new socket through the recorded base handle.
        "afd_local_close_with_dup": machine(0, 0, [
            ("Open", 0), ("Dup", 0), ("Register", 0), ("Arm", 0, R),
            ("Close", 0), ("Deliver", 0), ("Close", 0), ("Deliver", 1),
            ("Open", 0), ("Arm", 0, R), ("Levels", 0, RD), ("Deliver", 0)]),
        # AFD: a completion dequeued after its readiness went away (the packet
        # stays queued), and one in a thread's hands across a deregistration and
        # a new registration of the slot.
        "afd_gone_and_in_flight": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Levels", 0, RD),
            ("Levels", 0, 0), ("Wait", 0), ("Accept", 0), ("Arm", 0, R),
            ("Levels", 0, RD), ("Wait", 1), ("Deregister", 0), ("Register", 0),
            ("Arm", 1, R), ("Accept", 1), ("Deliver", 2)]),
        # AFD: a socket's number closed (LOCAL_CLOSE delivered) and reused by a
        # file: the re-arm's poll is refused (not a socket), and so is a
        # registration of the file.
        "afd_number_reused_by_a_file": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Close", 0),
            ("Deliver", 0), ("Open", 1), ("Arm", 0, R), ("Register", 0),
            ("Arm", 1, R), ("Deliver", 1), ("Deregister", 0), ("Deregister", 1)]),
        # The kernel refuses one command (ENOMEM) of each kind: a first arm, a
        # disarm, a deregister of an armed registration (kept, disarmed: its
        # event, fetched before, is stale; armed again; the retry deletes), a
        # superseded registration's delete, a fork's re-add (made again).
        "refused_commands": machine(0, 0, [
            ("Open", 0), ("Open", 0), ("Register", 0), ("Register", 1),
            ("Refuse",), ("Arm", 0, R), ("Arm", 0, R), ("Refuse",), ("Disarm", 0),
            ("Levels", 0, RD), ("Arm", 1, W), ("Wait", 1), ("Refuse",),
            ("Deregister", 0), ("Accept", 1), ("Deliver", 2), ("Arm", 0, R),
            ("Deliver", 0), ("Refuse",), ("Deregister", 0), ("Deregister", 0),
            ("Arm", 1, W), ("Refuse",), ("Register", 1), ("Arm", 2, R),
            ("Levels", 1, RD | WR), ("Deliver", 1), ("Register", 0), ("Arm", 3, W),
            ("Arm", 2, W), ("Refuse",), ("Fork",), ("Levels", 0, RD | WR),
            ("Deliver", 0)]),
        # A refused deregister, then the descriptor closed and its number
        # reused before the retry (the retry deletes nothing of the new one),
        # then registered again.
        "refused_deregister_then_reuse": machine(0, 0, [
            ("Open", 0), ("Register", 0), ("Arm", 0, B), ("Refuse",),
            ("Deregister", 0), ("Close", 0), ("Open", 0), ("Levels", 0, RD),
            ("Deliver", 0), ("Deregister", 0), ("Register", 0), ("Arm", 1, R),
            ("Deliver", 1)]),
    },
    "epoll_real": {
        "pingpong": vec(REAL, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Deliver",),
            ("Write", 0, 63), ("Deliver",), ("Read", 0), ("Arm", 0, R),
            ("Deliver",), ("Write", 0, 1), ("Arm", 0, R), ("Deliver",),
            ("Deregister", 0)]),
        "fill_then_drain": vec(REAL, [
            ("Open", 0), ("Register", 0), ("Fill", 0), ("Arm", 0, W),
            ("Deliver",), ("DrainPeer", 0), ("Deliver",), ("Arm", 0, B),
            ("Deliver",)]),
        "p04_dup_reuses_number": vec(REAL, [
            ("Open", 0), ("Dup", 0), ("Register", 0), ("Arm", 0, R), ("Close", 0),
            ("Deregister", 0), ("Dup", 0), ("Register", 0), ("Arm", 1, R),
            ("Write", 0, 7), ("Deliver",)]),
        "p05_rearm_after_close_and_reuse": vec(REAL, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Write", 0, 1),
            ("Deliver",), ("Close", 0), ("Open", 1), ("Arm", 0, R),
            ("Write", 0, 1), ("Deliver",)]),
        "dev_null_always_ready": vec(REAL, [
            ("Open", 3), ("Register", 0), ("Arm", 0, R), ("Deliver",),
            ("Arm", 0, B), ("Deliver",), ("Arm", 0, W), ("Disarm", 0),
            ("Deliver",), ("Deregister", 0)]),
        "hangup_while_quiet": vec(REAL, [
            ("Open", 0), ("Register", 0), ("Arm", 0, R), ("Disarm", 0),
            ("ClosePeer", 0), ("Deliver",), ("Deliver",), ("Arm", 0, R),
            ("Deliver",)]),
        "p10_shutdown_peer": vec(REAL, [
            ("Open", 0), ("Register", 0), ("Write", 0, 9), ("ShutdownPeer", 0),
            ("Arm", 0, R), ("Deliver",), ("Read", 0), ("Arm", 0, R),
            ("Deliver",)]),
        "pipe_write_end": vec(REAL, [
            ("Open", 2), ("Register", 0), ("Fill", 0), ("Arm", 0, W),
            ("Deliver",), ("DrainPeer", 0), ("Deliver",), ("ClosePeer", 0),
            ("Arm", 0, W), ("Deliver",)]),
        "p03_dup_outlives_close": vec(REAL, [
            ("Open", 1), ("Register", 0), ("Arm", 0, R), ("Dup", 0), ("Close", 0),
            ("Write", 0, 3), ("Deliver",), ("Deliver",), ("Deregister", 0),
            ("Write", 0, 3), ("Deliver",)]),
        "notify_coalesces": vec(REAL, [
            ("Notify",), ("Notify",), ("Deliver",), ("Notify",), ("Deliver",),
            ("Deliver",)]),
    },
    "kqueue_changes": {
        # Command fields: fd, cmd (0 add, 1 modify, 2 quiet, 3 delete), interest.
        "add_modify_quiet_delete": vec(KQ, [
            ("Open", 0), ("Command", 0, 0, R), ("Levels", 0, RD), ("Wait",),
            ("Delivered", 0), ("Command", 0, 1, B), ("Levels", 0, RD | WR),
            ("Wait",), ("Delivered", 0), ("Command", 0, 1, W), ("Command", 0, 2, R),
            ("Wait",), ("Command", 0, 3, R)]),
        # P05/P07: closed (EBADF), number reused (ENOENT, re-added), renewed.
        "closed_and_reused": vec(KQ, [
            ("Open", 0), ("Dup", 0), ("Command", 0, 0, W), ("Close", 0),
            ("Command", 0, 1, W), ("Command", 0, 2, W), ("Open", 0),
            ("Command", 0, 1, W), ("Command", 0, 2, W), ("Command", 0, 1, B),
            ("Levels", 0, WR), ("Wait",), ("Renew", 0), ("Command", 0, 0, R)]),
        # P09: an add kqueue refuses (EINVAL): always ready, no knote left.
        "not_pollable": vec(KQ, [
            ("Open", 1), ("Command", 0, 0, B), ("Command", 0, 2, B),
            ("Command", 0, 3, B)]),
    },
}
SEEDS["blocking_real"] = SEEDS["epoll_real"]

for target, seeds in SEEDS.items():
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
