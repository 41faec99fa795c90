//! faults: pollshot's fault-injection suite. Every system call a scenario makes
//! through pollshot is failed in turn, once per error its man page lists, by strace
//! (a real kernel refusal, no mock), on every backend compiled here; every run must
//! show no panic, no hang and no abort, the refused API call answering with the
//! kernel's errno (or recovering by itself where the contract says so), and the
//! poller still true afterwards.
//!
//! ```text
//! cargo run -p faults [-- drive [--backend NAME]... [--scenario NAME]... [--jobs N]
//!                              [--full] [--markdown FILE] [--strace PATH]]
//! cargo run -p faults -- run BACKEND SCENARIO[@ROLE] [--strace PATH --log FILE
//!                              --syscalls LIST [--inject SYSCALL:ERRNO:N]]
//! cargo run -p faults -- list
//! ```
//!
//! `drive` (the default) is the whole suite: for each backend and scenario it runs
//! the scenario once under strace to count its system calls, then once per call
//! position and per error, injecting that error at exactly that call, each run a
//! process of its own under a watchdog (a window's many calls of one kind, the
//! 300 first arms of `arm_many`, are sampled: 16 positions; `--full` runs every
//! one). `run` is one scenario: the driver's unit,
//! and the way to replay one failure by hand. Linux only (strace); elsewhere it says
//! so and exits with status 0.
//!
//! How a run is traced (`trace.rs`): the scenario's traced thread starts strace on
//! itself (`strace -p TID`, no `-f`) for the scenario's *window*, the API calls under
//! test, and stops it after. strace counts `when=N` per system call and per traced
//! thread, so this makes `N` the N-th call of that thread in the window, whatever
//! other threads do and whatever ran before; the checks after the window run
//! untraced. Scenarios with a second thread blocked in `deliver` come in two roles,
//! the acting thread traced or the waiter traced. The fork scenario's child traces
//! itself (a new process: its own count).

#[cfg(target_os = "linux")]
mod check;
#[cfg(target_os = "linux")]
mod drive;
#[cfg(target_os = "linux")]
mod refusals;
#[cfg(target_os = "linux")]
mod scenarios;
#[cfg(target_os = "linux")]
mod trace;

#[cfg(target_os = "linux")]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        None | Some("drive") => drive::main(args.get(1..).unwrap_or(&[])),
        Some("run") => scenarios::main(&args[1..]),
        Some("list") => {
            for s in scenarios::SCENARIOS {
                for role in s.roles {
                    println!("{:<28} {}", scenarios::full_name(s.name, *role), s.what);
                }
            }
            0
        }
        Some(other) => {
            eprintln!("faults: unknown command {other:?} (drive, run, list)");
            2
        }
    };
    std::process::exit(code);
}

#[cfg(not(target_os = "linux"))]
fn main() {
    println!("faults: the fault-injection suite runs on Linux only (strace)");
}
