//! `polling::os::kqueue` filters (signal, process, timer) through the facade, on a
//! kqueue: a BSD kernel, or libkqueue on Linux (`--cfg pollshot_libkqueue`, see
//! compat/clients.sh).
//!
//! A program of its own (`harness = false`): the signal test needs SIGUSR2 blocked
//! in every thread, so `main` blocks it before any thread exists (libkqueue reads
//! signals with signalfd(2), which sees only blocked signals; a BSD kernel records
//! the signal either way). It prints libtest's summary line so that scripts count
//! it like the others.

#[cfg(polling_kqueue)]
mod filters {
    use polling::os::kqueue::{PollerKqueueExt, Process, ProcessOps, Signal, Timer};
    use polling::{Event, Events, PollMode, Poller};
    use std::io::ErrorKind;
    use std::sync::Arc;
    use std::thread;
    use std::time::{Duration, Instant};

    const LONG: Option<Duration> = Some(Duration::from_secs(10));

    fn wait_some(poller: &Poller) -> Vec<Event> {
        let mut events = Events::new();
        let n = poller.wait(&mut events, LONG).unwrap();
        assert!(n > 0, "no event within {LONG:?}");
        events.iter().collect()
    }

    fn wait_none(poller: &Poller, t: Duration) {
        let mut events = Events::new();
        let n = poller.wait(&mut events, Some(t)).unwrap();
        assert_eq!(n, 0, "{:?}", events.iter().collect::<Vec<_>>());
    }

    /// The facade's filter threads alive in this process, by name (`comm` holds
    /// the first 15 bytes of "polling-kqueue-filters").
    fn filter_threads() -> usize {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return 0;
        };
        tasks
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == "polling-kqueue-")
            .count()
    }

    pub fn timer_oneshot_then_modify() {
        let poller = Poller::new().unwrap();
        let timer = Timer {
            id: 1,
            timeout: Duration::from_millis(10),
        };
        let start = Instant::now();
        poller.add_filter(timer, 5, PollMode::Oneshot).unwrap();
        let got = wait_some(&poller);
        assert!(start.elapsed() >= Duration::from_millis(10));
        assert_eq!(got, [Event::readable(5)]);
        // Oneshot: gone after firing.
        wait_none(&poller, Duration::from_millis(50));
        // Re-added under a new key.
        poller.modify_filter(timer, 6, PollMode::Oneshot).unwrap();
        assert_eq!(wait_some(&poller), [Event::readable(6)]);
        poller.delete_filter(timer).unwrap();
    }

    pub fn timer_level_repeats() {
        let poller = Poller::new().unwrap();
        let timer = Timer {
            id: 2,
            timeout: Duration::from_millis(5),
        };
        poller.add_filter(timer, 1, PollMode::Level).unwrap();
        for _ in 0..3 {
            assert_eq!(wait_some(&poller)[0].key, 1);
        }
        poller.delete_filter(timer).unwrap();
        // Deleted: no more reports once the ones in flight are taken.
        let mut events = Events::new();
        let _ = poller.wait(&mut events, Some(Duration::from_millis(20)));
        wait_none(&poller, Duration::from_millis(50));
    }

    pub fn filter_errors_are_clear() {
        let poller = Poller::new().unwrap();
        let timer = Timer {
            id: 3,
            timeout: Duration::from_secs(60),
        };
        let e = poller
            .modify_filter(timer, 1, PollMode::Oneshot)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        let e = poller.delete_filter(timer).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
        let e = poller
            .add_filter(timer, usize::MAX, PollMode::Oneshot)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        poller.add_filter(timer, 1, PollMode::Oneshot).unwrap();
        let e = poller.add_filter(timer, 2, PollMode::Oneshot).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
        poller.delete_filter(timer).unwrap();
        let e = poller.delete_filter(timer).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }

    pub fn process_exit_is_reported_and_left_to_reap() {
        let poller = Poller::new().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("0.05")
            .spawn()
            .unwrap();
        // SAFETY: `child` is waited for below, after the filter is deleted.
        let exit = unsafe { Process::new(&child, ProcessOps::Exit) };
        poller.add_filter(&exit, 7, PollMode::Oneshot).unwrap();
        assert_eq!(wait_some(&poller), [Event::readable(7)]);
        poller.delete_filter(&exit).unwrap();
        // The filter does not reap: the exit status is still the parent's to take.
        let status = child.wait().unwrap();
        assert!(status.success(), "{status:?}");
    }

    pub fn signal_is_reported_each_time_it_is_rearmed() {
        let poller = Poller::new().unwrap();
        poller
            .add_filter(Signal(libc::SIGUSR2), 9, PollMode::Oneshot)
            .unwrap();
        for round in 0..3 {
            // SAFETY: kill(2) of our own process with a signal every thread blocks.
            assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGUSR2) }, 0);
            assert_eq!(wait_some(&poller), [Event::readable(9)], "round {round}");
            poller
                .modify_filter(Signal(libc::SIGUSR2), 9, PollMode::Oneshot)
                .unwrap();
        }
        poller.delete_filter(Signal(libc::SIGUSR2)).unwrap();
    }

    pub fn a_filter_event_wakes_a_blocked_wait() {
        // The filter thread's notify must reach a wait that is already blocked
        // (with no timeout), 20 times over.
        let poller = Arc::new(Poller::new().unwrap());
        for round in 0..20 {
            let p = Arc::clone(&poller);
            let waiter = thread::spawn(move || {
                let mut events = Events::new();
                // Until the event: a notify-only return is allowed (spurious).
                while events.is_empty() {
                    p.wait(&mut events, None).unwrap();
                }
                events.iter().collect::<Vec<_>>()
            });
            thread::sleep(Duration::from_millis(2));
            let timer = Timer {
                id: 100 + round,
                timeout: Duration::from_millis(1),
            };
            poller.add_filter(timer, round, PollMode::Oneshot).unwrap();
            assert_eq!(waiter.join().unwrap(), [Event::readable(round)]);
            poller.delete_filter(timer).unwrap();
        }
    }

    pub fn dropping_the_poller_ends_the_filter_thread() {
        // A new thread names itself once it runs, and a joined one may linger in
        // /proc for a moment: each count is awaited with a generous deadline.
        let settle = |n: usize| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while filter_threads() != n && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(1));
            }
            filter_threads()
        };
        // Earlier tests' pollers are dropped: their threads are gone.
        assert_eq!(settle(0), 0);
        let poller = Poller::new().unwrap();
        assert_eq!(filter_threads(), 0, "no thread before the first filter");
        let timer = Timer {
            id: 1,
            timeout: Duration::from_secs(60),
        };
        poller.add_filter(timer, 1, PollMode::Oneshot).unwrap();
        assert_eq!(settle(1), 1, "one filter thread per poller with filters");
        drop(poller);
        assert_eq!(settle(0), 0, "the filter thread ends with its poller");
    }
}

