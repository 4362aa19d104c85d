//! What the tests that run `portico` as child processes share: reading a child's output with
//! deadlines, and waiting for it with one.

#![allow(dead_code)] // Each test binary uses part of this module.

use std::io::{BufRead, BufReader};
use std::process::{Child, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Lines of a child's output, read on a thread so that every wait can have a deadline.
pub fn lines(r: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits up to `limit` for `child` to exit; kills it and fails the test otherwise (`what`
/// names it).
pub fn wait(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still ran at its deadline; killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