#[cfg(polling_kqueue)]
fn main() {
    use std::panic;
    // SAFETY: blocks SIGUSR2 in this, the only, thread; every thread made later
    // inherits the mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        assert_eq!(
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()),
            0
        );
    }
    let tests: [(&str, fn()); 7] = [
        (
            "timer_oneshot_then_modify",
            filters::timer_oneshot_then_modify,
        ),
        ("timer_level_repeats", filters::timer_level_repeats),
        ("filter_errors_are_clear", filters::filter_errors_are_clear),
        (
            "process_exit_is_reported_and_left_to_reap",
            filters::process_exit_is_reported_and_left_to_reap,
        ),
        (
            "signal_is_reported_each_time_it_is_rearmed",
            filters::signal_is_reported_each_time_it_is_rearmed,
        ),
        (
            "a_filter_event_wakes_a_blocked_wait",
            filters::a_filter_event_wakes_a_blocked_wait,
        ),
        (
            "dropping_the_poller_ends_the_filter_thread",
            filters::dropping_the_poller_ends_the_filter_thread,
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (name, test) in tests {
        if panic::catch_unwind(test).is_ok() {
            println!("test {name} ... ok");
            passed += 1;
        } else {
            println!("test {name} ... FAILED");
            failed += 1;
        }
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!(
        "\ntest result: {verdict}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out"
    );
    std::process::exit(i32::from(failed != 0));
}

#[cfg(not(polling_kqueue))]
fn main() {
    println!("kqueue_filters: not a kqueue target (on Linux: --cfg pollshot_libkqueue)");
    println!("\ntest result: ok. 0 passed; 0 failed; 7 ignored; 0 measured; 0 filtered out");
}
